import { X509Certificate } from 'node:crypto';
import { chmod, mkdtemp, readFile, rm, stat, writeFile } from 'node:fs/promises';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import tls from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { caFromPem, type DeploymentCa, generateCaPem, loadOrCreateCa } from './ca.ts';

let dir: string;
beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'space-ca-'));
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

/** Real handshake: a server presenting `leaf` for `name`, a client trusting only `caPem`. */
async function handshake(ca: DeploymentCa, leafName: string, clientName: string): Promise<string | null> {
  const leaf = await ca.leafFor(leafName);
  const server = tls.createServer({ SNICallback: (_n, cb) => cb(null, leaf.context) }, (s) => s.end());
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  try {
    return await new Promise<string | null>((resolve) => {
      const c = tls.connect({
        host: '127.0.0.1',
        port: (server.address() as AddressInfo).port,
        servername: clientName,
        ca: [ca.certPem],
      });
      c.on('secureConnect', () => {
        c.destroy();
        resolve(null);
      });
      c.on('error', (err: NodeJS.ErrnoException) => resolve(err.code ?? err.message));
    });
  } finally {
    server.close();
  }
}

describe('loadOrCreateCa', () => {
  it('creates a P-256 CA valid ten years, key mode 0600, and loads the same one next time', async () => {
    const certFile = join(dir, 'new', 'ca.crt');
    const keyFile = join(dir, 'new', 'ca.key');
    const ca = await loadOrCreateCa(certFile, keyFile);
    expect((await stat(keyFile)).mode & 0o777).toBe(0o600);
    const cert = new X509Certificate(await readFile(certFile, 'utf8'));
    expect(cert.ca).toBe(true);
    expect(cert.publicKey.asymmetricKeyDetails?.namedCurve).toBe('prime256v1');
    const years = (cert.validToDate.getTime() - Date.now()) / (365 * 24 * 3600 * 1000);
    expect(years).toBeGreaterThan(9.9);
    expect(years).toBeLessThan(10.1);
    expect(cert.subject).toMatch(/CN=SPACE deployment CA [0-9a-f]{12}/);
    expect(cert.verify(cert.publicKey)).toBe(true);
    const again = await loadOrCreateCa(certFile, keyFile);
    expect(again.certPem).toBe(ca.certPem);
  });

  it('refuses a certificate without its key instead of overwriting it', async () => {
    const certFile = join(dir, 'half', 'ca.crt');
    await loadOrCreateCa(certFile, join(dir, 'half', 'ca.key'));
    await expect(loadOrCreateCa(certFile, join(dir, 'half', 'other.key'))).rejects.toThrow(/does not/);
    expect(await readFile(certFile, 'utf8')).toContain('BEGIN CERTIFICATE');
  });

  it('refuses a key readable by group or others', async () => {
    const certFile = join(dir, 'loose', 'ca.crt');
    const keyFile = join(dir, 'loose', 'ca.key');
    await loadOrCreateCa(certFile, keyFile);
    await chmod(keyFile, 0o644);
    await expect(loadOrCreateCa(certFile, keyFile)).rejects.toThrow(/chmod 600/);
  });

  it('refuses a key that does not belong to the certificate, and a non-CA certificate', async () => {
    const a = await generateCaPem();
    const b = await generateCaPem();
    expect(() => caFromPem(a.certPem, b.keyPem)).toThrow(/does not match/);
    const ca = caFromPem(a.certPem, a.keyPem);
    const leaf = await ca.leafFor('api.example.com');
    expect(() => caFromPem(leaf.certPem, leaf.keyPem)).toThrow(/not a CA/);
    const bad = join(dir, 'garbage.crt');
    await writeFile(bad, 'nope');
    expect(() => caFromPem('nope', a.keyPem)).toThrow(/not a PEM/);
  });
});

describe('leafFor', () => {
  let ca: DeploymentCa;
  beforeAll(async () => {
    const { certPem, keyPem } = await generateCaPem();
    ca = caFromPem(certPem, keyPem);
  });

  it('mints a short-lived serverAuth leaf whose only SAN is the name, signed by the CA', async () => {
    const leaf = await ca.leafFor('api.example.com');
    const cert = new X509Certificate(leaf.certPem);
    expect(cert.subjectAltName).toBe('DNS:api.example.com');
    expect(cert.ca).toBe(false);
    expect(cert.keyUsage).toEqual(['1.3.6.1.5.5.7.3.1']);
    expect(cert.checkIssued(new X509Certificate(ca.certPem))).toBe(true);
    expect(cert.validToDate.getTime() - Date.now()).toBeLessThanOrEqual(24 * 3600 * 1000);
  });

  it('is accepted by a client trusting the CA for that name, and only for that name', async () => {
    expect(await handshake(ca, 'api.example.com', 'api.example.com')).toBeNull();
    expect(await handshake(ca, 'api.example.com', 'evil.example.com')).toBe('ERR_TLS_CERT_ALTNAME_INVALID');
  });

  it('refuses names that are not canonical host names', async () => {
    for (const bad of ['127.0.0.1', '*.example.com', 'API.example.com', 'example.com.', '', 'a b.com']) {
      await expect(ca.leafFor(bad), bad).rejects.toThrow(/canonical host name/);
    }
  });

  it('caches leaves, shares a mint between concurrent callers, and evicts the least recently used', async () => {
    const { certPem, keyPem } = await generateCaPem();
    const small = caFromPem(certPem, keyPem, { maxLeaves: 2 });
    const [a1, a2] = await Promise.all([small.leafFor('a.example.com'), small.leafFor('a.example.com')]);
    expect(a1).toBe(a2);
    await small.leafFor('b.example.com');
    expect(await small.leafFor('a.example.com')).toBe(a1); // a is now most recent
    await small.leafFor('c.example.com'); // evicts b
    expect(await small.leafFor('a.example.com')).toBe(a1);
    const b2 = await small.leafFor('b.example.com'); // re-minted
    expect(new X509Certificate(b2.certPem).subjectAltName).toBe('DNS:b.example.com');
  });

  it('re-mints a leaf with under a quarter of its life left', async () => {
    const { certPem, keyPem } = await generateCaPem();
    let now = Date.now();
    const clocked = caFromPem(certPem, keyPem, { now: () => now, leafTtlMs: 60_000 });
    const first = await clocked.leafFor('api.example.com');
    now += 30_000;
    expect(await clocked.leafFor('api.example.com')).toBe(first);
    now += 20_000;
    const second = await clocked.leafFor('api.example.com');
    expect(second).not.toBe(first);
    expect(second.notAfter.getTime()).toBe(now + 60_000);
  });
});
