import { describe, expect, it } from 'vitest';
import { stripHopByHop, targetOf } from './http-proxy.ts';

describe('targetOf (Host and request-target, T07/T11/E3)', () => {
  it('accepts origin-form with a Host, with or without :80', () => {
    expect(targetOf('pkg.allowed.test', '/simple/?q=1')).toEqual({
      ok: true,
      host: 'pkg.allowed.test',
      path: '/simple/?q=1',
    });
    expect(targetOf('pkg.allowed.test:80', '/')).toMatchObject({ ok: true, host: 'pkg.allowed.test' });
  });

  it.each([
    [undefined, '/', 'missing-host'],
    ['', '/', 'missing-host'],
    ['pkg.allowed.test:8080', '/', 'bad-port'],
    ['pkg.allowed.test:80:80', '/', 'invalid-name'],
    ['pkg.allowed.test', 'http://evil.test/', 'host-mismatch'],
    ['pkg.allowed.test', 'http://pkg.allowed.test@evil.test/', 'host-mismatch'],
    ['pkg.allowed.test', 'http://evil.test@pkg.allowed.test/', 'host-mismatch'],
    ['pkg.allowed.test', 'http://pkg.allowed.test:8080/', 'host-mismatch'],
    ['pkg.allowed.test', 'https://pkg.allowed.test/', 'malformed-http'],
    ['pkg.allowed.test', '*', 'malformed-http'],
    ['pkg.allowed.test', 'pkg.allowed.test:443', 'malformed-http'],
  ])('Host %s target %s → %s', (host, url, reason) => {
    expect(targetOf(host, url)).toEqual({ ok: false, reason });
  });

  it('accepts an absolute-form URI that agrees with Host (case, trailing dot)', () => {
    expect(targetOf('PKG.allowed.test', 'http://pkg.allowed.test./a?b')).toEqual({
      ok: true,
      host: 'PKG.allowed.test',
      path: '/a?b',
    });
  });
});

describe('stripHopByHop', () => {
  it('drops hop-by-hop headers and those named in Connection', () => {
    const raw = [
      'Host',
      'a.test',
      'Connection',
      'keep-alive, X-Secret',
      'X-Secret',
      '1',
      'Keep-Alive',
      'timeout=5',
      'Transfer-Encoding',
      'chunked',
      'Upgrade',
      'websocket',
      'Proxy-Authorization',
      'Basic x',
      'TE',
      'trailers',
      'Accept',
      '*/*',
    ];
    expect(stripHopByHop(raw)).toEqual(['Host', 'a.test', 'Accept', '*/*']);
  });
});
