/**
 * Who is behind a source address: the agent registers each sandbox's address with its id, egress
 * policy and credential grants; every proxy path looks the client's source address up here (the
 * packet layer guarantees a sandbox can only use its own address, T16). Also tracks each
 * sandbox's open connections so that a policy replacement closes the ones it no longer allows
 * (T25) and the per-sandbox connection cap holds.
 */

import { randomUUID } from 'node:crypto';
import { isIPv4, isIPv6 } from 'node:net';
import { isDeepStrictEqual } from 'node:util';
import { unmapIPv4 } from '../core/net-address.ts';
import type { DenyReason, Protocol } from './audit.ts';
import { type CredentialGrant, grantsCovering } from './credentials.ts';
import { TokenBucket } from './limits.ts';
import { decideName, type EgressPolicy } from './policy.ts';

/** An open client connection the registry can close. */
export interface TrackedConnection {
  readonly protocol: Protocol;
  /** Canonical name it was allowed for (updated per request on HTTP keep-alive); null before a decision. */
  name: string | null;
  /** True when the TLS connection is intercepted for credentials (it must stay covered by a grant). */
  intercepted: boolean;
  /** Closes the client and its upstream; idempotent. */
  close(reason: DenyReason): void;
}

/** What the agent registers for one sandbox address. */
export interface RegistrationInput {
  sandboxId: string;
  policy: EgressPolicy;
  credentials: CredentialGrant[];
}

/** One registered sandbox address (mutable: replaced in place). */
export interface Registration extends RegistrationInput {
  readonly address: string;
  readonly conns: Set<TrackedConnection>;
  dnsBucket: TokenBucket;
  /** New connections of this sandbox (one token each). */
  connectBucket: TokenBucket;
  /** Connections of this sandbox still in their handshake (see {@link Registry.beginHandshake}). */
  handshakes: number;
  /** When the registration last changed (made, or replaced by a different one), ms since epoch. */
  updatedAt: number;
}

/** A registration as `GET /v1/sandboxes` shows it: credential values and placeholders left out. */
export interface RegistrationView {
  address: string;
  sandboxId: string;
  policy: EgressPolicy;
  credentials: { name: string; domains: string[]; header: string }[];
  connections: number;
  updatedAt: string;
}

/** Canonical source address: IPv4-mapped IPv6 (`::ffff:a.b.c.d`) becomes `a.b.c.d`; undefined if not an IP. */
export function canonicalAddress(address: string | undefined): string | undefined {
  if (!address) return undefined;
  const a = unmapIPv4(address);
  if (isIPv4(a)) return a;
  if (isIPv6(a)) return a.toLowerCase();
  return undefined;
}

/** True when connection `c` may stay open under `reg` (its name still allowed, and still covered if intercepted). */
function stillAllowed(reg: RegistrationInput, c: TrackedConnection): boolean {
  if (c.name === null) return true; // not decided yet: it will be decided against the new policy
  if (!decideName(reg.policy, c.name).allowed) return false;
  return !c.intercepted || grantsCovering(c.name, reg.credentials).length > 0;
}

/** Options of {@link Registry}. */
export interface RegistryOptions {
  /** Concurrent connections per sandbox. */
  maxConnections: number;
  /** DNS queries per second per sandbox (burst: twice this). */
  dnsQueriesPerSec: number;
  /** New connections per second per sandbox (burst: twice this). Default: unlimited. */
  newConnectionsPerSec?: number;
  /** Connections per sandbox in their handshake at once. Default: unlimited. */
  maxHandshakes?: number;
  now?: () => number;
}

/** Source address → registration, plus per-sandbox connection tracking. */
export class Registry {
  private readonly byAddress = new Map<string, Registration>();
  private readonly opts: RegistryOptions;
  /**
   * A random id (UUID) made with this registry, which lives in memory only: a gateway that
   * restarted has a new one and holds no registration. The agent compares it with the id that
   * answered its last registration of a sandbox to know whether it must register it again.
   */
  readonly id = randomUUID();

  constructor(opts: RegistryOptions) {
    this.opts = opts;
  }

  /** The registration of a source address (any textual form), or undefined. */
  lookup(address: string | undefined): Registration | undefined {
    const a = canonicalAddress(address);
    return a === undefined ? undefined : this.byAddress.get(a);
  }

