/**
 * The `space:VmConfig` dynamic resource's provider, against loopback servers that answer as the
 * API does: it waits for an API that is still booting, fails at once on a refused key, writes on
 * every `pulumi up`, and uses plain HTTP only until HTTPS has worked once.
 */
import { execFile, execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { createServer as createTlsServer } from 'node:https';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Agent, fetch as undiciFetch } from 'undici';
import { afterAll, describe, expect, it } from 'vitest';
import { vmConfigProvider } from './vm-config.ts';
import * as client from './vm-config-client.ts';

const services = { 'space-api': { SPACE_LOG_LEVEL: 'debug' } };
const KEY = 'space_testkey0123456789abcdefghijklmnopqrstuv';
const servers: Server[] = [];
afterAll(() => {
  for (const s of servers) s.close();
});

type Seen = { method?: string; url?: string; auth?: string; body?: unknown }[];
function api(answer: (seen: Seen) => number, tls?: { cert: Buffer; key: Buffer }) {
  const seen: Seen = [];
  const handler = (req: IncomingMessage, res: ServerResponse) => {
    let body = '';
    req.on('data', (c) => (body += c));
    req.on('end', () => {
      seen.push({
        method: req.method,
        url: req.url,
        auth: req.headers.authorization,
        body: JSON.parse(body),
      });
      const status = answer(seen);
      res.writeHead(status, { 'content-type': 'application/json' });
      res.end(status === 200 ? body : JSON.stringify({ error: { code: 'X', message: 'no' } }));
    });
  };
  const s = tls ? createTlsServer(tls, handler) : createServer(handler);
  servers.push(s);
  return new Promise<{ url: string; seen: Seen; close(): void }>((resolve) =>
    s.listen(0, '127.0.0.1', () =>
      resolve({
        url: `${tls ? 'https' : 'http'}://127.0.0.1:${(s.address() as AddressInfo).port}`,
        seen,
        close: () => s.close(),
      }),
    ),
  );
}

