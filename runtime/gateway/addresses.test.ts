import { describe, expect, it } from 'vitest';
import { buildDenySet, DEFAULT_DENY_CIDRS, deniedBy, isDenied, parseCidr, parseIPv6 } from './addresses.ts';

const set = buildDenySet([...DEFAULT_DENY_CIDRS]);

describe('deny set', () => {
  it.each([
    '127.0.0.1',
    '127.255.255.254',
    '0.0.0.0',
    '10.1.2.3',
    '100.64.0.1',
    '169.254.169.254',
    '172.16.5.5',
    '192.168.1.1',
    '224.0.0.1',
    '255.255.255.255',
    '::1',
    '::',
    'fe80::1',
    'fd00::1',
    'ff02::1',
    '::ffff:127.0.0.1',
    '::ffff:7f00:1',
    '::ffff:169.254.169.254',
    '::127.0.0.1',
    '64:ff9b::a9fe:a9fe',
    '64:ff9b::10.0.0.1',
    '64:ff9b:1::a9fe:a9fe',
    '2002:a9fe:a9fe::1',
    '2001:0:4136:e378:8000:63bf:5601:fefe', // Teredo client 169.254.1.1 (inverted)
    'fe80::1%eth0',
    'not-an-ip',
  ])('denies %s', (ip) => {
    expect(isDenied(ip, set)).toBe(true);
  });

  it.each(['93.184.216.34', '1.1.1.1', '2606:4700::1111', '::ffff:1.1.1.1', '64:ff9b::101:101'])(
    'allows %s',
    (ip) => {
      expect(isDenied(ip, set)).toBe(false);
    },
  );

  it('always denies loopback and link-local even with an empty configured set', () => {
    const minimal = buildDenySet([]);
    expect(deniedBy('127.0.0.1', minimal)).toBe('127.0.0.0/8');
    expect(deniedBy('169.254.169.254', minimal)).toBe('169.254.0.0/16');
    expect(isDenied('10.1.1.1', minimal)).toBe(false);
    expect(deniedBy('::ffff:127.0.0.1', minimal)).toBe('127.0.0.0/8 (embedded)');
  });

  it('parses CIDRs strictly', () => {
    expect(parseCidr('10.199.0.0/16').prefix).toBe(16);
    expect(() => parseCidr('10.0.0.0/33')).toThrow();
    expect(() => parseCidr('10.0.0.0')).toThrow();
    expect(() => parseCidr('010.0.0.0/8')).toThrow();
    expect(() => parseCidr('::/129')).toThrow();
    expect(parseIPv6('1:2:3:4:5:6:7:8')).toBe(0x00010002000300040005000600070008n);
    expect(parseIPv6('::ffff:1.2.3.4')).toBe(0xffff01020304n);
    expect(parseIPv6('1::')).toBe(1n << 112n);
  });
});
