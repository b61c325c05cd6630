/**
 * Credentials operators register for outside services (name, target domains, how to apply the
 * value). Values are write-only: stored for the gateway, never returned by the API, never put in a
 * sandbox. A sandbox created with credential names gets, per credential, a placeholder token in
 * its environment; the node's gateway swaps that placeholder for the value on the way out.
 */
import type { Redis } from 'ioredis';
import { type CredentialGrant, mintPlaceholder, validateGrants } from '../core/credentials.ts';
import type { EgressPolicy } from '../core/egress.ts';
import { SpaceError } from '../core/errors.ts';
import { keys } from '../core/redis-keys.ts';

/** A credential as the API shows it (no value). */
export interface CredentialView {
  name: string;
  domains: string[];
  header: string;
  format: string;
  /** Environment variable that carries the placeholder in sandboxes. */
  envVar: string;
  createdAt: string;
  updatedAt: string;
}

/** What an operator sends to register or replace a credential. */
export interface CredentialInput {
  domains: string[];
  header?: string;
  format?: string;
  envVar?: string;
  value: string;
}

/** A credential granted to one sandbox: the placeholder only (the value stays in Redis). */
export interface SandboxGrant {
  name: string;
  placeholder: string;
  envVar: string;
  /** The credential's domain patterns when granted. */
  domains: string[];
}

/**
 * The policy with each granted credential's domains added to `allow`: a credential scoped to a
 * host is what lets its sandbox reach that host (deny entries still win at the gateway).
 */
export function allowCredentialHosts(policy: EgressPolicy, grants: readonly SandboxGrant[]): EgressPolicy {
  const allow = [...policy.allow];
  for (const d of grants.flatMap((g) => g.domains)) if (!allow.includes(d)) allow.push(d);
  return { ...policy, allow };
}

/** Default environment variable for credential `name`: `OPENAI` → `OPENAI`, `gh-token` → `GH_TOKEN`. */
export function defaultEnvVar(name: string): string {
  return name.toUpperCase().replace(/[^A-Z0-9_]/g, '_');
}

export class CredentialStore {
  readonly #redis: Redis;
  constructor(redis: Redis) {
    this.#redis = redis;
  }

  /** Registers or replaces `name`. Throws BAD_REQUEST for bad domains/header/format. */
  async put(name: string, input: CredentialInput): Promise<CredentialView> {
    const header = (input.header ?? 'authorization').toLowerCase();
    const format = input.format ?? 'Bearer {value}';
    // validated exactly as the gateway will validate the grant (a throwaway placeholder stands in)
    const [grant] = validateGrants([
      {
        name,
        placeholder: mintPlaceholder(),
        domains: input.domains,
        header,
        format,
        value: input.value,
      },
    ]);
    const now = String(Date.now());
    const key = keys.credential(name);
    const createdAt = (await this.#redis.hget(key, 'createdAt')) ?? now;
    await this.#redis
      .multi()
      .hset(key, {
        name,
        domains: JSON.stringify(grant!.domains),
        header,
        format,
        envVar: input.envVar ?? defaultEnvVar(name),
        value: input.value,
        createdAt,
        updatedAt: now,
      })
      .sadd(keys.credentialIndex(), name)
      .exec();
    return (await this.view(name))!;
  }

  async view(name: string): Promise<CredentialView | null> {
    const h = await this.#redis.hgetall(keys.credential(name));
    if (!h.name) return null;
    return {
      name: h.name,
      domains: JSON.parse(h.domains ?? '[]') as string[],
      header: h.header ?? 'authorization',
      format: h.format ?? 'Bearer {value}',
      envVar: h.envVar ?? defaultEnvVar(h.name),
      createdAt: new Date(Number(h.createdAt)).toISOString(),
      updatedAt: new Date(Number(h.updatedAt)).toISOString(),
    };
  }

  async list(): Promise<CredentialView[]> {
    const names = (await this.#redis.smembers(keys.credentialIndex())).sort();
    return (await Promise.all(names.map((n) => this.view(n)))).filter((v): v is CredentialView => v !== null);
  }

  async remove(name: string): Promise<boolean> {
    const [[, n]] = (await this.#redis
      .multi()
      .del(keys.credential(name))
      .srem(keys.credentialIndex(), name)
      .exec()) as [[unknown, number]];
    return n === 1;
  }

  /** Mints one placeholder per named credential. Throws CREDENTIAL_NOT_FOUND naming every unknown one. */
  async grant(names: readonly string[]): Promise<SandboxGrant[]> {
    const views = await Promise.all(names.map((n) => this.view(n)));
    const missing = names.filter((_, i) => !views[i]);
    if (missing.length > 0) {
      throw new SpaceError('CREDENTIAL_NOT_FOUND', `no credential named ${missing.join(', ')}`, { missing });
    }
    return views.map((v) => ({
      name: v!.name,
      placeholder: mintPlaceholder(),
      envVar: v!.envVar,
      domains: v!.domains,
    }));
  }

  /** The full grants (with values) for a node's gateway; credentials deleted since are skipped. */
  async resolve(grants: readonly SandboxGrant[]): Promise<CredentialGrant[]> {
    const out: CredentialGrant[] = [];
    for (const g of grants) {
      const h = await this.#redis.hgetall(keys.credential(g.name));
      if (!h.name || !h.value) continue;
      out.push({
        name: g.name,
        placeholder: g.placeholder,
        domains: JSON.parse(h.domains ?? '[]') as string[],
        header: h.header ?? 'authorization',
        format: h.format ?? 'Bearer {value}',
        value: h.value,
      });
    }
    return out;
  }
}
