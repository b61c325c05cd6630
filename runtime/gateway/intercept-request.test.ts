/**
 * The request rewrite of intercepted TLS as a pure function: targets, Host and placeholders in, what
 * goes upstream (or the refusal) out. The end-to-end cases over real TLS are in intercept.test.ts.
 */
import { describe, expect, it } from 'vitest';
import { type CredentialGrant, type CredentialSecret, mintPlaceholder } from './credentials.ts';
import { prepareRequest } from './intercept-request.ts';

const NAME = 'api.test.local';
const REAL = 'sk-REAL-7f3a9c1e5b2d4f60';

const grant: CredentialGrant = {
  name: 'api',
  placeholder: mintPlaceholder(),
  domains: [NAME],
  header: 'authorization',
  format: 'Bearer {value}',
};

/** The live secret of `g` as the state of record would hold it. */
function secretOf(g: CredentialGrant, value: string): CredentialSecret {
  return {
    name: g.name,
    generation: 'g1',
    domains: g.domains,
    header: g.header,
    format: g.format,
    value,
    methods: null,
    paths: null,
  };
}
const liveMap = new Map([[grant.name, secretOf(grant, REAL)]]);

describe('prepareRequest', () => {
  const head = (url: string, headers: string[], method = 'GET') => ({ method, url, rawHeaders: headers });

  it('accepts absolute-form for the SNI and sends origin-form', () => {
    const p = prepareRequest(head(`https://${NAME}:443?x=1`, ['Host', NAME]), NAME, [grant], liveMap, 100);
    expect(p).toMatchObject({ ok: true, path: '/?x=1', injected: [] });
  });

  it('refuses http:// absolute-form, fragments and backslashes', () => {
    for (const url of [`http://${NAME}/`, '/a#b', '/a\\..\\b', 'relative']) {
      expect(prepareRequest(head(url, ['Host', NAME]), NAME, [grant], liveMap, 100).ok, url).toBe(false);
    }
  });

  it('refuses two grants claiming the same header', () => {
    const second = { ...grant, name: 'api2', placeholder: mintPlaceholder() };
    const p = prepareRequest(
      head('/', [
        'Host',
        NAME,
        'authorization',
        `Bearer ${grant.placeholder}`,
        'authorization',
        `Bearer ${second.placeholder}`,
      ]),
      NAME,
      [grant, second],
      new Map([...liveMap, ['api2', secretOf(second, 'second-REAL-value')]]),
      100,
    );
    expect(p).toEqual({ ok: false, status: 403, reason: 'ambiguous-credential' });
  });

  it('keeps a header that carries no placeholder untouched (the sandbox may bring its own token)', () => {
    const p = prepareRequest(
      head('/', ['Host', NAME, 'Authorization', 'Bearer own-token']),
      NAME,
      [grant],
      liveMap,
      100,
    );
    expect(p.ok && p.headers).toEqual([
      'host',
      NAME,
      'Authorization',
      'Bearer own-token',
      'accept-encoding',
      'identity',
    ]);
  });
});
