import { describe, expect, it } from 'vitest';
import { limitProblems, valueProblems } from '../core/credentials.ts';
import { SpaceError } from '../core/errors.ts';
import {
  applyFormat,
  type CredentialGrant,
  type CredentialSecret,
  credentialAllows,
  credentialFromHash,
  describeGrant,
  grantsCovering,
  mintPlaceholder,
  PLACEHOLDER_RE,
  routedPath,
  validateGrants,
} from './credentials.ts';

const SECRET = 'sk-live-SECRET-0123456789';

function good(over: Partial<CredentialGrant> & { value?: string } = {}): CredentialGrant {
  return {
    name: 'openai',
    placeholder: mintPlaceholder(),
    domains: ['api.openai.com'],
    header: 'Authorization',
    format: 'Bearer {value}',
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

  it('drops a value an N-1 peer still sends: grants never carry one onwards', () => {
    const [out] = validateGrants([good({ value: SECRET, generation: 'g1' })]);
    expect(out).not.toHaveProperty('value');
    expect(out).toMatchObject({ generation: 'g1' });
    expect(JSON.stringify(out)).not.toContain(SECRET);
  });

  it('reports every problem at once, by path', () => {
    const err = problemsOf([
      good({ format: 'Bearer' }),
      good({ format: '{value} {value}' }),
      good({ header: 'host' }),
      good({ header: 'bad header' }),
      good({ domains: ['10.0.0.1', '*', 'a..b'] }),
      good({ name: 'x5' }),
      good({ name: 'x6' }),
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
        '/7/placeholder',
        '/8/format',
      ]),
    );
    expect(err.code).toBe('BAD_REQUEST');
  });

  it('refuses duplicate names and placeholders, extra fields and non-arrays', () => {
    const a = good();
    expect(problemsOf([a, { ...a }]).message).toMatch(
      /\/1\/name duplicate name; \/1\/placeholder duplicate placeholder/,
    );
    expect(problemsOf([{ ...good(), extra: 1 }]).message).toMatch(/\/0/);
    expect(problemsOf({}).message).toMatch(/array/);
  });
});

describe('valueProblems / limitProblems (checked when an operator registers a credential)', () => {
  it('refuses header-breaking, short and placeholder-like values, never echoing them', () => {
    for (const v of [`${SECRET}\r\nX-Injected: 1`, 'q7z', 'xx-space_ph_abc-yy']) {
      const p = valueProblems('Bearer {value}', v);
      expect(p.map((x) => x.path)).toContain('/value');
      expect(JSON.stringify(p)).not.toContain(v);
    }
    expect(valueProblems('Bearer {value}', SECRET)).toEqual([]);
  });

  it('accepts methods and path patterns; refuses bad ones by index', () => {
    expect(limitProblems(['GET', 'POST'], ['/v1/models', '/v1/chat/*'])).toEqual([]);
    expect(
      limitProblems(['get', 'TRACE'], ['v1', '/a/*/b', '/a?b', '/a/../b', '/a%2fb']).map((p) => p.path),
    ).toEqual(['/methods/0', '/methods/1', '/paths/0', '/paths/1', '/paths/2', '/paths/3', '/paths/4']);
  });
});

describe('credentialFromHash / credentialAllows', () => {
  const secret = (over: Partial<CredentialSecret> = {}): CredentialSecret => ({
    name: 'c',
    generation: 'g',
    domains: ['api.x.test'],
    header: 'authorization',
    format: 'Bearer {value}',
    value: SECRET,
    methods: null,
    paths: null,
    ...over,
  });

  it('reads the API hash; an empty or valueless hash is revoked (null)', () => {
    expect(credentialFromHash({})).toBeNull();
    expect(credentialFromHash({ name: 'c' })).toBeNull();
    expect(
      credentialFromHash({
        name: 'c',
        value: SECRET,
        domains: '["api.x.test"]',
        header: 'Authorization',
        methods: '["GET"]',
      }),
    ).toEqual(secret({ generation: 'legacy', methods: ['GET'] }));
  });

  it('limits methods and paths; encoded separators never pass a path list', () => {
    const s = secret({ methods: ['GET'], paths: ['/v1/models', '/v1/chat/*'] });
    expect(credentialAllows(s, 'get', '/v1/models?x=1')).toBe(true);
    expect(credentialAllows(s, 'GET', '/v1/chat/completions')).toBe(true);
    expect(credentialAllows(s, 'POST', '/v1/models')).toBe(false);
    expect(credentialAllows(s, 'GET', '/echo')).toBe(false);
    expect(credentialAllows(s, 'GET', '/v1/models/extra')).toBe(false);
    expect(credentialAllows(s, 'GET', '/v1/chat/%2e%2e/echo')).toBe(false);
    expect(credentialAllows(s, 'GET', '/v1/chat%2f..%2fecho')).toBe(false);
    expect(credentialAllows(secret(), 'DELETE', '/anything')).toBe(true);
  });

  // E15: every form a common router normalises to another route, under a `/v1/*` limit
  it.each([
    ['/v1/..;/echo', 'Servlet path parameter on a dot segment (Tomcat, Jetty, Spring)'],
    ['/v1/..;jsessionid=x/echo', 'a named path parameter'],
    ['/v1;x/../echo', 'a parameter on the prefix'],
    ['/v1/%2e%2e/echo', 'encoded dots'],
    ['/v1/.%2e/echo', 'half-encoded dots'],
    ['/v1/%252e%252e/echo', 'double-encoded dots'],
    ['/v1/..%2fecho', 'an encoded slash'],
    ['/v1/..%5cecho', 'an encoded backslash'],
    ['/v1/..\\echo', 'a backslash'],
    ['/v1/..%3b/echo', 'an encoded semicolon'],
    ['/v1/..%00/echo', 'a NUL'],
    ['/v1/..%09/echo', 'a tab'],
    ['/v1/..%20/echo', 'a dot segment with a trailing space (trimmed by Windows servers)'],
    ['/v1/.../echo', 'three dots'],
    ['/v1/%u002e%u002e/echo', "IIS's %u encoding"],
    ['/v1/%c0%ae%c0%ae/echo', 'overlong UTF-8 dots'],
    ['/v1/%E2%80%A5/echo', 'U+2025, two dots under NFKC'],
    ['/v1/%EF%BC%8E%EF%BC%8E/echo', 'fullwidth dots'],
    ['/v1//../echo', 'a doubled slash'],
    ['/v1/x//echo', 'a doubled slash without dots'],
    ['/v1/../echo', 'a plain dot segment'],
    ['/v1/./x', 'a single-dot segment'],
    ['/v1/%', 'a lone percent'],
    ['v1/x', 'no leading slash'],
    ['*', 'asterisk-form'],
  ])('%s (%s) is never sent the value', (path) => {
    const s = secret({ paths: ['/v1/*'] });
    expect(routedPath(path)).toBeNull();
    expect(credentialAllows(s, 'GET', path)).toBe(false);
  });

  it('matches the decoded path when it has one reading', () => {
    const s = secret({ paths: ['/v1/*', '/files/*'] });
    expect(routedPath('/v1/a%20b?x=..;/')).toBe('/v1/a b');
    expect(credentialAllows(s, 'GET', '/%76%31/models')).toBe(true);
    expect(credentialAllows(s, 'GET', '/v1/models/')).toBe(true);
    expect(credentialAllows(s, 'GET', '/v1/a.b/c..d?q=/../')).toBe(true);
    expect(credentialAllows(s, 'GET', '/files/caf%C3%A9')).toBe(true);
    expect(credentialAllows(s, 'GET', '/v2/models')).toBe(false);
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
