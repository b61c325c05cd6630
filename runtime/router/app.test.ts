/**
 * The router app against a real Redis and real tokens, forwarding to a loopback HTTP server that
 * stands in for an agent and records what reaches it (the whole stack with a real agent is in
 * `test/router.int.test.ts`; here the agent's answers can be chosen: a SANDBOX_PAUSED race,
 * a refused connection, headers a real agent never sends).
 */
import { once } from 'node:events';
import { mkdtemp, rm } from 'node:fs/promises';
import {
  createServer,
  request as httpRequest,
  type IncomingHttpHeaders,
  type Server,
  type ServerResponse,
} from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { Redis } from 'ioredis';
import { request } from 'undici';
import { afterAll, beforeAll, beforeEach, describe, expect, inject, it } from 'vitest';
import { createLogger } from '../core/log-fields.ts';
import { keys } from '../core/redis-keys.ts';
import {
  loadSigningKey,
  loadVerifyKey,
  mintSessionToken,
  type SigningKey,
  writeNewKeyPair,
} from '../core/tokens.ts';
import { buildApp, createRouterDeps, type RouterDeps } from './app.ts';
import { loadRouterConfig } from './config.ts';

const SB = 'sbx_aaaaaaaaaaaaaaaaaaaa';
const OTHER = 'sbx_bbbbbbbbbbbbbbbbbbbb';
const SESSION = 'ses_aaaaaaaaaaaaaaaaaaaa';
const redis = new Redis(inject('redisUrl'), { db: 9 });

/** What the stand-in agent saw and how it answers. */
interface Seen {
  method: string;
  url: string;
  headers: IncomingHttpHeaders;
  body: string;
}
let seen: Seen[] = [];
let answer: (req: Seen, res: ServerResponse) => void = (_r, res) => res.end('ok');
let upstream: Server;
let upstreamUrl: string;
let dir: string;
let signingKey: SigningKey;
let routerUrl: string;
let deps: RouterDeps;
let logText = '';
let close: () => Promise<void>;

const token = (over: { sandboxId?: string; scopes?: ('commands' | 'files')[]; ttlSec?: number } = {}) =>
  mintSessionToken(signingKey, {
    team: 'default',
    sandboxId: over.sandboxId ?? SB,
    sessionId: SESSION,
    scopes: over.scopes ?? ['commands', 'files'],
    ttlSec: over.ttlSec ?? 60,
  }).then((t) => t.token);

async function call(
  path: string,
  opts: { token?: string; method?: string; body?: string; headers?: object } = {},
) {
  const res = await request(`${routerUrl}${path}`, {
    method: (opts.method ?? 'GET') as 'GET',
    headers: { ...(opts.token ? { authorization: `Bearer ${opts.token}` } : {}), ...opts.headers },
    body: opts.body,
  });
  const text = await res.body.text();
  return { status: res.statusCode, headers: res.headers, text, code: codeOf(text) };
}
function codeOf(text: string): string | undefined {
  try {
    return (JSON.parse(text) as { error?: { code?: string } }).error?.code;
  } catch {
    return undefined;
  }
}

