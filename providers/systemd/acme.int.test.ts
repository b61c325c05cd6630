/**
 * The control VM's `space-tls` (ACME TLS for Crusoe) run for real against a real ACME server:
 * Debian's `pebble` (Let's Encrypt's test CA) and Debian's `certbot`, the package the startup
 * script installs. Paths move into a temp folder (`/etc/space`, certbot's directories), certbot's
 * HTTP-01 port moves off 80, and pebble is told to skip validation (`PEBBLE_VA_ALWAYS_VALID`: the
 * names do not resolve here). What it proves: certbot takes the script's flags, one certificate
 * names both hosts, the API and router get it, a second boot changes nothing, and a renewal runs
 * the deploy hook certbot stored, which installs the new certificate and restarts both.
 *
 * Needs `pebble` and `certbot` (.ci/run installs them); skipped without.
 */
import { type ChildProcess, execFileSync, spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { controlPlan } from './cloud-init.ts';

const have = (bin: string) => spawnSync('sh', ['-c', `command -v ${bin}`]).status === 0;
const available = have('pebble') && have('certbot') && have('openssl');

/** A TCP port nobody listens on now. */
const freePort = () =>
  new Promise<number>((resolve) => {
    const s = createServer().listen(0, '127.0.0.1', () => {
      const { port } = s.address() as { port: number };
      s.close(() => resolve(port));
    });
  });

describe.skipIf(!available)('space-tls against pebble (a real ACME server) with certbot', () => {
  const dir = mkdtempSync(join(tmpdir(), 'space-acme-'));
  let pebble: ChildProcess | undefined;
  let run: (...args: string[]) => { status: number | null; out: string };
  let calls: () => string;
  const env = {
    PATH: `${dir}/bin:/usr/sbin:/usr/bin:/sbin:/bin`,
    REQUESTS_CA_BUNDLE: join(dir, 'pebble.crt'),
  };

  beforeAll(async () => {
    const [acmePort, mgmtPort, httpPort] = [await freePort(), await freePort(), await freePort()];
    execFileSync(
      'openssl',
      [
        ...['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-days', '2'],
        ...['-subj', '/CN=pebble', '-addext', 'subjectAltName=IP:127.0.0.1,DNS:localhost'],
        ...['-keyout', join(dir, 'pebble.key'), '-out', join(dir, 'pebble.crt')],
      ],
      { stdio: 'ignore' },
    );
    writeFileSync(
      join(dir, 'pebble.json'),
      JSON.stringify({
        pebble: {
          listenAddress: `127.0.0.1:${acmePort}`,
          managementListenAddress: `127.0.0.1:${mgmtPort}`,
          certificate: join(dir, 'pebble.crt'),
          privateKey: join(dir, 'pebble.key'),
          httpPort,
          tlsPort: await freePort(),
          ocspResponderURL: '',
          externalAccountBindingRequired: false,
        },
      }),
    );
    pebble = spawn('pebble', ['-config', join(dir, 'pebble.json')], {
      env: {
        ...process.env,
        PEBBLE_VA_ALWAYS_VALID: '1',
        PEBBLE_VA_NOSLEEP: '1',
        PEBBLE_WFE_NONCEREJECT: '0',
      },
      stdio: 'ignore',
    });
    for (let i = 0; i < 100; i++) {
      if (spawnSync('bash', ['-c', `exec 3<>/dev/tcp/127.0.0.1/${acmePort}`]).status === 0) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    const plan = controlPlan({
      version: '0.1.0',
      imageRepository: 'registry.example/space',
      privateCidr: '10.10.0.0/24',
      redisPassword: 'redis-pw-0123456789',
      routerUrl: 'https://router.space.test:8082',
      acme: {
        hostnames: ['api.space.test', 'router.space.test'],
        email: 'ops@space.test',
        server: `https://127.0.0.1:${acmePort}/dir`,
      },
    });
    const file = (p: string) => plan.files.find((f) => f.path === p)!.content;
    execFileSync('mkdir', ['-p', `${dir}/etc`, `${dir}/bin`, `${dir}/le`]);
    writeFileSync(`${dir}/etc/space-tls.env`, file('/etc/space/space-tls.env'));
    const script = file('/usr/local/sbin/space-tls')
      .replace(
        'certbot certonly',
        `certbot --config-dir ${dir}/le --work-dir ${dir}/work --logs-dir ${dir}/logs certonly --http-01-port ${httpPort}`,
      )
      .replaceAll('/etc/letsencrypt/live/space', `${dir}/le/live/space`)
      .replaceAll('/usr/local/sbin/space-tls', `${dir}/space-tls`)
      .replaceAll('/etc/space', `${dir}/etc`);
    writeFileSync(`${dir}/space-tls`, script, { mode: 0o755 });
    writeFileSync(`${dir}/bin/systemctl`, `#!/bin/sh\necho "$*" >> ${dir}/systemctl\n`, { mode: 0o755 });
    run = (...args) => {
      const r = spawnSync('bash', [`${dir}/space-tls`, ...args], {
        env,
        encoding: 'utf8',
        timeout: 120_000,
        input: '',
      });
      return { status: r.status, out: `${r.stdout}${r.stderr}` };
    };
    calls = () => {
      const c = spawnSync('cat', [`${dir}/systemctl`], { encoding: 'utf8' }).stdout.trim();
      rmSync(`${dir}/systemctl`, { force: true });
      return c;
    };
  }, 60_000);

  afterAll(() => {
    pebble?.kill();
    rmSync(dir, { recursive: true, force: true });
  });

  it('first boot: one certificate for both names, installed for the API and the router', () => {
    const r = run();
    expect(r.status, r.out).toBe(0);
    const names = execFileSync(
      'openssl',
      ['x509', '-noout', '-ext', 'subjectAltName', '-in', `${dir}/etc/tls/tls.crt`],
      {
        encoding: 'utf8',
      },
    );
    expect(names).toContain('DNS:api.space.test');
    expect(names).toContain('DNS:router.space.test');
    expect(readFileSync(`${dir}/etc/space-api.tls.env`, 'utf8')).toBe(
      `SPACE_API_TLS_CERT_FILE=${dir}/etc/tls/tls.crt\nSPACE_API_TLS_KEY_FILE=${dir}/etc/tls/tls.key\n`,
    );
    expect(readFileSync(`${dir}/etc/space-router.tls.env`, 'utf8')).toContain('SPACE_ROUTER_TLS_KEY_FILE=');
    // the deploy hook installed it during certbot's run; the script's own pass then found nothing to do
    expect(calls()).toBe('try-restart space-api space-router space-api space-router');
  });

  it('next boot: certbot keeps the certificate; nothing restarts', () => {
    const before = readFileSync(`${dir}/etc/tls/tls.crt`, 'utf8');
    const r = run();
    expect(r.status, r.out).toBe(0);
    expect(readFileSync(`${dir}/etc/tls/tls.crt`, 'utf8')).toBe(before);
    expect(calls()).toBe('');
  });

  it('renewal (certbot renew, as its timer runs it): the stored deploy hook installs the new certificate and restarts both', () => {
    const before = readFileSync(`${dir}/etc/tls/tls.crt`, 'utf8');
    const r = spawnSync(
      'certbot',
      [
        '--config-dir',
        `${dir}/le`,
        '--work-dir',
        `${dir}/work`,
        '--logs-dir',
        `${dir}/logs`,
        'renew',
        '--force-renewal',
        '--non-interactive',
        // certbot sleeps up to 8 minutes before a renewal run without a terminal (spreads load on the CA)
        '--no-random-sleep-on-renew',
      ],
      { env, encoding: 'utf8', timeout: 120_000, input: '' },
    );
    expect(r.status, `${r.stdout}${r.stderr}`).toBe(0);
    expect(readFileSync(`${dir}/etc/tls/tls.crt`, 'utf8')).not.toBe(before);
    expect(calls()).toBe('try-restart space-api space-router');
  });
});
