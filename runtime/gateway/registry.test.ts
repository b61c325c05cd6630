import { describe, expect, it } from 'vitest';
import type { DenyReason } from './audit.ts';
import { normalisePolicy } from './policy.ts';
import { canonicalAddress, Registry, type TrackedConnection } from './registry.ts';

function conn(
  name: string | null,
  intercepted = false,
): TrackedConnection & { closedWith: DenyReason | null } {
  const c = {
    protocol: 'tls' as const,
    name,
    intercepted,
    closedWith: null as DenyReason | null,
    close(reason: DenyReason) {
      c.closedWith = reason;
    },
  };
  return c;
}

const grant = {
  name: 'gh',
  placeholder: 'space_ph_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa',
  domains: ['api.github.test'],
  header: 'authorization',
  format: 'Bearer {value}',
  value: 'real-secret-value',
};

describe('Registry', () => {
  it('canonicalises source addresses', () => {
    expect(canonicalAddress('::ffff:10.199.0.2')).toBe('10.199.0.2');
    expect(canonicalAddress('10.199.0.2')).toBe('10.199.0.2');
    expect(canonicalAddress('nope')).toBeUndefined();
    expect(canonicalAddress(undefined)).toBeUndefined();
  });

  it('replacing a policy closes only the connections it no longer allows (T25)', () => {
    const r = new Registry({ maxConnections: 10, dnsQueriesPerSec: 10 });
    r.put('10.199.0.2', {
      sandboxId: 's1',
      policy: normalisePolicy({ allow: ['a.test', 'b.test', 'api.github.test'] }),
      credentials: [grant],
    });
    const reg = r.lookup('::ffff:10.199.0.2')!;
    const a = conn('a.test');
    const b = conn('b.test');
    const pending = conn(null);
    const gh = conn('api.github.test', true);
    for (const c of [a, b, pending, gh]) expect(r.admit(reg, c)).toBe(true);
    const out = r.put('10.199.0.2', {
      sandboxId: 's1',
      policy: normalisePolicy({ allow: ['a.test', 'api.github.test'] }),
      credentials: [],
    });
    expect(out).toEqual({ replaced: true, changed: true, closed: 2 });
    expect(a.closedWith).toBeNull();
    expect(pending.closedWith).toBeNull();
    expect(b.closedWith).toBe('policy-changed');
    expect(gh.closedWith).toBe('policy-changed'); // intercepted without a grant any more
    expect(reg.conns.size).toBe(2);
  });

  it('a registration for another sandbox at the same address closes everything', () => {
    const r = new Registry({ maxConnections: 10, dnsQueriesPerSec: 10 });
    r.put('10.199.0.2', { sandboxId: 's1', policy: normalisePolicy({ mode: 'allow-all' }), credentials: [] });
    const c = conn('a.test');
    r.admit(r.lookup('10.199.0.2')!, c);
    expect(
      r.put('10.199.0.2', {
        sandboxId: 's2',
        policy: normalisePolicy({ mode: 'allow-all' }),
        credentials: [],
      }),
    ).toEqual({ replaced: true, changed: true, closed: 1 });
    expect(c.closedWith).toBe('sandbox-removed');
  });

  it('the same registration again changes nothing; a new generation of a grant is a change', () => {
    const r = new Registry({ maxConnections: 10, dnsQueriesPerSec: 10 });
    const input = () => ({
      sandboxId: 's1',
      policy: normalisePolicy({ allow: ['a.test', 'api.github.test'] }),
      credentials: [{ ...grant }],
    });
    r.put('10.199.0.2', input());
    const reg = r.lookup('10.199.0.2')!;
    const [a, gh] = [conn('a.test'), conn('api.github.test', true)];
    for (const c of [a, gh]) expect(r.admit(reg, c)).toBe(true);
    const bucket = reg.dnsBucket;
    // equal values in new objects, as each re-registration parses them afresh
    expect(r.put('10.199.0.2', input())).toEqual({ replaced: true, changed: false, closed: 0 });
    expect(reg.dnsBucket).toBe(bucket);
    expect(reg.conns.size).toBe(2);
    const rotated = { ...input(), credentials: [{ ...grant, generation: 'g2' }] };
    expect(r.put('10.199.0.2', rotated)).toEqual({ replaced: true, changed: true, closed: 0 });
    expect(reg.credentials[0]?.generation).toBe('g2');
    expect([a.closedWith, gh.closedWith]).toEqual([null, null]);
  });

  it('delete closes connections and forgets the address', () => {
    const r = new Registry({ maxConnections: 10, dnsQueriesPerSec: 10 });
    r.put('10.199.0.2', {
      sandboxId: 's1',
      policy: normalisePolicy({ mode: 'allow-all' }),
      credentials: [grant],
    });
    const c = conn('a.test');
    r.admit(r.lookup('10.199.0.2')!, c);
    expect(r.list()[0]).toMatchObject({
      sandboxId: 's1',
      credentials: [{ name: 'gh', domains: ['api.github.test'] }],
    });
    expect(JSON.stringify(r.list())).not.toContain('real-secret-value');
    expect(JSON.stringify(r.list())).not.toContain('space_ph_');
    expect(r.delete('10.199.0.2')).toBe(true);
    expect(c.closedWith).toBe('sandbox-removed');
    expect(r.lookup('10.199.0.2')).toBeUndefined();
    expect(r.delete('10.199.0.2')).toBe(false);
  });

  it('caps concurrent connections per sandbox, not globally', () => {
    const r = new Registry({ maxConnections: 2, dnsQueriesPerSec: 10 });
    r.put('10.199.0.2', { sandboxId: 's1', policy: normalisePolicy({}), credentials: [] });
    r.put('10.199.0.6', { sandboxId: 's2', policy: normalisePolicy({}), credentials: [] });
    const one = r.lookup('10.199.0.2')!;
    const two = r.lookup('10.199.0.6')!;
    const c1 = conn(null);
    expect(r.admit(one, c1)).toBe(true);
    expect(r.admit(one, conn(null))).toBe(true);
    expect(r.admit(one, conn(null))).toBe('connection-limit');
    expect(r.admit(two, conn(null))).toBe(true);
    r.release(one, c1);
    expect(r.admit(one, conn(null))).toBe(true);
  });

  it('rate-limits DNS with a token bucket per sandbox', () => {
    let now = 0;
    const r = new Registry({ maxConnections: 2, dnsQueriesPerSec: 5, now: () => now });
    r.put('10.199.0.2', { sandboxId: 's1', policy: normalisePolicy({}), credentials: [] });
    const b = r.lookup('10.199.0.2')!.dnsBucket;
    let taken = 0;
    while (b.take()) taken++;
    expect(taken).toBe(10); // burst = 2 × rate
    now += 1000;
    taken = 0;
    while (b.take()) taken++;
    expect(taken).toBe(5);
  });
});
