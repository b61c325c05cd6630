/**
 * The gateway against real upstreams: a test network namespace `gwt-<tag>` (veth, 10.199.<n>.0/24)
 * holds an HTTP + HTTPS server per role (good, evil, deny) and an authoritative DNS server
 * (`test-upstreams.ts`), each printing a far-side hit log. The gateway runs in this process on
 * 127.0.0.1; clients connect to its ports directly (the nftables redirect is the agent's part),
 * from 127.0.0.1 (sandbox A), 127.0.0.2 (sandbox B) or 127.0.0.3 (unregistered). Every check looks
 * at the far side: what the forbidden servers and the upstream DNS server received.
 */
import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { createSocket } from 'node:dgram';
import { once } from 'node:events';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { request as httpRequest } from 'node:http';
import { createServer as createNetServer, connect as netConnect, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { connect as tlsConnect } from 'node:tls';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import dnsPacket from 'dns-packet';
import { Redis } from 'ioredis';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { keys } from '../core/redis-keys.ts';
import { gatewayConfigWith } from './config.ts';
import type { RunningGateway } from './service.ts';
import { startGateway } from './service.ts';
import type { UpstreamsConfig } from './test-upstreams.ts';

const run = promisify(execFile);
const TAG = randomBytes(2).toString('hex');
const NS = `gwt-${TAG}`;
const HOST_IF = `gwth${TAG}`;
const NS_IF = `gwtn${TAG}`;
const NET = `10.199.${100 + (Number.parseInt(TAG, 16) % 150)}`;
const ADDR = { host: `${NET}.1`, good: `${NET}.2`, evil: `${NET}.3`, dns: `${NET}.53`, deny: `${NET}.200` };
const A = '127.0.0.1';
const B = '127.0.0.2';
const STRANGER = '127.0.0.3';
const HANDSHAKE_MS = 600;
const MAX_CONNS = 4;

const POLICY = {
  allow: ['pkg.allowed.test', 'other.allowed.test', 'good.shared.test', 'rebind.allowed.test'],
};
const RECORDS: Record<string, string> = {
  'pkg.allowed.test': ADDR.good,
  'other.allowed.test': ADDR.good,
  'good.shared.test': ADDR.good,
  'evil.shared.test': ADDR.good, // E2: a forbidden name on the allowed address
  'rebind.allowed.test': ADDR.deny, // T04: an allowed name pointing into the deny set
  'forbidden.test': ADDR.evil,
  'evil.test': ADDR.evil,
};

let tmp = '';
let ca: Buffer;
let upstreams: ChildProcess | null = null;
let gw: RunningGateway | null = null;
const hits: Record<string, unknown>[] = [];
const audit: Record<string, unknown>[] = [];
const cleanups: (() => Promise<unknown>)[] = [];

// ---------- setup ----------

async function sh(cmd: string, args: string[]): Promise<void> {
  await run(cmd, args, { timeout: 10_000 });
}

async function makeCerts(): Promise<void> {
  const o = (args: string[]) => sh('openssl', args);
  await o([
    'req',
    '-x509',
    '-newkey',
    'ec',
    '-pkeyopt',
    'ec_paramgen_curve:P-256',
    '-nodes',
    '-keyout',
    join(tmp, 'ca.key'),
    '-out',
    join(tmp, 'ca.crt'),
    '-days',
    '1',
    '-subj',
    '/CN=gwt test CA',
  ]);
  await o([
    'req',
    '-newkey',
    'ec',
    '-pkeyopt',
    'ec_paramgen_curve:P-256',
    '-nodes',
    '-keyout',
    join(tmp, 'leaf.key'),
    '-out',
    join(tmp, 'leaf.csr'),
    '-subj',
    '/CN=pkg.allowed.test',
  ]);
  await writeFile(
    join(tmp, 'ext.cnf'),
    'subjectAltName=DNS:*.allowed.test,DNS:good.shared.test,DNS:evil.shared.test,DNS:forbidden.test,DNS:evil.test\n',
  );
  await o([
    'x509',
    '-req',
    '-in',
    join(tmp, 'leaf.csr'),
    '-CA',
    join(tmp, 'ca.crt'),
    '-CAkey',
    join(tmp, 'ca.key'),
    '-CAcreateserial',
    '-out',
    join(tmp, 'leaf.crt'),
    '-days',
    '1',
    '-extfile',
    join(tmp, 'ext.cnf'),
  ]);
  ca = await readFile(join(tmp, 'ca.crt'));
}

async function makeNamespace(): Promise<void> {
  await sh('ip', ['netns', 'add', NS]);
  cleanups.push(() => run('ip', ['netns', 'del', NS]));
  await sh('ip', ['link', 'add', HOST_IF, 'type', 'veth', 'peer', 'name', NS_IF, 'netns', NS]);
  cleanups.push(() => run('ip', ['link', 'del', HOST_IF]));
  await sh('ip', ['addr', 'add', `${ADDR.host}/24`, 'dev', HOST_IF]);
  await sh('ip', ['link', 'set', HOST_IF, 'up']);
  for (const a of [ADDR.good, ADDR.evil, ADDR.dns, ADDR.deny])
    await sh('ip', ['-n', NS, 'addr', 'add', `${a}/24`, 'dev', NS_IF]);
  await sh('ip', ['-n', NS, 'link', 'set', NS_IF, 'up']);
  await sh('ip', ['-n', NS, 'link', 'set', 'lo', 'up']);
}

async function startUpstreams(): Promise<void> {
  const cfg: UpstreamsConfig = {
    roles: { good: ADDR.good, evil: ADDR.evil, deny: ADDR.deny },
    dnsAddress: ADDR.dns,
    certFile: join(tmp, 'leaf.crt'),
    keyFile: join(tmp, 'leaf.key'),
    records: RECORDS,
  };
  const script = fileURLToPath(new URL('./test-upstreams.ts', import.meta.url));
  const child = spawn('ip', ['netns', 'exec', NS, process.execPath, script, JSON.stringify(cfg)], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  upstreams = child;
  cleanups.push(async () => {
    if (child.exitCode === null) {
      child.kill('SIGKILL');
      await once(child, 'exit');
    }
  });
  let stderr = '';
  child.stderr!.on('data', (d: Buffer) => {
    stderr += d.toString();
  });
  let buffered = '';
  const ready = new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`upstreams not ready: ${stderr}`)), 15_000);
    child.once('exit', (code) => reject(new Error(`upstreams exited ${code}: ${stderr}`)));
    child.stdout!.on('data', (d: Buffer) => {
      buffered += d.toString();
      let nl = buffered.indexOf('\n');
      while (nl >= 0) {
        const line = buffered.slice(0, nl);
        buffered = buffered.slice(nl + 1);
        if (line === 'READY') {
          clearTimeout(timer);
          resolve();
        } else if (line.startsWith('{')) hits.push(JSON.parse(line) as Record<string, unknown>);
        nl = buffered.indexOf('\n');
      }
    });
  });
  await ready;
}