describe('space:VmConfig provider', () => {
  it('diff always reports a change: every pulumi up writes the configuration again', async () => {
    expect(await vmConfigProvider(async () => client).diff!('vm-config', {}, {})).toEqual({ changes: true });
  });

  it('PUTs the services with the key, waiting out an API that is not up yet (503, then 200)', async () => {
    const a = await api((seen) => (seen.length < 3 ? 503 : 200));
    // the provider's create, with the client's retry period shortened
    const quick = {
      ...client,
      writeVmConfig: (
        i: client.VmConfigInputs,
        o: Parameters<typeof client.writeVmConfig>[1] = { allowPlain: false },
      ) => client.writeVmConfig(i, { ...o, retryMs: 20 }),
    };
    const p = vmConfigProvider(async () => quick);
    const got = await p.create({ apiUrl: a.url, apiKey: KEY, services, timeoutSec: 30 });
    expect(got.id).toBe('vm-config');
    expect(got.outs).toEqual({ apiUrl: a.url, services, httpsConfirmed: false });
    expect(JSON.stringify(got.outs)).not.toContain(KEY);
    expect(a.seen).toHaveLength(3);
    expect(a.seen[2]).toEqual({
      method: 'PUT',
      url: '/v1/deployment/vm-config',
      auth: `Bearer ${KEY}`,
      body: { services },
    });
  });

  it('with a version, sets the target version after the configuration (a version bump upgrades VMs in place)', async () => {
    const a = await api(() => 200);
    const out = await client.writeVmConfig(
      { apiUrl: a.url, apiKey: KEY, services, version: '0.2.0', timeoutSec: 5 },
      { allowPlain: false },
    );
    expect(out.version).toBe('0.2.0');
    expect(a.seen.map((x) => [x.url, x.body])).toEqual([
      ['/v1/deployment/vm-config', { services }],
      ['/v1/deployment/target-version', { version: '0.2.0' }],
    ]);
  });

  it('a refused key fails at once, naming the key', async () => {
    const a = await api(() => 401);
    await expect(
      client.writeVmConfig({ apiUrl: a.url, apiKey: KEY, services, timeoutSec: 30 }, { allowPlain: false }),
    ).rejects.toThrow(/HTTP 401.*space:bootstrapApiKey/);
    expect(a.seen).toHaveLength(1);
  });

  it('gives up at the timeout with the last failure when nothing answers', async () => {
    await expect(
      client.writeVmConfig(
        { apiUrl: 'http://127.0.0.1:9', apiKey: KEY, services, timeoutSec: 0 },
        { allowPlain: false, retryMs: 10 },
      ),
    ).rejects.toThrow(/did not take the VM configuration.*127\.0\.0\.1:9/);
  });

  describe('HTTPS, and plain HTTP only before HTTPS first worked', () => {
    const dir = mkdtempSync(join(tmpdir(), 'space-vmconfig-'));
    afterAll(() => rmSync(dir, { recursive: true, force: true }));
    execFileSync(
      'openssl',
      [
        ...['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-days', '1'],
        ...['-subj', '/CN=api.test', '-addext', 'subjectAltName=IP:127.0.0.1'],
        ...['-keyout', join(dir, 'k.pem'), '-out', join(dir, 'c.pem')],
      ],
      { stdio: 'ignore' },
    );
    const tls = { cert: readFileSync(join(dir, 'c.pem')), key: readFileSync(join(dir, 'k.pem')) };
    // the machine running Pulumi trusts the CA that signed the API's certificate
    const trusting = ((u: string, init: RequestInit) =>
      undiciFetch(u, {
        ...(init as object),
        dispatcher: new Agent({ connect: { ca: tls.cert } }),
      })) as unknown as typeof fetch;

    it('an HTTPS URL that works is used, and confirms HTTPS', async () => {
      const secure = await api(() => 200, tls);
      const plain = await api(() => 200);
      const out = await client.writeVmConfig(
        { apiUrl: secure.url, plainApiUrl: plain.url, apiKey: KEY, services, timeoutSec: 5 },
        { allowPlain: true, fetch: trusting },
      );
      expect(out.httpsConfirmed).toBe(true);
      expect([secure.seen.length, plain.seen.length]).toEqual([1, 0]);
    });

    it('TLS not set up yet (nothing serves HTTPS): the first write goes over plain HTTP; once HTTPS was confirmed, never', async () => {
      const plain = await api(() => 200);
      const inputs = {
        apiUrl: 'https://127.0.0.1:9',
        plainApiUrl: plain.url,
        apiKey: KEY,
        services,
        timeoutSec: 0,
      };
      const p = vmConfigProvider(async () => client);
      const first = await p.update!('vm-config', { httpsConfirmed: false }, inputs);
      expect(first.outs).toMatchObject({ httpsConfirmed: false });
      expect(plain.seen).toHaveLength(1);
      await expect(p.update!('vm-config', { httpsConfirmed: true }, inputs)).rejects.toThrow(
        /did not take the VM configuration/,
      );
      expect(plain.seen).toHaveLength(1);
    });
  });
});

describe('the default loader (what the serialized provider runs)', () => {
  it('loads vm-config-client.ts under plain Node 24, outside vitest, and writes', async () => {
    const a = await api(() => 200);
    const script =
      "const { vmConfigProvider } = await import('./providers/systemd/vm-config.ts');" +
      `const r = await vmConfigProvider().create({ apiUrl: '${a.url}', apiKey: 'k', services: {}, timeoutSec: 5 });` +
      'console.log(JSON.stringify(r));';
    const out = await new Promise<string>((resolve, reject) =>
      execFile(
        process.execPath,
        ['--input-type=module', '-e', script],
        { cwd: new URL('../..', import.meta.url) },
        (err, stdout) => (err ? reject(err) : resolve(stdout)),
      ),
    );
    expect(JSON.parse(out)).toEqual({
      id: 'vm-config',
      outs: { apiUrl: a.url, services: {}, httpsConfirmed: false },
    });
    expect(a.seen).toHaveLength(1);
  });
});
