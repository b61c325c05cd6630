/**
 * Port requests through the router app (real Redis, real tokens) and the agent's tunnel handler
 * (agent/routes/ports.ts, on a loopback server standing in for the agent, its sandbox manager
 * reduced to one running sandbox whose address is loopback) to a loopback HTTP server standing in
 * for a server in the sandbox. The whole path with gVisor sandboxes and the E2B SDK is
 * `test/ports.int.test.ts`; here the gating, the edge's answers and the routing by host and by
 * header are checked without a sandbox.
 */
import { execFile } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { once } from 'node:events';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { createServer, type IncomingHttpHeaders, type Server } from 'node:http';
import { connect as http2Connect } from 'node:http2';
import { connect, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Duplex } from 'node:stream';
import { connect as tlsConnect } from 'node:tls';
import { promisify } from 'node:util';
import type { FastifyInstance } from 'fastify';
import { Redis } from 'ioredis';
import { Agent, request } from 'undici';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import type { AgentDeps } from '../agent/app.ts';
import { installPortTunnels } from '../agent/routes/ports.ts';
import { SpaceError } from '../core/errors.ts';
import { GUEST_PORT } from '../core/guest-protocol.ts';
import { createLogger } from '../core/log-fields.ts';
import { PORT_TUNNEL_PROTOCOL, portTargetOf, portTunnelPath } from '../core/ports.ts';
import { keys } from '../core/redis-keys.ts';
import { loadSigningKey, loadVerifyKey, mintSessionToken, writeNewKeyPair } from '../core/tokens.ts';
import { buildApp, createRouterDeps } from './app.ts';
import { loadRouterConfig } from './config.ts';
import { edgeAnswer, portRewrite } from './ports.ts';

const SB = 'sbxaaaaaaaaaaaaaaaaaaaa';
const PRIVATE = 'sbxbbbbbbbbbbbbbbbbbbbb';
const SESSION = 'ses_aaaaaaaaaaaaaaaaaaaa';
const TRAFFIC = 'c0ffee'.repeat(8);
const redis = new Redis(inject('redisUrl'), { db: 8 });

let dir: string;
let app: FastifyInstance;
let routerPort: number;
/** The same router with TLS (ALPN h2 + http/1.1) and the CA its clients trust. */
let tlsApp: FastifyInstance;
let tlsPort: number;
let ca: Buffer;
let agent: Server;
let agentUrl: string;
let agentTunnels: { closeAll(): void };
let sandboxServer: Server;
let serverPort: number;
/** Tunnels the stand-in agent was asked for. */
let tunnels = 0;
let portTokenOfSb: string | undefined;
/** What the server in the "sandbox" saw last. */
let lastHeaders: IncomingHttpHeaders = {};
const loopback = new Agent({
  connect: {
    lookup: (_h: string, o: { all?: boolean }, cb: (...a: unknown[]) => void) =>
      o.all ? cb(null, [{ address: '127.0.0.1', family: 4 }]) : cb(null, '127.0.0.1', 4),
  } as never,
});