async function placeSandbox(id: string, state: string, nodeId = 'n1') {
  await redis.hset(keys.sandbox(id), { id, state, nodeId, sessionId: SESSION });
}
async function registerNode(nodeId: string, url: string, alive = true) {
  await redis.hset(keys.node(nodeId), { id: nodeId, url });
  if (alive) await redis.set(keys.nodeAlive(nodeId), '1', 'PX', 60_000);
  else await redis.del(keys.nodeAlive(nodeId));
}

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'space-router-'));
  await writeNewKeyPair(join(dir, 'key.pem'), join(dir, 'key.pub.pem'));
  signingKey = await loadSigningKey(join(dir, 'key.pem'));
  upstream = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const s = {
        method: req.method ?? '',
        url: req.url ?? '',
        headers: req.headers,
        body: Buffer.concat(chunks).toString(),
      };
      seen.push(s);
      answer(s, res);
    });
  });
  upstream.listen(0, '127.0.0.1');
  await once(upstream, 'listening');
  upstreamUrl = `http://127.0.0.1:${(upstream.address() as { port: number }).port}`;

  const config = loadRouterConfig({
    SPACE_VERIFY_KEY_FILE: join(dir, 'key.pub.pem'),
    SPACE_ROUTER_PORT: '0',
    SPACE_ROUTER_CONNECT_TIMEOUT_MS: '1000',
  });
  // a real logger writing into a string, with the services' redaction, to check what logs hold
  const sink = new Writable({
    write(chunk, _enc, cb) {
      logText += chunk.toString();
      cb();
    },
  });
  deps = createRouterDeps({
    config,
    log: createLogger('router', 'info', {}, sink),
    redis,
    verifyKey: await loadVerifyKey(join(dir, 'key.pub.pem')),
  });
  const app = await buildApp(deps);
  await app.listen({ host: '127.0.0.1', port: 0 });
  routerUrl = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`;
  close = async () => {
    await app.close();
    await deps.proxy.dispatcher.destroy();
  };
});
afterAll(async () => {
  await close?.();
  upstream?.close();
  upstream?.closeAllConnections();
  redis.disconnect();
  await rm(dir, { recursive: true, force: true });
});
beforeEach(async () => {
  await redis.flushdb();
  seen = [];
  answer = (_r, res) => res.end('ok');
  await placeSandbox(SB, 'running');
  await placeSandbox(OTHER, 'running');
  await registerNode('n1', upstreamUrl);
});

describe('router: tokens are checked before anything is forwarded', () => {
  it('refuses missing, malformed, expired, other-sandbox and wrong-scope tokens; forwards a good one', async () => {
    const path = `/v1/sandboxes/${SB}/commands/cmd_aaaaaaaaaaaa/events`;
    expect((await call(path)).code).toBe('UNAUTHENTICATED');
    expect((await call(path, { token: 'not.a.token' })).code).toBe('TOKEN_INVALID');
    expect((await call(path, { token: await token({ ttlSec: -5 }) })).code).toBe('TOKEN_EXPIRED');
    const other = await call(path, { token: await token({ sandboxId: OTHER }) });
    expect([other.status, other.code]).toEqual([403, 'TOKEN_SCOPE']);
    expect((await call(path, { token: await token({ scopes: ['files'] }) })).code).toBe('TOKEN_SCOPE');
    // another key pair's token: badly signed
    await writeNewKeyPair(join(dir, 'other.pem'), join(dir, 'other.pub.pem'));
    const foreign = await mintSessionToken(await loadSigningKey(join(dir, 'other.pem')), {
      team: 'default',
      sandboxId: SB,
      sessionId: SESSION,
      scopes: ['commands'],
      ttlSec: 60,
    });
    expect((await call(path, { token: foreign.token })).code).toBe('TOKEN_INVALID');
    expect(seen).toEqual([]);

    const good = await call(path, { token: await token() });
    expect([good.status, good.text]).toEqual([200, 'ok']);
    const viaQuery = await call(`${path}?token=${await token()}&lastEventId=0`);
    expect(viaQuery.status).toBe(200);
    expect(seen.map((s) => s.url.split('?')[0])).toEqual([path, path]);
    // the query (token included) reaches the agent unchanged: it checks the session itself
    expect(seen[1]?.url).toContain('lastEventId=0');
  });

  it('answers NOT_FOUND for anything but the data-plane routes (the agent’s internal routes stay private)', async () => {
    const t = await token();
    expect((await call(`/internal/v1/sandboxes/${SB}`, { token: t, method: 'DELETE' })).code).toBe(
      'NOT_FOUND',
    );
    expect((await call(`/v1/sandboxes/${SB}/commands`, { token: t, method: 'POST', body: '{}' })).code).toBe(
      'NOT_FOUND',
    );
    expect(seen).toEqual([]);
  });
});

describe('router: lookups and failures are coded', () => {
  it('unknown sandbox → SANDBOX_NOT_FOUND; node not heartbeating or refusing → NODE_UNAVAILABLE', async () => {
    const path = (id: string) => `/v1/sandboxes/${id}/fs/stat?path=/`;
    const unknown = 'sbx_cccccccccccccccccccc';
    const r1 = await call(path(unknown), { token: await token({ sandboxId: unknown }) });
    expect([r1.status, r1.code]).toEqual([404, 'SANDBOX_NOT_FOUND']);

    await registerNode('n1', upstreamUrl, false);
    const r2 = await call(path(SB), { token: await token() });
    expect([r2.status, r2.code]).toEqual([503, 'NODE_UNAVAILABLE']);
    expect(JSON.parse(r2.text).error.details).toMatchObject({ nodeId: 'n1', sandboxId: SB });

    // alive in Redis, but nothing listens at its URL (the agent died since its last heartbeat)
    const dead = createServer();
    dead.listen(0, '127.0.0.1');
    await once(dead, 'listening');
    const deadUrl = `http://127.0.0.1:${(dead.address() as { port: number }).port}`;
    dead.close();
    await once(dead, 'close');
    await registerNode('n1', deadUrl);
    const r3 = await call(path(SB), { token: await token() });
    expect([r3.status, r3.code]).toEqual([503, 'NODE_UNAVAILABLE']);
    expect(seen).toEqual([]);
  });

  it('a sandbox that is ending is SANDBOX_NOT_RUNNING, without a forward', async () => {
    await placeSandbox(SB, 'killed');
    const r = await call(`/v1/sandboxes/${SB}/fs/list?path=/`, { token: await token() });
    expect([r.status, r.code]).toEqual([409, 'SANDBOX_NOT_RUNNING']);
    expect(seen).toEqual([]);
  });
});

