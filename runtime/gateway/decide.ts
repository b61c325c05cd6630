/**
 * The decision shared by the TLS and HTTP paths: a claimed name (SNI or Host) is normalised,
 * checked against the sandbox's policy, then resolved by the gateway itself, and only an address
 * outside the deny set is returned. The address the sandbox connected to is never an input (T01).
 */
import { isIP } from 'node:net';
import type { Audit, Decision, DenyReason } from './audit.ts';
import { decideName, type EgressPolicy, findMatch, normaliseName } from './policy.ts';
import { canonicalAddress, type Registration, type Registry } from './registry.ts';
import type { UpstreamResolver } from './resolver.ts';

/** Outcome of {@link decideClaim}. */
export type ClaimDecision =
  | { allowed: true; name: string; rule: string }
  | { allowed: false; name: string | null; rule: string | null; reason: DenyReason };

/**
 * Decides a name claimed by a client (raw SNI or Host without port) under `policy`. IP literals
 * (including bracketed IPv6) are refused as `ip-literal`, anything else that does not normalise as
 * `invalid-name`. Pure.
 */
export function decideClaim(policy: EgressPolicy, claim: string): ClaimDecision {
  const bare = claim.startsWith('[') && claim.endsWith(']') ? claim.slice(1, -1) : claim;
  if (isIP(bare) !== 0 || isIP(bare.replace(/\.$/, '')) !== 0) {
    return { allowed: false, name: claim, rule: null, reason: 'ip-literal' };
  }
  const name = normaliseName(claim);
  if (name === null) return { allowed: false, name: claim.slice(0, 255), rule: null, reason: 'invalid-name' };
  const d = decideName(policy, name);
  return d.allowed
    ? { allowed: true, name, rule: d.rule }
    : { allowed: false, name, rule: d.rule, reason: d.reason };
}

/** Outcome of {@link resolveForSandbox}: addresses that may be used, and why none may when empty. */
export interface SandboxResolution {
  /** Usable addresses in upstream order (outside the deny set and the denied names' addresses). */
  allowed: string[];
  /** Addresses the upstream returned that may not be used. */
  denied: string[];
  /** Why `allowed` is empty although the name exists, if it is. */
  reason: Extract<DenyReason, 'resolved-to-denied-address' | 'cname-denied' | 'denied-name-address'> | null;
  ttlSec: number;
}

/**
 * Resolves allowed canonical `name` for a sandbox under `policy`, so that deny entries hold by
 * address too (E8): a name whose CNAME chain passes through a name a deny entry matches is refused
 * (`cname-denied`); the addresses the gateway resolves (now, through its cache) for each exact deny
 * entry — and for the names of that entry's own chain — are removed (`denied-name-address` when
 * nothing is left); the deny set applies as always (`resolved-to-denied-address`, T04/E7). A deny
 * entry that does not resolve removes no address. Wildcard deny entries hold by name and CNAME chain
 * only (their names can't be enumerated; see docs/egress.md). Throws on upstream failure.
 */
export async function resolveForSandbox(
  resolver: UpstreamResolver,
  policy: EgressPolicy,
  name: string,
): Promise<SandboxResolution> {
  const r = await resolver.resolve(name);
  const none = { allowed: [], denied: [...r.allowed, ...r.denied], ttlSec: r.ttlSec };
  if (r.chain.some((c) => findMatch(c, policy.deny) !== undefined))
    return { ...none, reason: 'cname-denied' };
  const exact = policy.deny.filter((d) => !d.startsWith('*.') && d !== name);
  const deniedAddresses = new Set<string>();
  if (exact.length > 0 && r.allowed.length > 0) {
    const all = await Promise.all(exact.map((d) => resolver.resolve(d).catch(() => null)));
    for (const d of all)
      for (const a of [...(d?.allowed ?? []), ...(d?.denied ?? [])]) deniedAddresses.add(a);
  }
  const allowed = r.allowed.filter((a) => !deniedAddresses.has(a));
  const denied = [...r.denied, ...r.allowed.filter((a) => deniedAddresses.has(a))];
  let reason: SandboxResolution['reason'] = null;
  if (allowed.length === 0 && r.allowed.length > 0) reason = 'denied-name-address';
  else if (allowed.length === 0 && r.denied.length > 0) reason = 'resolved-to-denied-address';
  return { allowed, denied, reason, ttlSec: r.ttlSec };
}

/** Outcome of {@link resolveForDial}. */
export type DialTarget =
  | { ok: true; address: string }
  | { ok: false; reason: DenyReason; address: string | null };

/**
 * Resolves canonical `name` for a sandbox under `policy` ({@link resolveForSandbox}) and picks the
 * first usable address. The reason of an empty answer, or `resolution-failed` when the upstream
 * fails or has no A record. Never throws.
 */
export async function resolveForDial(
  resolver: UpstreamResolver,
  policy: EgressPolicy,
  name: string,
): Promise<DialTarget> {
  try {
    const r = await resolveForSandbox(resolver, policy, name);
    const address = r.allowed[0];
    if (address !== undefined) return { ok: true, address };
    if (r.reason) return { ok: false, reason: r.reason, address: r.denied[0] ?? null };
    return { ok: false, reason: 'resolution-failed', address: null };
  } catch {
    return { ok: false, reason: 'resolution-failed', address: null };
  }
}

/**
 * Who is calling: the registration of the socket's source address, with the decision record the
 * proxy fills in as it learns the name. An unregistered source is denied (audited) and destroyed;
 * then the result is null.
 */
export function identifySource(
  deps: { registry: Registry; audit: Audit; upstreamPort: number },
  socket: import('node:net').Socket,
  protocol: Decision['protocol'],
): { reg: Registration; decision: Decision } | null {
  const source = canonicalAddress(socket.remoteAddress) ?? String(socket.remoteAddress);
  const reg = deps.registry.lookup(source);
  const decision: Decision = {
    protocol,
    source,
    sandboxId: reg?.sandboxId ?? null,
    name: null,
    address: null,
    port: deps.upstreamPort,
    rule: null,
  };
  if (!reg) {
    deps.audit.deny({ ...decision, reason: 'unregistered-source' });
    socket.destroy();
    return null;
  }
  return { reg, decision };
}