/** GET (or `method`) through the router with Host `<port>-<id>.localhost`. */
async function viaHost(
  id: string,
  port: number | string,
  path: string,
  o: { headers?: object; method?: string; body?: Buffer } = {},
) {
  const res = await request(`http://${port}-${id}.localhost:${routerPort}${path}`, {
    dispatcher: loopback,
    method: (o.method ?? 'GET') as 'GET',
    headers: { ...o.headers },
    ...(o.body ? { body: o.body } : {}),
  });
  return { status: res.statusCode, headers: res.headers, text: await res.body.text() };
}

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'space-ports-'));
  await writeNewKeyPair(join(dir, 'key.pem'), join(dir, 'key.pub.pem'));
  const signingKey = await loadSigningKey(join(dir, 'key.pem'));
  const verifyKey = await loadVerifyKey(join(dir, 'key.pub.pem'));

  // the server "in the sandbox": echoes what it got; upgrades to a raw echo
  sandboxServer = createServer((req, res) => {
    lastHeaders = req.headers;
    const h = createHash('sha256');
    let n = 0;
    req.on('data', (c: Buffer) => {
      n += c.length;
      h.update(c);
    });
    req.on('end', () => {
      if (req.url === '/sse') {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.write('data: one\n\n');
        setImmediate(() => res.end('data: two\n\n'));
        return;
      }
      res.setHeader('content-type', 'text/plain');
      res.end(`${req.method} ${req.url} ${req.headers.host} ${n} ${h.digest('hex')}`);
    });
  });
  sandboxServer.on('upgrade', (req, socket: Duplex) => {
    lastHeaders = req.headers;
    socket.write('HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n');
    socket.on('data', (d: Buffer) => socket.write(Buffer.concat([Buffer.from('echo:'), d])));
  });
  sandboxServer.listen(0, '127.0.0.1');
  await once(sandboxServer, 'listening');
  serverPort = (sandboxServer.address() as { port: number }).port;

  // the agent: its real tunnel handler over a manager of one running sandbox on loopback
  const sb = { id: SB, sessionId: SESSION, guest: { endpoint: { host: '127.0.0.1', port: GUEST_PORT } } };
  const sandboxes = {
    find: (id: string) => (id === SB || id === PRIVATE ? sb : undefined),
    get: (id: string) => {
      if (id !== SB && id !== PRIVATE) throw new SpaceError('SANDBOX_NOT_FOUND', `no sandbox ${id}`);
      return { ...sb, id };
    },
    hibernated: async () => null,
    holdGuest: () => ({ sb, release: () => {} }),
    beginActivity: () => () => {},
  };
  agent = createServer((_req, res) => res.end('not a tunnel'));
  agent.on('upgrade', () => {
    tunnels += 1;
  });
  agentTunnels = installPortTunnels(agent, {
    verifyKey,
    sandboxes,
    log: createLogger('agent', 'silent'),
  } as unknown as AgentDeps);
  agent.listen(0, '127.0.0.1');
  await once(agent, 'listening');
  agentUrl = `http://127.0.0.1:${(agent.address() as { port: number }).port}`;

  await redis.flushdb();
  portTokenOfSb = undefined;
  await redis.hset(keys.node('n1'), { id: 'n1', url: agentUrl });
  await redis.set(keys.nodeAlive('n1'), '1', 'PX', 600_000);
  for (const id of [SB, PRIVATE]) {
    const { token } = await mintSessionToken(signingKey, {
      sandboxId: id,
      sessionId: SESSION,
      team: 'default',
      scopes: ['ports'],
      ttlSec: 600,
    });
    if (id === SB) portTokenOfSb = token;
    await redis.hset(keys.sandbox(id), {
      id,
      state: 'running',
      nodeId: 'n1',
      sessionId: SESSION,
      team: 'default',
      portToken: token,
      ...(id === PRIVATE ? { trafficToken: TRAFFIC } : {}),
    });
  }

  const deps = createRouterDeps({
    config: loadRouterConfig({ SPACE_VERIFY_KEY_FILE: join(dir, 'key.pub.pem'), SPACE_ROUTER_PORT: '0' }),
    log: createLogger('router', 'silent'),
    redis,
    verifyKey,
  });
  app = await buildApp(deps);
  await app.listen({ host: '127.0.0.1', port: 0 });
  routerPort = (app.server.address() as { port: number }).port;

  const cert = join(dir, 'router.crt');
  const key = join(dir, 'router.key');
  await promisify(execFile)('openssl', [
    'req',
    '-x509',
    '-newkey',
    'ed25519',
    '-nodes',
    '-days',
    '1',
    '-subj',
    '/CN=router.test',
    '-addext',
    'subjectAltName=IP:127.0.0.1',
    '-keyout',
    key,
    '-out',
    cert,
  ]);
  ca = await readFile(cert);
  tlsApp = await buildApp(
    createRouterDeps({
      config: loadRouterConfig({ SPACE_VERIFY_KEY_FILE: join(dir, 'key.pub.pem'), SPACE_ROUTER_PORT: '0' }),
      log: createLogger('router', 'silent'),
      redis,
      verifyKey,
      tls: { cert: ca, key: await readFile(key) },
    }),
  );
  await tlsApp.listen({ host: '127.0.0.1', port: 0 });
  tlsPort = (tlsApp.server.address() as { port: number }).port;
});
afterAll(async () => {
  await app?.close();
  await tlsApp?.close();
  agentTunnels?.closeAll();
  await loopback.close();
  for (const s of [agent, sandboxServer]) {
    s?.closeAllConnections();
    s?.close();
  }
  redis.disconnect();
  await rm(dir, { recursive: true, force: true });
});

describe('port requests: what names them (pure)', () => {
  it('reads the host form first, then E2B’s routing headers; envd’s port is not rewritten', () => {
    expect(portTargetOf({ host: `8000-${SB}.localhost:8082` })).toEqual({
      sandboxId: SB,
      port: 8000,
      by: 'host',
    });
    expect(portTargetOf({ host: `70000-${SB}.e2b.example` })).toEqual({ malformed: 'port', sandboxId: SB });
    expect(portTargetOf({ 'e2b-sandbox-id': SB, 'e2b-sandbox-port': '49999', host: '127.0.0.1:1' })).toEqual({
      sandboxId: SB,
      port: 49999,
      by: 'header',
    });
    // an id alone is envd's header mode; the router's own host names nothing
    expect(portTargetOf({ 'e2b-sandbox-id': SB, host: 'router.example' })).toBeUndefined();
    expect(portTargetOf({ host: 'router.example:8082' })).toBeUndefined();
    expect(portRewrite({ url: '/a?b=1', headers: { host: `3000-${SB}.x.test` } })).toBe(
      `/_port/${SB}/3000/a?b=1`,
    );
    expect(portRewrite({ url: '/health', headers: { host: `49983-${SB}.x.test` } })).toBe('/health');
    expect(
      portRewrite({ url: '/health', headers: { 'e2b-sandbox-id': SB, 'e2b-sandbox-port': '49983' } }),
    ).toBe('/health');
  });

  it('answers E2B’s edge bodies', () => {
    expect(JSON.parse(edgeAnswer('not-found', SB).body)).toEqual({
      sandboxId: SB,
      message: 'The sandbox was not found',
      code: 502,
    });
    expect(edgeAnswer('invalid-port', SB)).toEqual({
      status: 400,
      type: 'text/plain; charset=utf-8',
      body: 'Invalid sandbox port',
    });
  });
});