  /**
   * Registers or replaces what the sandbox at `address` may do. A replacement for another sandbox
   * id closes every open connection; for the same id it closes those the new policy/grants no longer
   * allow. Returns whether a registration was there (`replaced`), whether this one changed anything
   * (`changed`: false for the same sandbox, policy and grants again, as the agent's watchdog sends
   * every few seconds; nothing is touched then) and how many connections were closed. Throws on a
   * malformed address.
   */
  put(address: string, input: RegistrationInput): { replaced: boolean; changed: boolean; closed: number } {
    const a = canonicalAddress(address);
    if (a === undefined) throw new Error(`bad address ${address}`);
    const now = (this.opts.now ?? Date.now)();
    const existing = this.byAddress.get(a);
    if (!existing) {
      this.byAddress.set(a, {
        address: a,
        ...input,
        conns: new Set(),
        dnsBucket: this.bucket(),
        connectBucket: this.connectBucket(),
        handshakes: 0,
        updatedAt: now,
      });
      return { replaced: false, changed: true, closed: 0 };
    }
    const sameSandbox = existing.sandboxId === input.sandboxId;
    if (
      sameSandbox &&
      isDeepStrictEqual(existing.policy, input.policy) &&
      isDeepStrictEqual(existing.credentials, input.credentials)
    ) {
      return { replaced: true, changed: false, closed: 0 };
    }
    let closed = 0;
    for (const c of [...existing.conns]) {
      if (sameSandbox && stillAllowed(input, c)) continue;
      existing.conns.delete(c);
      c.close(sameSandbox ? 'policy-changed' : 'sandbox-removed');
      closed++;
    }
    existing.sandboxId = input.sandboxId;
    existing.policy = input.policy;
    existing.credentials = input.credentials;
    existing.updatedAt = now;
    if (!sameSandbox) {
      existing.dnsBucket = this.bucket();
      existing.connectBucket = this.connectBucket();
    }
    return { replaced: true, changed: true, closed };
  }

  /** Forgets `address` and closes its connections; false when it was not registered. */
  delete(address: string): boolean {
    const a = canonicalAddress(address);
    const reg = a === undefined ? undefined : this.byAddress.get(a);
    if (!reg || a === undefined) return false;
    this.byAddress.delete(a);
    for (const c of [...reg.conns]) c.close('sandbox-removed');
    reg.conns.clear();
    return true;
  }

  /** Every registration, without credential values or placeholders. */
  list(): RegistrationView[] {
    return [...this.byAddress.values()].map((r) => ({
      address: r.address,
      sandboxId: r.sandboxId,
      policy: r.policy,
      credentials: r.credentials.map((g) => ({ name: g.name, domains: g.domains, header: g.header })),
      connections: r.conns.size,
      updatedAt: new Date(r.updatedAt).toISOString(),
    }));
  }

  /** Number of registrations. */
  get size(): number {
    return this.byAddress.size;
  }

  /**
   * Takes a connection slot of `reg`: true, or why not (the caller refuses and audits): the
   * sandbox is at its concurrent cap, or opens new connections faster than its rate. Per sandbox,
   * so one sandbox's flood leaves every other sandbox's slots and tokens alone.
   */
  admit(reg: Registration, conn: TrackedConnection): true | 'connection-limit' | 'connection-rate' {
    if (reg.conns.size >= this.opts.maxConnections) return 'connection-limit';
    if (!reg.connectBucket.take()) return 'connection-rate';
    reg.conns.add(conn);
    return true;
  }

  /**
   * Takes a handshake slot (TLS ClientHello / interception handshake in progress); false when the
   * sandbox has `maxHandshakes` under way. Give it back with {@link endHandshake} exactly once.
   */
  beginHandshake(reg: Registration): boolean {
    if (reg.handshakes >= (this.opts.maxHandshakes ?? Number.POSITIVE_INFINITY)) return false;
    reg.handshakes++;
    return true;
  }

  /** Gives a handshake slot back. */
  endHandshake(reg: Registration): void {
    reg.handshakes = Math.max(0, reg.handshakes - 1);
  }

  /** Gives the slot back (idempotent; harmless after the registration was replaced or deleted). */
  release(reg: Registration, conn: TrackedConnection): void {
    reg.conns.delete(conn);
  }

  /** Closes every tracked connection of every sandbox (shutdown). */
  closeAll(): void {
    for (const reg of this.byAddress.values()) {
      for (const c of [...reg.conns]) c.close('sandbox-removed');
      reg.conns.clear();
    }
  }

  private connectBucket(): TokenBucket {
    const rate = this.opts.newConnectionsPerSec ?? Number.POSITIVE_INFINITY;
    return new TokenBucket(rate, rate * 2, this.opts.now);
  }

  private bucket(): TokenBucket {
    return new TokenBucket(this.opts.dnsQueriesPerSec, this.opts.dnsQueriesPerSec * 2, this.opts.now);
  }
}