beforeAll(async () => {
  tmp = await mkdtemp(join(tmpdir(), 'gwt-'));
  cleanups.push(() => rm(tmp, { recursive: true, force: true }));
  await makeCerts();
  await makeNamespace();
  await startUpstreams();
  const log = pino(
    { level: 'info' },
    {
      write(line: string) {
        audit.push(JSON.parse(line) as Record<string, unknown>);
      },
    },
  );
  gw = await startGateway(
    gatewayConfigWith({
      bindHost: '127.0.0.1',
      dnsPort: 0,
      httpPort: 0,
      tlsPort: 0,
      controlSocket: join(tmp, 'gateway.sock'),
      caCertFile: join(tmp, 'gw-ca.crt'),
      caKeyFile: join(tmp, 'gw-ca.key'),
      upstreamCaFile: join(tmp, 'ca.crt'),
      upstreamDns: `${ADDR.dns}:53`,
      denyCidrs: `${NET}.128/25`,
      handshakeTimeoutMs: HANDSHAKE_MS,
      maxConnections: MAX_CONNS,
      dialTimeoutMs: 2000,
      resolveTimeoutMs: 1000,
      dnsQueriesPerSec: 1000,
      redisUrl: inject('redisUrl'),
    }),
    { log },
  );
  cleanups.push(() => gw!.close());
  expect((await control('PUT', `/v1/sandboxes/${A}`, { sandboxId: 'sbx-a', policy: POLICY })).status).toBe(
    200,
  );
  expect((await control('PUT', `/v1/sandboxes/${B}`, { sandboxId: 'sbx-b', policy: POLICY })).status).toBe(
    200,
  );
}, 60_000);

