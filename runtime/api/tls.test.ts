/** The API's own TLS (`SPACE_API_TLS_CERT_FILE`/`KEY_FILE`), as Kubernetes runs it with cert-manager's Secret. */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Agent, request } from 'undici';
import { afterAll, describe, expect, inject, it } from 'vitest';
import { ConfigError } from '../core/config.ts';
import { writeNewKeyPair } from '../core/tokens.ts';
import { loadApiConfig } from './config.ts';
import { startApi } from './service.ts';

const dir = mkdtempSync(join(tmpdir(), 'space-api-tls-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe('API TLS', () => {
  it('a certificate without its key (or the reverse) is refused at start', () => {
    expect(() => loadApiConfig({ SPACE_SIGNING_KEY_FILE: 'k', SPACE_API_TLS_CERT_FILE: '/c' })).toThrow(
      ConfigError,
    );
    expect(() => loadApiConfig({ SPACE_SIGNING_KEY_FILE: 'k', SPACE_API_TLS_KEY_FILE: '/k' })).toThrow(
      ConfigError,
    );
  });

  it('with both it serves HTTPS only', async () => {
    const cert = join(dir, 'tls.crt');
    const key = join(dir, 'tls.key');
    execFileSync(
      'openssl',
      [
        'req',
        '-x509',
        '-newkey',
        'ec',
        '-pkeyopt',
        'ec_paramgen_curve:P-256',
        '-nodes',
        '-days',
        '1',
        '-subj',
        '/CN=api.test',
        '-addext',
        'subjectAltName=IP:127.0.0.1',
        '-keyout',
        key,
        '-out',
        cert,
      ],
      { stdio: 'ignore' },
    );
    await writeNewKeyPair(join(dir, 'signing.pem'), join(dir, 'verify.pem'));
    const api = await startApi(
      loadApiConfig({
        SPACE_API_HOST: '127.0.0.1',
        SPACE_API_PORT: '0',
        SPACE_REDIS_URL: `${inject('redisUrl')}/9`,
        SPACE_SIGNING_KEY_FILE: join(dir, 'signing.pem'),
        SPACE_API_TLS_CERT_FILE: cert,
        SPACE_API_TLS_KEY_FILE: key,
        SPACE_LOG_LEVEL: 'silent',
      }),
    );
    try {
      expect(api.url.startsWith('https://127.0.0.1:')).toBe(true);
      const trusted = new Agent({ connect: { ca: readFileSync(cert) } });
      const res = await request(`${api.url}/healthz`, { dispatcher: trusted });
      expect(res.statusCode).toBe(200);
      await res.body.dump();
      // plain HTTP on the same port gets no API answer
      const plain = await request(`${api.url.replace('https:', 'http:')}/healthz`, {
        headersTimeout: 3000,
      }).then(
        async (r) => {
          await r.body.dump();
          return r.statusCode;
        },
        () => 'refused',
      );
      expect(plain).not.toBe(200);
      await trusted.close();
    } finally {
      await api.close();
    }
  });
});
