import { describe, expect, it } from 'vitest';
import { SpaceError } from '../core/errors.ts';
import {
  applyFormat,
  type CredentialGrant,
  describeGrant,
  grantsCovering,
  mintPlaceholder,
  PLACEHOLDER_RE,
  validateGrants,
} from './credentials.ts';

const SECRET = 'sk-live-SECRET-0123456789';

function good(over: Partial<CredentialGrant> = {}): CredentialGrant {
  return {
    name: 'openai',
    placeholder: mintPlaceholder(),
    domains: ['api.openai.com'],
    header: 'Authorization',
    format: 'Bearer {value}',
    value: SECRET,
    ...over,
  };
}

/** The SpaceError thrown by `validateGrants(input)`. */
function problemsOf(input: unknown): SpaceError {
  try {
    validateGrants(input);
  } catch (err) {
    expect(err).toBeInstanceOf(SpaceError);
    return err as SpaceError;
  }
  throw new Error('expected validateGrants to throw');
}

describe('mintPlaceholder', () => {
  it('is space_ph_ + 32 base32 characters, and never repeats', () => {
    const seen = new Set<string>();
    for (let i = 0; i < 2000; i++) {
      const p = mintPlaceholder();
      expect(p).toMatch(/^space_ph_[a-z2-7]{32}$/);
      expect(p).toMatch(PLACEHOLDER_RE);
      seen.add(p);
    }
    expect(seen.size).toBe(2000);
  });
});

describe('validateGrants', () => {
  it('accepts a good grant and returns it canonical', () => {
    const g = good({ domains: ['API.OpenAI.com.', '*.Example.org', 'bücher.example'] });
    const [out] = validateGrants([g]);
    expect(out).toEqual({
      ...g,
      header: 'authorization',
      domains: ['api.openai.com', '*.example.org', 'xn--bcher-kva.example'],
    });
  });

  it('reports every problem at once, by path, without the value', () => {
    const err = problemsOf([
      good({ format: 'Bearer' }),
      good({ format: '{value} {value}' }),
      good({ header: 'host' }),
      good({ header: 'bad header' }),
      good({ domains: ['10.0.0.1', '*', 'a..b'] }),
      good({ value: `${SECRET}\r\nX-Injected: 1` }),
      good({ value: 'short' }),
      good({ placeholder: 'space_ph_tooshort' }),
      good({ format: 'Bearer\n{value}' }),
    ]);
    const paths = ((err.details?.problems ?? []) as { path: string }[]).map((p) => p.path);
    expect(paths).toEqual(
      expect.arrayContaining([
        '/0/format',
        '/1/format',
        '/2/header',
        '/3/header',
        '/4/domains/0',
        '/4/domains/1',
        '/4/domains/2',
        '/5/value',
        '/6/value',
        '/7/placeholder',
        '/8/format',
      ]),
    );
    expect(err.code).toBe('BAD_REQUEST');
    expect(JSON.stringify(err.toBody())).not.toContain(SECRET);
    expect(err.message).not.toContain(SECRET);
  });

  it('refuses duplicate names and placeholders, extra fields and non-arrays', () => {
    const a = good();
    expect(problemsOf([a, { ...a }]).message).toMatch(
      /\/1\/name duplicate name; \/1\/placeholder duplicate placeholder/,
    );
    expect(problemsOf([{ ...good(), extra: 1 }]).message).toMatch(/\/0/);
    expect(problemsOf({}).message).toMatch(/array/);
  });

  it('refuses a value that contains a placeholder prefix', () => {
    expect(problemsOf([good({ value: 'xx-space_ph_abc-yy' })]).message).toMatch(/\/0\/value/);
  });
});

describe('grantsCovering', () => {
  const exact = good({ name: 'exact', domains: ['api.example.com'] });
  const wild = good({ name: 'wild', domains: ['*.example.org'] });

  it('matches exact names and any depth below a wildcard, never the apex', () => {
    const grants = [exact, wild];
    expect(grantsCovering('api.example.com', grants).map((g) => g.name)).toEqual(['exact']);
    expect(grantsCovering('a.b.example.org', grants).map((g) => g.name)).toEqual(['wild']);
    expect(grantsCovering('example.org', grants)).toEqual([]);
    expect(grantsCovering('evilexample.org', grants)).toEqual([]);
    expect(grantsCovering('api.example.com.evil.net', grants)).toEqual([]);
  });

  it('normalises the name first and covers nothing for an invalid one', () => {
    expect(grantsCovering('API.Example.COM.', [exact]).map((g) => g.name)).toEqual(['exact']);
    expect(grantsCovering('127.0.0.1', [good({ domains: ['127.0.0.1'] })])).toEqual([]);
    expect(grantsCovering('', [exact])).toEqual([]);
  });
});

describe('applyFormat / describeGrant', () => {
  it('substitutes literally, even a value with $ patterns', () => {
    expect(applyFormat('Bearer {value}', "a$&b$'c")).toBe("Bearer a$&b$'c");
  });

  it('describes a grant without its value or placeholder', () => {
    const d = describeGrant(good());
    expect(JSON.stringify(d)).not.toContain(SECRET);
    expect(d).not.toHaveProperty('placeholder');
  });
});
