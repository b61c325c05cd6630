/**
 * Credentials a team registers for outside services (name, target domains, how to apply the
 * value). Values are write-only: stored for the gateway, never returned by the API, never put in a
 * sandbox. A sandbox created with credential names gets, per credential, a placeholder token in
 * its environment; the node's gateway swaps that placeholder for the value on the way out.
 *
 * Credentials belong to a team: every method takes the caller's team, and a sandbox can only be
 * granted its own team's credentials (another team's name reads as CREDENTIAL_NOT_FOUND).
 */

import { randomBytes } from 'node:crypto';
import type { Redis } from 'ioredis';
import { resolveGrants } from '../core/credential-grants.ts';
import {
  type CredentialGrant,
  limitProblems,
  mintPlaceholder,
  validateGrants,
  valueProblems,
} from '../core/credentials.ts';
import type { EgressPolicy } from '../core/egress.ts';
import { SpaceError } from '../core/errors.ts';
import { keys } from '../core/redis-keys.ts';
import { DEFAULT_TEAM } from '../core/tenancy.ts';

/** A credential as the API shows it (no value). */
export interface CredentialView {
  name: string;
  domains: string[];
  header: string;
  format: string;
  /** Environment variable that carries the placeholder in sandboxes. */
  envVar: string;
  /** Methods the value is sent with (null: any). */
  methods: string[] | null;
  /** Path patterns the value is sent to (null: any). */
  paths: string[] | null;
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
  methods?: string[];
  paths?: string[];
}

/** A credential granted to one sandbox: the placeholder only (the value stays in Redis). */
export interface SandboxGrant {
  name: string;
  placeholder: string;
  envVar: string;
  /** The credential's domain patterns when granted. */
  domains: string[];
  /** The credential's generation when granted (absent in records written before generations). */
  generation?: string;
  /** The credential's team (absent in records written before teams: the default team). */
  team?: string;
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

  /**
   * Registers or replaces (rotates) team `team`'s credential `name`. A replacement keeps the generation, so sandboxes granted
   * it get the new value from their gateway within its cache time; a delete ends the generation.
   * Throws BAD_REQUEST for bad domains/header/format/value/methods/paths (every problem at once).
   */
  async put(team: string, name: string, input: CredentialInput): Promise<CredentialView> {
    const header = (input.header ?? 'authorization').toLowerCase();
    const format = input.format ?? 'Bearer {value}';
    const problems = [...valueProblems(format, input.value), ...limitProblems(input.methods, input.paths)];
    if (problems.length > 0) {
      throw new SpaceError(
        'BAD_REQUEST',
        `credential: ${problems.map((p) => `${p.path} ${p.message}`).join('; ')}`,
        { problems },
      );
    }
    // the grant fields are validated exactly as the gateway will (a throwaway placeholder stands in)
    const [grant] = validateGrants([
      { name, placeholder: mintPlaceholder(), domains: input.domains, header, format },
    ]);
    const now = String(Date.now());
    const key = keys.credential(team, name);
    const [createdAt, generation] = await this.#redis.hmget(key, 'createdAt', 'generation');
    const fields: Record<string, string> = {
      name,
      generation: generation ?? randomBytes(12).toString('hex'),
      domains: JSON.stringify(grant!.domains),
      header,
      format,
      envVar: input.envVar ?? defaultEnvVar(name),
      value: input.value,
      createdAt: createdAt ?? now,
      updatedAt: now,
    };
    if (input.methods) fields.methods = JSON.stringify(input.methods);
    if (input.paths) fields.paths = JSON.stringify(input.paths);
    await this.#redis
      .multi()
      .hdel(key, 'methods', 'paths')
      .hset(key, fields)
      .sadd(keys.credentialIndex(team), name)
      .exec();
    return (await this.view(team, name))!;
  }

  /** Team `team`'s credential `name` without its value, or null. */
  async view(team: string, name: string): Promise<CredentialView | null> {
    const h = await this.#redis.hgetall(keys.credential(team, name));
    if (!h.name) return null;
    return {
      name: h.name,
      domains: JSON.parse(h.domains ?? '[]') as string[],
      header: h.header ?? 'authorization',
      format: h.format ?? 'Bearer {value}',
      envVar: h.envVar ?? defaultEnvVar(h.name),
      methods: h.methods ? (JSON.parse(h.methods) as string[]) : null,
      paths: h.paths ? (JSON.parse(h.paths) as string[]) : null,
      createdAt: new Date(Number(h.createdAt)).toISOString(),
      updatedAt: new Date(Number(h.updatedAt)).toISOString(),
    };
  }

  /** Team `team`'s credentials by name, without values. */
  async list(team: string): Promise<CredentialView[]> {
    const names = (await this.#redis.smembers(keys.credentialIndex(team))).sort();
    return (await Promise.all(names.map((n) => this.view(team, n)))).filter(
      (v): v is CredentialView => v !== null,
    );
  }

  /** Deletes team `team`'s credential `name`; false when it had none by that name. */
  async remove(team: string, name: string): Promise<boolean> {
    const [[, n]] = (await this.#redis
      .multi()
      .del(keys.credential(team, name))
      .srem(keys.credentialIndex(team), name)
      .exec()) as [[unknown, number]];
    return n === 1;
  }

  /**
   * Mints one placeholder per named credential of team `team` (only that team's are looked at).
   * Throws CREDENTIAL_NOT_FOUND naming every unknown one.
   */
  async grant(team: string, names: readonly string[]): Promise<SandboxGrant[]> {
    const hashes = await Promise.all(names.map((n) => this.#redis.hgetall(keys.credential(team, n))));
    const missing = names.filter((_, i) => !hashes[i]!.name);
    if (missing.length > 0) {
      throw new SpaceError('CREDENTIAL_NOT_FOUND', `no credential named ${missing.join(', ')}`, { missing });
    }
    return hashes.map((h) => ({
      name: h.name!,
      placeholder: mintPlaceholder(),
      envVar: h.envVar ?? defaultEnvVar(h.name!),
      domains: JSON.parse(h.domains ?? '[]') as string[],
      ...(h.generation ? { generation: h.generation } : {}),
      ...(team === DEFAULT_TEAM ? {} : { team }),
    }));
  }

  /**
   * The grants (never values) a node's agent registers with its gateway; credentials deleted since
   * are skipped. The gateway fetches each value itself when a request needs it.
   */
  resolve(grants: readonly SandboxGrant[]): Promise<CredentialGrant[]> {
    return resolveGrants(this.#redis, grants);
  }
}
