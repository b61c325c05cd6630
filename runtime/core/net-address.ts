/**
 * The one network-address module: parsing and arithmetic of IPv4/IPv6 addresses and CIDRs, on top
 * of `ipaddr.js` (github.com/whitequark/ipaddr.js). Every part of SPACE that reads an address or a
 * CIDR (the deploy layer, the agent's address pool, the gateway's deny set, the API's egress
 * policy) goes through here instead of splitting dotted quads itself.
 *
 * IPv4 text is strict: four decimal octets 0–255 without leading zeros (`10.0.0.1`, never
 * `010.0.0.1`, `10.1` or `0x0a.0.0.1`), the form of RFC 791's dotted decimal that `inet_pton`
 * accepts (POSIX.1-2017 `inet_pton`). IPv6 text is RFC 4291 §2.2 (with `::` and a dotted-quad
 * tail), without zone ids (RFC 4007 §11). All functions are pure.
 */
import { isIPv6 } from 'node:net';
import ipaddr from 'ipaddr.js';

/** A parsed IPv4 CIDR: network address as an unsigned 32-bit number (host bits cleared), prefix 0–32. */
export interface Ipv4Cidr {
  /** Network address, unsigned 32-bit (`10.77.0.0` → 0x0a4d0000). */
  readonly network: number;
  /** Prefix length, 0–32. */
  readonly prefix: number;
}

/** True for strict dotted-quad IPv4 text (see the module note). */
export function isIPv4(text: unknown): text is string {
  return typeof text === 'string' && ipaddr.IPv4.isValidFourPartDecimal(text);
}

/** True for IPv6 text without a zone id. */
export function isIPv6NoZone(text: unknown): text is string {
  return typeof text === 'string' && !text.includes('%') && isIPv6(text);
}

/** Strict IPv4 text → unsigned 32-bit number. Throws `Error('bad IPv4 address <text>')`. */
export function ipv4ToInt(text: string): number {
  if (!isIPv4(text)) throw new Error(`bad IPv4 address ${text}`);
  return ipaddr.IPv4.parse(text)
    .toByteArray()
    .reduce((n, b) => n * 256 + b, 0);
}

/** Unsigned 32-bit number → dotted quad (`0x0a000001` → `10.0.0.1`; taken modulo 2³²). */
export function intToIPv4(n: number): string {
  const u = n >>> 0;
  return ipaddr.fromByteArray([u >>> 24, (u >>> 16) & 255, (u >>> 8) & 255, u & 255]).toString();
}

/** Dotted netmask of an IPv4 prefix length 0–32 (`30` → `255.255.255.252`). Throws outside 0–32. */
export function ipv4Netmask(prefix: number): string {
  if (!Number.isInteger(prefix) || prefix < 0 || prefix > 32)
    throw new Error(`bad IPv4 prefix length ${prefix}`);
  return ipaddr.IPv4.subnetMaskFromPrefixLength(prefix).toString();
}

/** Strict IPv4 text → 32-bit bigint, or null when it is not one. */
export function ipv4ToBigInt(text: string): bigint | null {
  return isIPv4(text) ? BigInt(ipv4ToInt(text)) : null;
}

/** IPv6 text (no zone id) → 128-bit bigint, or null when it is not one. */
export function ipv6ToBigInt(text: string): bigint | null {
  if (!isIPv6NoZone(text)) return null;
  return ipaddr.IPv6.parse(text)
    .toByteArray()
    .reduce((n, b) => (n << 8n) | BigInt(b), 0n);
}

/**
 * Why `text` is not an IPv4 CIDR `a.b.c.d/n` (`n` one or two digits, ≤ 32), or null when it is:
 * `'not an IPv4 CIDR'` (not of that shape), `'bad IPv4 address'` (an octet over 255 or with a
 * leading zero), `'prefix over 32'`.
 */
export function ipv4CidrProblem(
  text: string,
): 'not an IPv4 CIDR' | 'bad IPv4 address' | 'prefix over 32' | null {
  const slash = text.indexOf('/');
  const addr = text.slice(0, slash);
  const len = text.slice(slash + 1);
  const octets = addr.split('.');
  if (slash < 0 || !/^\d{1,2}$/.test(len) || octets.length !== 4 || !octets.every((o) => /^\d{1,3}$/.test(o)))
    return 'not an IPv4 CIDR';
  if (!isIPv4(addr)) return 'bad IPv4 address';
  if (Number(len) > 32) return 'prefix over 32';
  return null;
}

/** True for an IPv4 CIDR such as `10.0.0.0/16` ({@link ipv4CidrProblem} finds nothing). */
export function isIPv4Cidr(text: unknown): text is string {
  return typeof text === 'string' && ipv4CidrProblem(text) === null;
}

/** Parses an IPv4 CIDR, clearing host bits (`10.77.1.2/16` → 10.77.0.0, 16). Throws `Error('bad IPv4 CIDR <text>')`. */
export function parseIPv4Cidr(text: string): Ipv4Cidr {
  if (!isIPv4Cidr(text)) throw new Error(`bad IPv4 CIDR ${text}`);
  const [addr, len] = ipaddr.IPv4.parseCIDR(text);
  const mask = len === 0 ? 0 : (0xffffffff << (32 - len)) >>> 0;
  return { network: (ipv4ToInt(addr.toString()) & mask) >>> 0, prefix: len };
}

/**
 * The `n`-th address of an IPv4 CIDR counted from its network address (`n` = 1 is the first host:
 * `nthHost('10.77.128.0/24', 10)` → `10.77.128.10`). Throws on a bad CIDR or an `n` outside the
 * block (0 … 2^(32−prefix) − 1).
 */
export function nthHost(cidr: string, n: number): string {
  const { network, prefix } = parseIPv4Cidr(cidr);
  if (!Number.isInteger(n) || n < 0 || n >= 2 ** (32 - prefix))
    throw new Error(`address ${n} is outside ${cidr}`);
  return intToIPv4(network + n);
}

/** True for an IPv4 or IPv6 CIDR (`ipaddr.js` `isValidCIDR`, IPv4 part strict as above). */
export function isAnyCidr(text: unknown): text is string {
  if (typeof text !== 'string') return false;
  if (ipv4CidrProblem(text) === null) return true;
  const slash = text.indexOf('/');
  return slash > 0 && isIPv6NoZone(text.slice(0, slash)) && ipaddr.IPv6.isValidCIDR(text);
}

/**
 * True when CIDR `outer` contains all of CIDR `inner` (same family, `outer`'s prefix no longer,
 * `inner`'s network inside `outer`). Throws `Error('bad CIDR <text>')` on text that is not a CIDR.
 */
export function cidrContains(outer: string, inner: string): boolean {
  for (const c of [outer, inner]) if (!isAnyCidr(c)) throw new Error(`bad CIDR ${c}`);
  const [oAddr, oLen] = ipaddr.parseCIDR(outer);
  const [iAddr, iLen] = ipaddr.parseCIDR(inner);
  if (oAddr.kind() !== iAddr.kind() || oLen > iLen) return false;
  return iAddr.match(oAddr, oLen);
}

/**
 * `address` with an IPv4-mapped IPv6 form written `::ffff:a.b.c.d` (RFC 4291 §2.5.5.2; how Node
 * reports IPv4 peers of dual-stack sockets) turned into its `a.b.c.d`; anything else unchanged.
 */
export function unmapIPv4(address: string): string {
  const tail = address.slice('::ffff:'.length);
  return address.slice(0, '::ffff:'.length).toLowerCase() === '::ffff:' && isIPv4(tail) ? tail : address;
}
