/**
 * The deny set: address ranges the gateway never dials and never hands to a sandbox in a DNS answer,
 * whatever name resolved to them (rebinding, T04). IPv6 forms that embed an IPv4 address
 * (IPv4-mapped, IPv4-compatible, NAT64 64:ff9b::/96 and 64:ff9b:1::/48, 6to4 2002::/16, Teredo
 * 2001::/32) are checked by the embedded IPv4 address too. Pure.
 */
import { ipv4ToBigInt, ipv6ToBigInt } from '../core/net-address.ts';

/** One parsed CIDR: family, network bits as a bigint (IPv4: 32 bits, IPv6: 128), prefix length. */
export interface Cidr {
  readonly family: 4 | 6;
  readonly network: bigint;
  readonly prefix: number;
  /** The text it came from. */
  readonly text: string;
}

/** A parsed deny set. */
export type DenySet = readonly Cidr[];

/**
 * Ranges denied whatever the configuration says: unspecified, loopback, link-local (cloud metadata),
 * multicast, reserved/broadcast, IPv6 loopback/unspecified/link-local/multicast.
 */
export const ALWAYS_DENIED = [
  '0.0.0.0/8',
  '127.0.0.0/8',
  '169.254.0.0/16',
  '224.0.0.0/4',
  '240.0.0.0/4',
  '::/128',
  '::1/128',
  'fe80::/10',
  'ff00::/8',
] as const;

/**
 * The default configurable deny set (`SPACE_GATEWAY_DENY_CIDRS`): private and shared ranges
 * (RFC 1918, CGNAT 100.64/10 — which holds the sandbox pool), IETF/test/benchmark ranges, IPv6 ULA.
 */
export const DEFAULT_DENY_CIDRS = [
  '10.0.0.0/8',
  '100.64.0.0/10',
  '172.16.0.0/12',
  '192.0.0.0/24',
  '192.0.2.0/24',
  '192.168.0.0/16',
  '198.18.0.0/15',
  '198.51.100.0/24',
  '203.0.113.0/24',
  'fc00::/7',
] as const;

/** Parses dotted-quad IPv4 (strict: four decimal octets, no leading zeros) to a bigint, or null. */
export const parseIPv4: (ip: string) => bigint | null = ipv4ToBigInt;

/** Parses an IPv6 address (with `::` and a dotted-quad tail; no zone id) to a bigint, or null. */
export const parseIPv6: (ip: string) => bigint | null = ipv6ToBigInt;

/** Parses `addr/prefix` (IPv4 or IPv6). Throws an Error naming the bad CIDR. */
export function parseCidr(text: string): Cidr {
  const [addr = '', len, extra] = text.trim().split('/');
  const prefix = Number(len);
  if (extra !== undefined || len === undefined || !/^\d{1,3}$/.test(len)) throw new Error(`bad CIDR ${text}`);
  const v4 = parseIPv4(addr);
  const family: 4 | 6 = v4 !== null ? 4 : 6;
  const n = v4 ?? parseIPv6(addr);
  const bits = family === 4 ? 32 : 128;
  if (n === null || prefix > bits) throw new Error(`bad CIDR ${text}`);
  const mask = prefix === 0 ? 0n : ((1n << BigInt(prefix)) - 1n) << BigInt(bits - prefix);
  return { family, network: n & mask, prefix, text: text.trim() };
}

/** Builds a deny set from CIDR texts plus {@link ALWAYS_DENIED}. Throws on the first bad CIDR. */
export function buildDenySet(cidrs: readonly string[]): DenySet {
  const all = new Set([...ALWAYS_DENIED, ...cidrs.map((c) => c.trim()).filter((c) => c !== '')]);
  return [...all].map(parseCidr);
}

function inCidr(family: 4 | 6, n: bigint, c: Cidr): boolean {
  if (c.family !== family) return false;
  const bits = family === 4 ? 32 : 128;
  return n >> BigInt(bits - c.prefix) === c.network >> BigInt(bits - c.prefix);
}

/** IPv4 addresses embedded in an IPv6 address by the usual transition mechanisms. */
export function embeddedIPv4(n: bigint): bigint[] {
  const out: bigint[] = [];
  const top96 = n >> 32n;
  const low32 = n & 0xffffffffn;
  if (top96 === 0xffffn) out.push(low32); // ::ffff:a.b.c.d (mapped)
  if (top96 === 0n) out.push(low32); // ::a.b.c.d (compatible, deprecated)
  if (top96 === 0xffff0000n) out.push(low32); // ::ffff:0:a.b.c.d (SIIT translated)
  if (top96 === 0x0064ff9b0000000000000000n) out.push(low32); // 64:ff9b::/96 NAT64
  if (n >> 80n === 0x0064ff9b0001n) out.push(low32, (n >> 40n) & 0xffffffffn); // 64:ff9b:1::/48 local NAT64
  if (n >> 112n === 0x2002n) out.push((n >> 80n) & 0xffffffffn); // 6to4
  if (n >> 96n === 0x20010000n) out.push((n >> 64n) & 0xffffffffn, low32 ^ 0xffffffffn); // Teredo
  return out;
}

/**
 * The deny-set entry `ip` falls in (directly or through an embedded IPv4 address), or undefined
 * when it may be dialled. Anything that is not a plain IPv4/IPv6 address (zone ids, garbage) is
 * denied as `invalid`.
 */
export function deniedBy(ip: string, set: DenySet): string | undefined {
  const v4 = parseIPv4(ip);
  if (v4 !== null) return set.find((c) => inCidr(4, v4, c))?.text;
  const v6 = parseIPv6(ip);
  if (v6 === null) return 'invalid';
  const direct = set.find((c) => inCidr(6, v6, c));
  if (direct) return direct.text;
  for (const e of embeddedIPv4(v6)) {
    const hit = set.find((c) => inCidr(4, e, c));
    if (hit) return `${hit.text} (embedded)`;
  }
  return undefined;
}

/** True when `ip` is in the deny set. */
export function isDenied(ip: string, set: DenySet): boolean {
  return deniedBy(ip, set) !== undefined;
}