afterAll(async () => {
  for (const c of cleanups.reverse()) await c().catch(() => {});
});

// ---------- clients ----------

function control(method: string, path: string, body?: unknown): Promise<{ status: number; json: unknown }> {
  return new Promise((resolve, reject) => {
    const req = httpRequest(
      {
        socketPath: join(tmp, 'gateway.sock'),
        method,
        path,
        headers: body ? { 'content-type': 'application/json' } : {},
      },
      (res) => {
        let text = '';
        res.on('data', (d: Buffer) => {
          text += d.toString();
        });
        res.on('end', () => resolve({ status: res.statusCode ?? 0, json: text ? JSON.parse(text) : null }));
      },
    );
    req.on('error', reject);
    req.end(body ? JSON.stringify(body) : undefined);
  });
}

/** A TLS client to the gateway's TLS port from source address `from` (verifies against the test CA). */
function tlsOpen(servername: string, from: string) {
  const socket = netConnect({ host: '127.0.0.1', port: gw!.tlsPort, localAddress: from });
  socket.on('error', () => {});
  const tls = tlsConnect({ socket, servername, ca });
  tls.on('error', () => {}); // callers see failures as 'close' / no data
  return tls;
}

type Outcome = { ok: true; body: string } | { ok: false; error: string };

/** An HTTPS GET through the gateway's TLS port (SNI `sni`, verified against the test CA). */
function tlsGet(sni: string | undefined, from = A, host = sni): Promise<Outcome> {
  return new Promise((resolve) => {
    const s = tlsOpen(sni ?? '', from);
    let body = '';
    const timer = setTimeout(() => {
      s.destroy();
      resolve({ ok: false, error: 'timeout' });
    }, 3000);
    s.on('secureConnect', () => s.write(`GET /x HTTP/1.1\r\nHost: ${host}\r\nConnection: close\r\n\r\n`));
    s.on('data', (d: Buffer) => {
      body += d.toString();
    });
    s.on('error', (err) => {
      clearTimeout(timer);
      resolve({ ok: false, error: err.message });
    });
    s.on('end', () => {
      clearTimeout(timer);
      resolve(body ? { ok: true, body } : { ok: false, error: 'closed' });
    });
  });
}

/** An HTTP GET through the gateway's HTTP port with this Host header (and request-target). */
function httpGet(
  host: string,
  from = A,
  target = '/x',
): Promise<{ status: number; body: string } | { status: 0; body: string }> {
  return new Promise((resolve) => {
    const req = httpRequest(
      {
        host: '127.0.0.1',
        port: gw!.httpPort,
        path: target,
        headers: { host },
        setHost: false,
        agent: false,
        localAddress: from,
      },
      (res) => {
        let body = '';
        res.on('data', (d: Buffer) => {
          body += d.toString();
        });
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
      },
    );
    req.setTimeout(3000, () => req.destroy(new Error('timeout')));
    req.on('error', (err) => resolve({ status: 0, body: err.message }));
    req.end();
  });
}

/** Writes `bytes` on a raw TCP connection; resolves with what came back and whether the gateway closed it. */
function rawExchange(
  port: number,
  bytes: Buffer | string,
  from = A,
  waitMs = 1500,
): Promise<{ data: string; closed: boolean }> {
  return new Promise((resolve) => {
    const s = netConnect({ host: '127.0.0.1', port, localAddress: from });
    let data = '';
    const done = (closed: boolean) => {
      clearTimeout(timer);
      s.destroy();
      resolve({ data, closed });
    };
    const timer = setTimeout(() => done(false), waitMs);
    s.on('connect', () => s.write(bytes));
    s.on('data', (d: Buffer) => {
      data += d.toString('latin1');
    });
    s.on('error', () => done(true));
    s.on('close', () => done(true));
  });
}

