import { describe, expect, it } from 'vitest';
import { SpaceError } from '../core/errors.ts';
import {
  decideName,
  type EgressPolicy,
  matchesPattern,
  normaliseName,
  normalisePattern,
  normalisePolicy,
} from './policy.ts';

const policy = (p: Partial<EgressPolicy>): EgressPolicy => normalisePolicy(p);

describe('normaliseName (T11 canonicalisation)', () => {
  it.each([
    ['PyPI.Org', 'pypi.org'],
    ['pypi.org.', 'pypi.org'],
    ['MiXeD.CaSe.TEST.', 'mixed.case.test'],
    ['bücher.example', 'xn--bcher-kva.example'],
    ['xn--bcher-kva.example', 'xn--bcher-kva.example'],
    ['BÜCHER.example', 'xn--bcher-kva.example'],
    ['a_b.example', 'a_b.example'],
  ])('%s → %s', (raw, want) => {
    expect(normaliseName(raw)).toBe(want);
  });

  it.each([
    ['empty', ''],
    ['two trailing dots', 'pypi.org..'],
    ['lone dot', '.'],
    ['empty label', 'a..b'],
    ['leading dot', '.pypi.org'],
    ['brackets', '[pypi.org]'],
    ['userinfo', 'pypi.org@attacker.tld'],
    ['port', 'pypi.org:443'],
    ['percent-encoding', 'pypi%2eorg'],
    ['NUL', 'pypi.org\u0000.attacker.tld'],
    ['space', 'pypi .org'],
    ['slash', 'pypi.org/x'],
    ['backslash', 'pypi.org\\x'],
    ['wildcard', '*.pypi.org'],
    ['IPv4', '127.0.0.1'],
    ['IPv4 trailing dot', '127.0.0.1.'],
    ['short IPv4', '127.1'],
    ['hex IPv4', '0x7f.0.0.1'],
    ['decimal IPv4', '2130706433'],
    ['IPv6', '::1'],
    ['bracketed IPv6', '[::1]'],
    ['numeric last label', 'foo.123'],
    ['label over 63', `${'a'.repeat(64)}.test`],
    ['name over 253', `${'a'.repeat(60)}.`.repeat(5) + 'test'],
    ['leading hyphen', '-a.test'],
    ['trailing hyphen', 'a-.test'],
    ['bad punycode', 'xn--.test'],
    ['control char', 'a\u0007.test'],
    ['fullwidth at', 'pypi.org＠attacker.tld'],
  ])('refuses %s', (_why, raw) => {
    expect(normaliseName(raw)).toBeNull();
  });

  it('keeps a 253-byte name and refuses 254', () => {
    const label = 'a'.repeat(63);
    const ok = `${label}.${label}.${label}.${'b'.repeat(61)}`;
    expect(ok.length).toBe(253);
    expect(normaliseName(ok)).toBe(ok);
    expect(normaliseName(`${ok}.`)).toBe(ok);
    expect(normaliseName(`c${ok}`)).toBeNull();
  });
});

describe('patterns and matching', () => {
  it('normalises patterns', () => {
    expect(normalisePattern('*.PythonHosted.org.')).toBe('*.pythonhosted.org');
    expect(normalisePattern('*')).toBeNull();
    expect(normalisePattern('a.*.org')).toBeNull();
    expect(normalisePattern('**.org')).toBeNull();
    expect(normalisePattern('*pypi.org')).toBeNull();
  });

  it('wildcards need a label boundary and exclude the apex', () => {
    expect(matchesPattern('files.pythonhosted.org', '*.pythonhosted.org')).toBe(true);
    expect(matchesPattern('a.b.pythonhosted.org', '*.pythonhosted.org')).toBe(true);
    expect(matchesPattern('pythonhosted.org', '*.pythonhosted.org')).toBe(false);
    expect(matchesPattern('xpythonhosted.org', '*.pythonhosted.org')).toBe(false);
    expect(matchesPattern('pypi.org', 'pypi.org')).toBe(true);
    expect(matchesPattern('xpypi.org', 'pypi.org')).toBe(false);
    expect(matchesPattern('pypi.org.attacker.tld', 'pypi.org')).toBe(false);
    expect(matchesPattern('www.pypi.org', 'pypi.org')).toBe(false);
  });
});

describe('decideName', () => {
  it('allow-list allows only listed names; empty list allows nothing', () => {
    const p = policy({ allow: ['pypi.org', '*.pythonhosted.org'] });
    expect(decideName(p, 'pypi.org')).toEqual({ allowed: true, rule: 'allow:pypi.org' });
    expect(decideName(p, 'files.pythonhosted.org')).toEqual({
      allowed: true,
      rule: 'allow:*.pythonhosted.org',
    });
    expect(decideName(p, 'evil.test')).toMatchObject({ allowed: false, reason: 'not-allowed' });
    expect(decideName(policy({}), 'pypi.org')).toMatchObject({ allowed: false, reason: 'not-allowed' });
  });

  it('deny wins over allow and over allow-all', () => {
    const p = policy({ allow: ['*.shared.test'], deny: ['evil.shared.test'] });
    expect(decideName(p, 'good.shared.test').allowed).toBe(true);
    expect(decideName(p, 'evil.shared.test')).toMatchObject({ allowed: false, reason: 'policy-deny' });
    const all = policy({ mode: 'allow-all', deny: ['*.evil.test'] });
    expect(decideName(all, 'anything.test')).toEqual({ allowed: true, rule: 'mode:allow-all' });
    expect(decideName(all, 'a.evil.test')).toMatchObject({ allowed: false, rule: 'deny:*.evil.test' });
  });

  it('deny-all denies even listed names', () => {
    expect(decideName(policy({ mode: 'deny-all', allow: ['pypi.org'] }), 'pypi.org')).toMatchObject({
      allowed: false,
      reason: 'deny-all',
    });
  });
});

describe('normalisePolicy', () => {
  it('fills defaults and canonicalises, deduplicating', () => {
    expect(normalisePolicy({ allow: ['PyPI.org', 'pypi.org.'] })).toEqual({
      mode: 'allow-list',
      allow: ['pypi.org'],
      deny: [],
      cidrs: [],
    });
  });

  it('reports every bad entry at once', () => {
    try {
      normalisePolicy({
        allow: ['ok.test', '1.2.3.4', '[x.test]'],
        cidrs: [{ cidr: '10.0.0.0/33', ports: [22] }],
      });
      expect.unreachable();
    } catch (err) {
      expect(err).toBeInstanceOf(SpaceError);
      const problems = (err as SpaceError).details?.problems as string[];
      expect(problems).toHaveLength(3);
    }
  });

  it('refuses unknown fields', () => {
    expect(() => normalisePolicy({ mode: 'allow-all', extra: 1 } as never)).toThrow(SpaceError);
  });
});
