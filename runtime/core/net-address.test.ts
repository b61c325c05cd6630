import { describe, expect, it } from 'vitest';
import {
  cidrContains,
  intToIPv4,
  ipv4CidrProblem,
  ipv4Netmask,
  ipv4ToBigInt,
  ipv4ToInt,
  ipv6ToBigInt,
  isAnyCidr,
  isIPv4,
  isIPv4Cidr,
  nthHost,
  parseIPv4Cidr,
  unmapIPv4,
} from './net-address.ts';

describe('net-address', () => {
  it('IPv4 text is strict dotted decimal: no leading zeros, short forms, hex or out-of-range octets', () => {
    for (const ok of ['0.0.0.0', '10.77.0.1', '255.255.255.255']) expect(isIPv4(ok), ok).toBe(true);
    for (const bad of [
      '010.0.0.1',
      '10.1',
      '10',
      '0x0a.0.0.1',
      '256.0.0.1',
      '1.2.3.4 ',
      '1.2.3.4.5',
      '',
      '::1',
    ])
      expect(isIPv4(bad), bad).toBe(false);
    expect(isIPv4(undefined)).toBe(false);
  });

  it('IPv4 ↔ 32-bit numbers, both ways, at the edges', () => {
    expect(ipv4ToInt('10.77.0.1')).toBe(0x0a4d0001);
    expect(ipv4ToInt('255.255.255.255')).toBe(0xffffffff);
    expect(intToIPv4(0xffffffff)).toBe('255.255.255.255');
    expect(intToIPv4(0)).toBe('0.0.0.0');
    expect([0, 8, 30, 32].map(ipv4Netmask)).toEqual([
      '0.0.0.0',
      '255.0.0.0',
      '255.255.255.252',
      '255.255.255.255',
    ]);
    expect(() => ipv4Netmask(33)).toThrow('bad IPv4 prefix length 33');
    for (const ip of ['192.168.130.7', '100.64.0.2']) expect(intToIPv4(ipv4ToInt(ip))).toBe(ip);
    expect(() => ipv4ToInt('10.0.0.256')).toThrow('bad IPv4 address 10.0.0.256');
    expect(ipv4ToBigInt('1.2.3.4')).toBe(0x01020304n);
    expect(ipv4ToBigInt('1.2.3')).toBeNull();
  });

  it('IPv6 text to 128 bits, with :: and a dotted-quad tail; zone ids refused', () => {
    expect(ipv6ToBigInt('1:2:3:4:5:6:7:8')).toBe(0x00010002000300040005000600070008n);
    expect(ipv6ToBigInt('::ffff:1.2.3.4')).toBe(0xffff01020304n);
    expect(ipv6ToBigInt('1::')).toBe(1n << 112n);
    expect(ipv6ToBigInt('fe80::1%eth0')).toBeNull();
    expect(ipv6ToBigInt('1.2.3.4')).toBeNull();
  });

  it('IPv4 CIDRs: the reason each bad one is refused; host bits cleared when parsed', () => {
    expect(ipv4CidrProblem('10.0.0.0/8')).toBeNull();
    expect(ipv4CidrProblem('10.0.0/8')).toBe('not an IPv4 CIDR');
    expect(ipv4CidrProblem('10.0.0.0')).toBe('not an IPv4 CIDR');
    expect(ipv4CidrProblem('10.0.0.0/032')).toBe('not an IPv4 CIDR');
    expect(ipv4CidrProblem('10.0.0.256/8')).toBe('bad IPv4 address');
    expect(ipv4CidrProblem('10.0.0.01/8')).toBe('bad IPv4 address');
    expect(ipv4CidrProblem('10.0.0.0/33')).toBe('prefix over 32');
    expect(isIPv4Cidr('0.0.0.0/0')).toBe(true);
    expect(parseIPv4Cidr('10.77.1.2/16')).toEqual({ network: 0x0a4d0000, prefix: 16 });
    expect(parseIPv4Cidr('1.2.3.4/0')).toEqual({ network: 0, prefix: 0 });
    expect(() => parseIPv4Cidr('10.0.0.0/40')).toThrow('bad IPv4 CIDR 10.0.0.0/40');
  });

  it('the n-th address of a block, bounded by the block', () => {
    expect(nthHost('10.77.128.0/24', 10)).toBe('10.77.128.10');
    expect(nthHost('10.77.128.5/24', 1)).toBe('10.77.128.1');
    expect(nthHost('10.0.0.0/8', 256)).toBe('10.0.1.0');
    expect(() => nthHost('10.0.0.0/30', 4)).toThrow('outside');
    expect(() => nthHost('10.0.0.0/30', -1)).toThrow('outside');
  });

  it('containment across both families; text that is not a CIDR throws', () => {
    expect(cidrContains('10.0.0.0/8', '10.77.0.0/16')).toBe(true);
    expect(cidrContains('10.77.0.0/16', '10.0.0.0/8')).toBe(false);
    expect(cidrContains('10.0.0.0/8', '11.0.0.0/16')).toBe(false);
    expect(cidrContains('0.0.0.0/0', '203.0.113.0/24')).toBe(true);
    expect(cidrContains('fc00::/7', 'fd00:1::/64')).toBe(true);
    expect(cidrContains('::/0', '10.0.0.0/8')).toBe(false);
    expect(isAnyCidr('fd00::/8')).toBe(true);
    expect(isAnyCidr('fd00::%1/8')).toBe(false);
    expect(() => cidrContains('10.0.0.0/8', 'nope')).toThrow('bad CIDR nope');
  });

  it('IPv4-mapped IPv6 in dotted form unmaps; everything else is left as it was', () => {
    expect(unmapIPv4('::ffff:10.199.0.2')).toBe('10.199.0.2');
    expect(unmapIPv4('::FFFF:10.199.0.2')).toBe('10.199.0.2');
    expect(unmapIPv4('10.199.0.2')).toBe('10.199.0.2');
    expect(unmapIPv4('::ffff:10.199.0')).toBe('::ffff:10.199.0');
    expect(unmapIPv4('2001:db8::1')).toBe('2001:db8::1');
  });
});