/** One DNS query over UDP to the gateway; null when nothing came back within 400 ms. */
async function dnsQuery(
  name: string,
  type: dnsPacket.RecordType = 'A',
  from = A,
): Promise<{ rcode: string; answers: string[] } | null> {
  const sock = createSocket('udp4');
  await new Promise<void>((resolve) => sock.bind(0, from, () => resolve()));
  try {
    const id = randomBytes(2).readUInt16BE(0);
    const reply = new Promise<Buffer | null>((resolve) => {
      const timer = setTimeout(() => resolve(null), 400);
      sock.on('message', (m) => {
        clearTimeout(timer);
        resolve(m);
      });
    });
    sock.send(
      dnsPacket.encode({
        type: 'query',
        id,
        flags: dnsPacket.RECURSION_DESIRED,
        questions: [{ type, name }],
      }),
      gw!.dnsPort,
      '127.0.0.1',
    );
    const m = await reply;
    if (!m) return null;
    const p = dnsPacket.decode(m) as dnsPacket.DecodedPacket & { rcode: string };
    return { rcode: p.rcode, answers: (p.answers ?? []).map((a) => String((a as { data?: unknown }).data)) };
  } finally {
    sock.close();
  }
}

/** A real ClientHello for `sni` from Node's TLS stack. */
async function captureHello(sni: string): Promise<Buffer> {
  const server = createNetServer();
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const got = new Promise<Buffer>((resolve) =>
    server.once('connection', (s) =>
      s.once('data', (d: Buffer) => {
        resolve(d);
        s.destroy();
      }),
    ),
  );
  const c = tlsConnect({
    host: '127.0.0.1',
    port: (server.address() as { port: number }).port,
    servername: sni,
  });
  c.on('error', () => {});
  const hello = await got;
  c.destroy();
  server.close();
  return hello;
}

const since = (mark: number) => hits.slice(mark);
const forbiddenHits = () => hits.filter((h) => h.role === 'evil' || h.role === 'deny');
const denied = (reason: string, name?: string) =>
  audit.some(
    (l) => l.msg === 'egress deny' && l.reason === reason && (name === undefined || l.name === name),
  );
/** Resolves when `s` closes (unlike events.once, an 'error' first does not reject). */
const onClose = (s: Socket) => new Promise<void>((resolve) => s.once('close', () => resolve()));
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

// ---------- tests ----------