describe('port requests through the router and an agent tunnel', () => {
  it('forwards by host: method, path, query, Host and a body both ways; the routing and token headers stay here', async () => {
    const body = randomBytes(4 * 1024 * 1024);
    const res = await viaHost(SB, serverPort, '/up?x=1', {
      method: 'POST',
      body,
      headers: { 'content-type': 'application/octet-stream', 'e2b-traffic-access-token': 'irrelevant' },
    });
    expect(res.status).toBe(200);
    expect(res.text).toBe(
      `POST /up?x=1 ${serverPort}-${SB}.localhost:${routerPort} ${body.length} ${createHash('sha256').update(body).digest('hex')}`,
    );
    expect(lastHeaders['e2b-traffic-access-token']).toBeUndefined();
    expect(lastHeaders['x-forwarded-proto']).toBe('http');
    // counted under the route label `port`, as data-plane requests are by theirs
    const metrics = await (await request(`http://127.0.0.1:${routerPort}/metrics`)).body.text();
    expect(metrics).toMatch(/space_router_requests_total\{route="port",status="200"\} [1-9]/);
  });

  it('streams an event stream as it comes', async () => {
    const res = await viaHost(SB, serverPort, '/sse');
    expect(res.headers['content-type']).toBe('text/event-stream');
    expect(res.text).toBe('data: one\n\ndata: two\n\n');
  });

  it('routes by E2b-Sandbox-Id + E2b-Sandbox-Port on the router’s address, /health included', async () => {
    const res = await request(`http://127.0.0.1:${routerPort}/health`, {
      headers: { 'e2b-sandbox-id': SB, 'e2b-sandbox-port': String(serverPort) },
    });
    expect(res.statusCode).toBe(200);
    expect(await res.body.text()).toMatch(/^GET \/health /);
  });

  it('answers E2B’s bodies for a closed port, an unknown sandbox, a malformed port and the internal path', async () => {
    const closed = await viaHost(SB, 1, '/');
    expect(closed.status).toBe(502);
    expect(JSON.parse(closed.text)).toEqual({
      sandboxId: SB,
      message: 'The sandbox is running but port is not open',
      port: 1,
      code: 502,
    });
    const unknown = await viaHost('sbxcccccccccccccccccccc', serverPort, '/');
    expect(unknown.status).toBe(502);
    expect(JSON.parse(unknown.text).message).toBe('The sandbox was not found');
    expect(await viaHost(SB, 70000, '/')).toMatchObject({ status: 400, text: 'Invalid sandbox port' });
    const direct = await request(`http://127.0.0.1:${routerPort}/_port/${SB}/${serverPort}/`);
    expect(direct.statusCode).toBe(404);
    await direct.body.dump();
  });

  it('gates a private sandbox before any tunnel opens: no token, a wrong one → 403; its token → served', async () => {
    const before = tunnels;
    const none = await viaHost(PRIVATE, serverPort, '/p');
    expect(none.status).toBe(403);
    expect(JSON.parse(none.text)).toEqual({
      sandboxId: PRIVATE,
      message:
        "Sandbox is secured with traffic access token. Token header 'e2b-traffic-access-token' is missing",
      code: 403,
    });
    const wrong = await viaHost(PRIVATE, serverPort, '/p', { headers: { 'e2b-traffic-access-token': 'x' } });
    expect(wrong.status).toBe(403);
    expect(JSON.parse(wrong.text).message).toMatch(/is invalid$/);
    expect(tunnels).toBe(before);
    const ok = await viaHost(PRIVATE, serverPort, '/p', { headers: { 'E2B-Traffic-Access-Token': TRAFFIC } });
    expect(ok.status).toBe(200);
    expect(tunnels).toBe(before + 1);
  });

  it('splices an HTTP/1.1 upgrade (WebSocket) to the server and back', async () => {
    const socket: Socket = connect(routerPort, '127.0.0.1');
    await once(socket, 'connect');
    socket.write(
      `GET /ws HTTP/1.1\r\nHost: ${serverPort}-${SB}.localhost\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n`,
    );
    let got = '';
    socket.on('data', (d: Buffer) => {
      got += d.toString();
      if (got.includes('\r\n\r\n') && !got.includes('echo:')) socket.write('ping');
    });
    for (let i = 0; i < 100 && !got.includes('echo:ping'); i++) await new Promise((r) => setTimeout(r, 20));
    socket.destroy();
    expect(got).toMatch(/^HTTP\/1\.1 101 /);
    expect(got).toContain('echo:ping');
    expect(lastHeaders.upgrade).toBe('echo');
  });

  it('with TLS: serves an HTTP/2 client (ALPN h2) by :authority, and an HTTP/1.1 upgrade on the same port', async () => {
    const session = http2Connect(`https://127.0.0.1:${tlsPort}`, { ca });
    try {
      const req = session.request({ ':path': '/h2?x=1', ':authority': `${serverPort}-${SB}.localhost` });
      let text = '';
      req.on('data', (d: Buffer) => {
        text += d.toString();
      });
      const [headers] = (await once(req, 'response')) as [Record<string, unknown>];
      await once(req, 'end');
      expect(session.alpnProtocol).toBe('h2');
      expect(headers[':status']).toBe(200);
      expect(text).toMatch(new RegExp(`^GET /h2\\?x=1 ${serverPort}-${SB}\\.localhost 0 `));
    } finally {
      session.close();
    }
    const socket = tlsConnect({ host: '127.0.0.1', port: tlsPort, ca, ALPNProtocols: ['http/1.1'] });
    await once(socket, 'secureConnect');
    socket.write(
      `GET /ws HTTP/1.1\r\nHost: ${serverPort}-${SB}.localhost\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n`,
    );
    let got = '';
    socket.on('data', (d: Buffer) => {
      got += d.toString();
      if (got.includes('\r\n\r\n') && !got.includes('echo:')) socket.write('tls');
    });
    for (let i = 0; i < 100 && !got.includes('echo:tls'); i++) await new Promise((r) => setTimeout(r, 20));
    socket.destroy();
    expect(got).toMatch(/^HTTP\/1\.1 101 /);
    expect(got).toContain('echo:tls');
  });

  it('the agent never tunnels to its guest daemon’s port, nor without a port token', async () => {
    /** A tunnel request straight to the agent (raw: HTTP clients refuse to send Upgrade themselves). */
    const ask = async (port: number, token?: string) => {
      const socket = connect(Number(new URL(agentUrl).port), '127.0.0.1');
      await once(socket, 'connect');
      socket.write(
        `GET ${portTunnelPath(SB, port)} HTTP/1.1\r\nHost: agent\r\nConnection: Upgrade\r\nUpgrade: ${PORT_TUNNEL_PROTOCOL}\r\n` +
          `${token ? `Authorization: Bearer ${token}\r\n` : ''}\r\n`,
      );
      let text = '';
      for await (const chunk of socket) text += String(chunk);
      const status = Number(/^HTTP\/1\.1 (\d+)/.exec(text)?.[1]);
      const code = (JSON.parse(text.slice(text.indexOf('\r\n\r\n') + 4)) as { error: { code: string } }).error
        .code;
      return { status, code };
    };
    expect(await ask(GUEST_PORT, portTokenOfSb)).toEqual({ status: 400, code: 'BAD_REQUEST' });
    expect(await ask(serverPort)).toEqual({ status: 401, code: 'UNAUTHENTICATED' });
  });

  it('a paused sandbox created with autoResume off stays paused: its ports answer E2B’s 502 not found', async () => {
    await redis.hset(keys.sandbox(SB), { state: 'paused', autoResume: '0' });
    try {
      const res = await viaHost(SB, serverPort, '/');
      expect(res.status).toBe(502);
      expect(JSON.parse(res.text)).toMatchObject({ sandboxId: SB, message: 'The sandbox was not found' });
      expect(await redis.hget(keys.sandbox(SB), 'state')).toBe('paused');
      expect(await redis.xlen(keys.operationQueue())).toBe(0);
    } finally {
      await redis.hset(keys.sandbox(SB), { state: 'running', autoResume: '1' });
    }
  });

  it('answers a paused sandbox’s envd /health 502 (not running), a running one’s 204', async () => {
    const health = async () =>
      (await request(`http://127.0.0.1:${routerPort}/health`, { headers: { 'e2b-sandbox-id': SB } }))
        .statusCode;
    expect(await health()).toBe(204);
    for (const state of ['pausing', 'paused', 'resuming']) {
      await redis.hset(keys.sandbox(SB), 'state', state);
      expect(await health()).toBe(502);
    }
    await redis.hset(keys.sandbox(SB), 'state', 'running');
  });
});
