/**
 * The decision shared by the TLS and HTTP paths: a claimed name (SNI or Host) is normalised,
 * checked against the sandbox's policy, then resolved by the gateway itself, and only an address
 * outside the deny set is returned. The address the sandbox connected to is never an input (T01).
 */
import { isIP } from 'node:net';
import type { Audit, Decision, DenyReason } from './audit.ts';
import { decideName, type EgressPolicy, normaliseName } from './policy.ts';
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

/** Outcome of {@link resolveForDial}. */
export type DialTarget =
  | { ok: true; address: string }
  | { ok: false; reason: DenyReason; address: string | null };

/**
 * Resolves canonical `name` with the gateway's own resolver and picks the first address outside the
 * deny set. `resolved-to-denied-address` when every answer is denied (rebinding, T04), `resolution-failed`
 * when the upstream fails or has no A record.
 */
export async function resolveForDial(resolver: UpstreamResolver, name: string): Promise<DialTarget> {
  try {
    const r = await resolver.resolve(name);
    const address = r.allowed[0];
    if (address !== undefined) return { ok: true, address };
    if (r.denied.length > 0)
      return { ok: false, reason: 'resolved-to-denied-address', address: r.denied[0]! };
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