describe('router: SANDBOX_PAUSED from the agent (paused between lookup and forward)', () => {
  const paused = (res: ServerResponse) =>
    res
      .writeHead(409, { 'content-type': 'application/json' })
      .end(JSON.stringify({ error: { code: 'SANDBOX_PAUSED', message: 'paused' } }));

  it('retries a bodiless request once after the sandbox runs again', async () => {
    answer = (_r, res) => (seen.length === 1 ? paused(res) : res.end('listed'));
    const before = await deps.metrics.resumes.get();
    const r = await call(`/v1/sandboxes/${SB}/fs/list?path=/`, { token: await token() });
    expect([r.status, r.text]).toEqual([200, 'listed']);
    expect(seen).toHaveLength(2);
    const after = await deps.metrics.resumes.get();
    const count = (m: typeof after) => m.values.find((v) => v.labels.outcome === 'resumed')?.value ?? 0;
    expect(count(after) - count(before)).toBe(1);
  });

  it('passes the 409 through for a request with a body (it cannot be replayed) and after one retry', async () => {
    answer = (_r, res) => paused(res);
    const put = await call(`/v1/sandboxes/${SB}/files?path=/tmp/x`, {
      token: await token(),
      method: 'PUT',
      body: 'data',
      headers: { 'content-type': 'application/octet-stream' },
    });
    expect([put.status, put.code]).toEqual([409, 'SANDBOX_PAUSED']);
    expect(seen).toHaveLength(1);
    expect(seen[0]?.body).toBe('data');
    seen = [];
    const get = await call(`/v1/sandboxes/${SB}/fs/list?path=/`, { token: await token() });
    expect([get.status, get.code]).toEqual([409, 'SANDBOX_PAUSED']);
    expect(seen).toHaveLength(2);
  });

  it('an agent 409 with another code passes through untouched, once', async () => {
    answer = (_r, res) =>
      res
        .writeHead(409, { 'content-type': 'application/json' })
        .end(JSON.stringify({ error: { code: 'PROCESS_EXITED', message: 'gone' } }));
    const r = await call(`/v1/sandboxes/${SB}/commands/cmd_aaaaaaaaaaaa/stdin/close`, {
      token: await token(),
      method: 'POST',
    });
    expect([r.status, r.code]).toEqual([409, 'PROCESS_EXITED']);
    expect(seen).toHaveLength(1);
  });
});

describe('router: headers, logs, streaming', () => {
  it('keeps hop-by-hop headers on their hop, sets X-Forwarded-*, and redacts ?token= from logs', async () => {
    answer = (_r, res) =>
      res.writeHead(200, { connection: 'x-agent-hop', 'x-agent-hop': '1', 'x-end': 'e' }).end('ok');
    const t = await token();
    // node:http sends the Connection header as given (undici's client keeps it to itself)
    const r = await new Promise<{ status: number; headers: IncomingHttpHeaders }>((resolve, reject) => {
      const req = httpRequest(`${routerUrl}/v1/sandboxes/${SB}/fs/stat?path=/&token=${t}`, {
        headers: { connection: 'x-client-hop', 'x-client-hop': '1', te: 'trailers', 'x-end-to-end': 'yes' },
      });
      req.on('response', (res) => {
        res.resume();
        res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers }));
      });
      req.on('error', reject);
      req.end();
    });
    expect(r.status).toBe(200);
    expect(r.headers['x-agent-hop']).toBeUndefined();
    expect(r.headers['x-end']).toBe('e');
    const h = seen[0]!.headers;
    expect(h['x-client-hop']).toBeUndefined();
    expect(h['te']).toBeUndefined();
    expect(h['x-end-to-end']).toBe('yes');
    expect(h['x-forwarded-for']).toBe('127.0.0.1');
    expect(h['x-forwarded-proto']).toBe('http');
    expect(h['x-forwarded-host']).toBe(new URL(routerUrl).host);
    expect(h.host).toBe(new URL(upstreamUrl).host);
    expect(logText).toContain('token=[redacted]');
    expect(logText).not.toContain(t);
  });

  it('flushes each SSE event as the agent sends it (the next one waits for the client to see it)', async () => {
    let clientSaw!: () => void;
    const saw = new Promise<void>((r) => {
      clientSaw = r;
    });
    answer = (_r, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write('id: 1\nevent: stdout\ndata: {}\n\n');
      // the agent sends the second event only once the client has the first through the router:
      // a router that buffers would never deliver it, and this test would time out
      void saw.then(() => res.end('id: 2\nevent: exit\ndata: {}\n\n'));
    };
    const res = await request(`${routerUrl}/v1/sandboxes/${SB}/commands/cmd_aaaaaaaaaaaa/events`, {
      headers: { authorization: `Bearer ${await token()}` },
    });
    expect(res.headers['content-type']).toBe('text/event-stream');
    let text = '';
    for await (const chunk of res.body) {
      text += chunk.toString();
      if (text.includes('id: 1\n')) clientSaw();
    }
    expect(text).toBe('id: 1\nevent: stdout\ndata: {}\n\nid: 2\nevent: exit\ndata: {}\n\n');
  });
});