describe('gateway against real upstreams', () => {
  it('allowed name: DNS answer from its own upstream, TLS splice and HTTP reach the real server', async () => {
    expect(await dnsQuery('pkg.allowed.test')).toEqual({ rcode: 'NOERROR', answers: [ADDR.good] });
    expect(await dnsQuery('pkg.allowed.test', 'AAAA')).toEqual({ rcode: 'NOERROR', answers: [] });
    const tls = await tlsGet('pkg.allowed.test');
    // the certificate verified against the test CA: the gateway spliced, it did not terminate
    expect(tls).toMatchObject({ ok: true });
    expect((tls as { body: string }).body).toContain('good https pkg.allowed.test /x');
    const http = await httpGet('pkg.allowed.test');
    expect(http).toMatchObject({ status: 200 });
    expect(http.body).toBe('good http pkg.allowed.test /x');
    expect(
      audit.some(
        (l) =>
          l.msg === 'egress allow' &&
          l.protocol === 'tls' &&
          l.address === ADDR.good &&
          l['sandbox.id'] === 'sbx-a',
      ),
    ).toBe(true);
  });

  it('E1 forged name: whatever the sandbox believes, the gateway dials only its own resolution', async () => {
    // the sandbox's /etc/hosts says pkg.allowed.test = evil; its packets to evil:443/80 are redirected to the gateway
    const mark = hits.length;
    expect(await tlsGet('pkg.allowed.test')).toMatchObject({ ok: true });
    expect((await httpGet('pkg.allowed.test')).body).toContain('good http');
    expect(since(mark).filter((h) => h.role !== 'good')).toEqual([]);
    expect(forbiddenHits()).toEqual([]);
  });

  it('E2 shared address: a forbidden name on the allowed address is refused (SNI and Host)', async () => {
    const mark = hits.length;
    expect(await tlsGet('evil.shared.test')).toMatchObject({ ok: false });
    expect(await httpGet('evil.shared.test')).toMatchObject({ status: 403 });
    expect(await dnsQuery('evil.shared.test')).toMatchObject({ rcode: 'REFUSED' });
    expect(since(mark)).toEqual([]); // the gateway never even dialled the shared address
    expect(denied('not-allowed', 'evil.shared.test')).toBe(true);
    expect(await tlsGet('good.shared.test')).toMatchObject({ ok: true });
  });

  it('E3/T10 HTTP: absolute-URI ≠ Host, and a Host switch on a keep-alive connection, are refused', async () => {
    const mark = hits.length;
    expect(await httpGet('pkg.allowed.test', A, 'http://evil.test/x')).toMatchObject({ status: 403 });
    expect(await httpGet('pkg.allowed.test', A, 'http://pkg.allowed.test@evil.test/x')).toMatchObject({
      status: 403,
    });
    expect(denied('host-mismatch')).toBe(true);
    // two pipelined requests in one packet: the second names a forbidden host
    const r = await rawExchange(
      gw!.httpPort,
      'GET /1 HTTP/1.1\r\nHost: pkg.allowed.test\r\n\r\nGET /2 HTTP/1.1\r\nHost: evil.test\r\n\r\n',
    );
    expect(r.data).toContain('good http pkg.allowed.test /1');
    expect(r.data).toContain('403');
    expect(
      since(mark)
        .filter((h) => h.kind === 'http')
        .map((h) => h.url),
    ).toEqual(['/1']);
    expect(forbiddenHits()).toEqual([]);
  });

  it('refuses no SNI, an IP-literal SNI and unknown protocols on 443 and 80', async () => {
    const mark = hits.length;
    expect(await tlsGet(undefined, A, 'pkg.allowed.test')).toMatchObject({ ok: false });
    expect(denied('no-sni')).toBe(true);
    expect(await tlsGet(ADDR.good, A, 'pkg.allowed.test')).toMatchObject({ ok: false });
    expect(denied('ip-literal')).toBe(true);
    expect(await rawExchange(gw!.tlsPort, 'GET / HTTP/1.1\r\nHost: pkg.allowed.test\r\n\r\n')).toMatchObject({
      closed: true,
      data: '',
    });
    expect(denied('not-tls')).toBe(true);
    expect(await rawExchange(gw!.tlsPort, 'SSH-2.0-OpenSSH_9.2\r\n')).toMatchObject({
      closed: true,
      data: '',
    });
    const tlsOn80 = await rawExchange(gw!.httpPort, await captureHello('pkg.allowed.test'));
    expect(tlsOn80.closed).toBe(true);
    expect(tlsOn80.data).not.toContain('good');
    expect(denied('malformed-http')).toBe(true);
    expect(await httpGet(ADDR.good)).toMatchObject({ status: 403 });
    const connect = await rawExchange(
      gw!.httpPort,
      'CONNECT evil.test:443 HTTP/1.1\r\nHost: evil.test:443\r\n\r\n',
    );
    expect(connect.data).toContain('405');
    expect(denied('method-not-allowed')).toBe(true);
    const upgrade = await rawExchange(
      gw!.httpPort,
      'GET / HTTP/1.1\r\nHost: pkg.allowed.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n',
    );
    expect(upgrade.data).toContain('403');
    expect(since(mark)).toEqual([]);
  });

  it('deny wins over allow; allow-all still honours deny', async () => {
    try {
      await control('PUT', `/v1/sandboxes/${A}`, {
        sandboxId: 'sbx-a',
        policy: { allow: ['*.allowed.test'], deny: ['pkg.allowed.test'] },
      });
      expect(await tlsGet('pkg.allowed.test')).toMatchObject({ ok: false });
      expect(await dnsQuery('pkg.allowed.test')).toMatchObject({ rcode: 'REFUSED' });
      // E8: a denied name's addresses are denied too, so its neighbour on the same address goes with it
      expect(await tlsGet('other.allowed.test')).toMatchObject({ ok: false });
      expect(await dnsQuery('other.allowed.test')).toEqual({ rcode: 'NOERROR', answers: [] });
      expect(denied('denied-name-address', 'other.allowed.test')).toBe(true);
      await control('PUT', `/v1/sandboxes/${A}`, {
        sandboxId: 'sbx-a',
        policy: { mode: 'allow-all', deny: ['forbidden.test', '*.evil.test'] },
      });
      expect(await tlsGet('good.shared.test')).toMatchObject({ ok: true });
      expect(await tlsGet('forbidden.test')).toMatchObject({ ok: false });
      expect(await httpGet('forbidden.test')).toMatchObject({ status: 403 });
      expect(await dnsQuery('forbidden.test')).toMatchObject({ rcode: 'REFUSED' });
      expect(await dnsQuery('x.evil.test')).toMatchObject({ rcode: 'REFUSED' });
      expect(denied('policy-deny', 'forbidden.test')).toBe(true);
      expect(forbiddenHits()).toEqual([]);
    } finally {
      await control('PUT', `/v1/sandboxes/${A}`, { sandboxId: 'sbx-a', policy: POLICY });
    }
  });

  it('T04 rebinding: an allowed name resolving into the deny set is never answered nor dialled', async () => {
    expect(await dnsQuery('rebind.allowed.test')).toEqual({ rcode: 'NOERROR', answers: [] });
    expect(await tlsGet('rebind.allowed.test')).toMatchObject({ ok: false });
    expect(await httpGet('rebind.allowed.test')).toMatchObject({ status: 403 });
    expect(denied('resolved-to-denied-address', 'rebind.allowed.test')).toBe(true);
    expect(hits.filter((h) => h.role === 'deny')).toEqual([]);
  });

  it('T03 DNS tunnelling: random names under a forbidden domain are REFUSED and never reach the upstream', async () => {
    const names = Array.from(
      { length: 40 },
      () =>
        `${randomBytes(30).toString('hex').slice(0, 60)}.${randomBytes(8).toString('hex')}.exfil.evil.test`,
    );
    const answers = await Promise.all(names.map((n, i) => dnsQuery(n, i % 2 ? 'TXT' : 'A')));
    expect(answers.every((a) => a?.rcode === 'REFUSED')).toBe(true);
    expect(await dnsQuery('pkg.allowed.test', 'TXT')).toMatchObject({ rcode: 'REFUSED' });
    const upstreamNames = hits.filter((h) => h.role === 'dns').map((h) => h.name);
    expect(upstreamNames.filter((n) => String(n).includes('evil'))).toEqual([]);
    // forbidden.test: an exact deny entry of an earlier policy, resolved by the gateway to deny its addresses (E8)
    expect(new Set(upstreamNames)).toEqual(
      new Set([
        'pkg.allowed.test',
        'other.allowed.test',
        'good.shared.test',
        'rebind.allowed.test',
        'forbidden.test',
      ]),
    );
  });

  it('T16 an unregistered source gets nothing on any port', async () => {
    const mark = hits.length;
    expect(await dnsQuery('pkg.allowed.test', 'A', STRANGER)).toBeNull();
    expect(await tlsGet('pkg.allowed.test', STRANGER)).toMatchObject({ ok: false });
    expect(await httpGet('pkg.allowed.test', STRANGER)).toMatchObject({ status: 0 });
    expect(denied('unregistered-source')).toBe(true);
    expect(since(mark)).toEqual([]);
  });

  it('T24 slowloris: a trickled hello hits the deadline; idle connections over the cap are refused while another sandbox is served', async () => {
    const hello = await captureHello('pkg.allowed.test');
    const s = netConnect({ host: '127.0.0.1', port: gw!.tlsPort, localAddress: A });
    s.on('error', () => {});
    const started = Date.now();
    const closed = onClose(s);
    let i = 0;
    const trickle = setInterval(() => {
      if (i < hello.length && !s.destroyed) s.write(hello.subarray(i, ++i));
    }, 50);
    await closed;
    clearInterval(trickle);
    const took = Date.now() - started;
    expect(took).toBeGreaterThanOrEqual(HANDSHAKE_MS - 50);
    expect(took).toBeLessThan(HANDSHAKE_MS + 1500);
    expect(i).toBeLessThan(hello.length);
    expect(denied('handshake-timeout')).toBe(true);

    // fill sandbox A's slots with idle connections; the next one is refused at once
    const idle: Socket[] = [];
    for (let n = 0; n < MAX_CONNS; n++) {
      const c = netConnect({ host: '127.0.0.1', port: gw!.tlsPort, localAddress: A });
      c.on('error', () => {});
      await once(c, 'connect');
      idle.push(c);
    }
    await sleep(50);
    const over = await rawExchange(gw!.tlsPort, hello, A, 1000);
    expect(over).toMatchObject({ closed: true, data: '' });
    expect(denied('connection-limit')).toBe(true);
    expect(await tlsGet('pkg.allowed.test', B)).toMatchObject({ ok: true }); // sandbox B unaffected
    // the deadline frees A's slots
    await Promise.all(idle.map((c) => (c.destroyed ? Promise.resolve() : onClose(c))));
    expect(await tlsGet('pkg.allowed.test', A)).toMatchObject({ ok: true });
  });

  it('T25 replacing the policy closes connections it no longer allows and keeps the rest', async () => {
    const open = async (sni: string): Promise<Socket> => {
      const s = tlsOpen(sni, A);
      s.on('error', () => {});
      await once(s, 'secureConnect');
      s.write(`GET /keep HTTP/1.1\r\nHost: ${sni}\r\n\r\n`);
      await once(s, 'data');
      return s;
    };
    const pkg = await open('pkg.allowed.test');
    const other = await open('other.allowed.test');
    const http = netConnect({ host: '127.0.0.1', port: gw!.httpPort, localAddress: A });
    http.on('error', () => {});
    await once(http, 'connect');
    http.write('GET /keep HTTP/1.1\r\nHost: pkg.allowed.test\r\n\r\n');
    await once(http, 'data');
    try {
      const pkgClosed = onClose(pkg);
      const httpClosed = onClose(http);
      const res = await control('PUT', `/v1/sandboxes/${A}`, {
        sandboxId: 'sbx-a',
        policy: { allow: ['other.allowed.test'] },
      });
      expect(res).toMatchObject({ status: 200, json: { replaced: true, closed: 2 } });
      await Promise.all([pkgClosed, httpClosed]);
      await sleep(100);
      expect(other.destroyed).toBe(false);
      other.write('GET /still HTTP/1.1\r\nHost: other.allowed.test\r\n\r\n');
      expect(String(((await once(other, 'data')) as Buffer[])[0])).toContain(
        'good https other.allowed.test /still',
      );
      expect(audit.some((l) => l.msg === 'egress close' && l.reason === 'policy-changed')).toBe(true);
    } finally {
      other.destroy();
      await control('PUT', `/v1/sandboxes/${A}`, { sandboxId: 'sbx-a', policy: POLICY });
    }
  });

  it('DELETE forgets a sandbox and closes its connections', async () => {
    expect(
      (await control('PUT', '/v1/sandboxes/127.0.0.4', { sandboxId: 'sbx-d', policy: POLICY })).status,
    ).toBe(200);
    const s = tlsOpen('pkg.allowed.test', '127.0.0.4');
    s.on('error', () => {});
    await once(s, 'secureConnect');
    const closed = onClose(s);
    expect((await control('DELETE', '/v1/sandboxes/127.0.0.4')).status).toBe(204);
    await closed;
    expect(await tlsGet('pkg.allowed.test', '127.0.0.4')).toMatchObject({ ok: false });
  });

  it('credential host: intercepted, the placeholder replaced by the real value upstream, other sandboxes refused', async () => {
    const placeholder = 'space_ph_abcdefghijklmnopqrstuvwxyz234567';
    const grant = {
      name: 'pkg-token',
      placeholder,
      domains: ['pkg.allowed.test'],
      header: 'authorization',
      format: 'Bearer {value}',
    };
    // the value lives in the state of record only; the gateway fetches it when the request needs it
    const redis = new Redis(inject('redisUrl'));
    await redis.hset(keys.credential('default', 'pkg-token'), {
      name: 'pkg-token',
      domains: '["pkg.allowed.test"]',
      header: 'authorization',
      format: 'Bearer {value}',
      value: 'real-secret-value-1',
    });
    await control('PUT', '/v1/sandboxes/127.0.0.5', {
      sandboxId: 'sbx-c',
      policy: POLICY,
      credentials: [grant],
    });
    const gatewayCa = await readFile(join(tmp, 'gw-ca.crt'));
    const get = (from: string, auth: string, trust: Buffer = gatewayCa): Promise<string> =>
      new Promise((resolve) => {
        const socket = netConnect({ host: '127.0.0.1', port: gw!.tlsPort, localAddress: from });
        socket.on('error', () => {});
        const s = tlsConnect({ socket, servername: 'pkg.allowed.test', ca: trust });
        let body = '';
        const timer = setTimeout(() => s.destroy(), 3000);
        s.on('secureConnect', () =>
          s.write(
            `GET /cred HTTP/1.1\r\nHost: pkg.allowed.test\r\nAuthorization: ${auth}\r\nConnection: close\r\n\r\n`,
          ),
        );
        s.on('data', (d: Buffer) => {
          body += d.toString();
        });
        s.on('error', () => {});
        s.on('close', () => {
          clearTimeout(timer);
          resolve(body);
        });
      });
    try {
      const mark = hits.length;
      const ok = await get('127.0.0.5', `Bearer ${placeholder}`);
      expect(ok).toContain('good https pkg.allowed.test /cred');
      expect(ok).not.toContain('real-secret-value-1');
      expect(
        since(mark)
          .filter((h) => h.kind === 'https')
          .map((h) => h.auth),
      ).toEqual(['Bearer real-secret-value-1']);
      // T20: sandbox A holds no grant; the same placeholder from A is spliced untouched, never replaced
      const mark2 = hits.length;
      expect(await get(A, `Bearer ${placeholder}`, ca)).toContain('good https');
      expect(
        since(mark2)
          .filter((h) => h.kind === 'https')
          .map((h) => h.auth),
      ).toEqual([`Bearer ${placeholder}`]);
      expect(JSON.stringify(audit)).not.toContain('real-secret-value-1');
    } finally {
      await control('DELETE', '/v1/sandboxes/127.0.0.5');
      await redis.del(keys.credential('default', 'pkg-token'));
      redis.disconnect();
    }
  });

  it('the forbidden servers received nothing during the whole run', () => {
    expect(forbiddenHits()).toEqual([]);
    expect(upstreams?.exitCode).toBeNull();
  });

  it('latency: direct vs through the gateway (median, same run; report only)', async () => {
    const direct = (sni: string): Promise<Outcome> =>
      new Promise((resolve) => {
        const s = tlsConnect({ host: ADDR.good, port: 443, servername: sni, ca });
        let body = '';
        s.on('secureConnect', () => s.write(`GET /x HTTP/1.1\r\nHost: ${sni}\r\nConnection: close\r\n\r\n`));
        s.on('data', (d: Buffer) => {
          body += d.toString();
        });
        s.on('error', (e) => resolve({ ok: false, error: e.message }));
        s.on('end', () => resolve({ ok: true, body }));
      });
    const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
    const directHttp = (): Promise<number> =>
      new Promise((resolve, reject) => {
        const req = httpRequest(
          { host: ADDR.good, port: 80, path: '/x', headers: { host: 'pkg.allowed.test' }, agent: false },
          (res) => {
            res.resume();
            res.on('end', () => resolve(res.statusCode ?? 0));
          },
        );
        req.on('error', reject);
        req.end();
      });
    const h = { direct: [] as number[], gateway: [] as number[] };
    for (let n = 0; n < 40; n++) {
      let t0 = performance.now();
      expect(await directHttp()).toBe(200);
      h.direct.push(performance.now() - t0);
      t0 = performance.now();
      expect(await httpGet('pkg.allowed.test')).toMatchObject({ status: 200 });
      h.gateway.push(performance.now() - t0);
    }
    console.log(
      `gateway latency (new HTTP connection + GET, n=40, median): ${JSON.stringify({ direct_ms: median(h.direct), gateway_ms: median(h.gateway), overhead_ms: median(h.gateway) - median(h.direct) })}`,
    );
    const t = { direct: [] as number[], gateway: [] as number[] };
    for (let n = 0; n < 40; n++) {
      let t0 = performance.now();
      expect(await direct('pkg.allowed.test')).toMatchObject({ ok: true });
      t.direct.push(performance.now() - t0);
      t0 = performance.now();
      expect(await tlsGet('pkg.allowed.test')).toMatchObject({ ok: true });
      t.gateway.push(performance.now() - t0);
    }
    const report = {
      direct_ms: median(t.direct),
      gateway_ms: median(t.gateway),
      overhead_ms: median(t.gateway) - median(t.direct),
    };
    console.log(`gateway latency (new TLS connection + GET, n=40, median): ${JSON.stringify(report)}`);
  });
});
