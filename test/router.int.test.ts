/**
 * The router in front of a real stack (API, agent, gVisor sandboxes, Redis): the API hands out
 * router URLs (SPACE_ROUTER_URL), and every data-plane byte here goes through a router process.
 */
import { execFile } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { once } from 'node:events';
import { readFile } from 'node:fs/promises';
import { createServer } from 'node:http';
import { connect as http2Connect } from 'node:http2';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { promisify } from 'node:util';
import { createParser } from 'eventsource-parser';
import { Agent, Client, request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { keys } from '../runtime/core/redis-keys.ts';
import { loadSigningKey, mintSessionToken } from '../runtime/core/tokens.ts';
import { freePort } from './redis-server.ts';
import { metricValue, type RouterProcess, startRouterProcess } from './router-process.ts';
import { collect, leftovers, NO_LEFTOVERS, readEvents, type Stack, startStack, waitFor } from './stack.ts';

const run = promisify(execFile);
const MiB = 1024 * 1024;

interface Started {
  command: { id: string };
  stream: { url: string; token: string };
}

let s: Stack;
let router: RouterProcess;
let id: string;

beforeAll(async () => {
  const port = await freePort();
  s = await startStack({
    SPACE_ROUTER_URL: `http://127.0.0.1:${port}`,
    // the 200-stream case reads one sandbox's commands 200 times at once
    SPACE_MAX_STREAMS: '256',
  });
  router = await startRouterProcess({
    SPACE_ROUTER_PORT: String(port),
    SPACE_REDIS_URL: s.redisUrl,
    SPACE_VERIFY_KEY_FILE: join(s.dir, 'key.pub.pem'),
  });
  id = await s.createSandbox();
});
afterAll(async () => {
  await router?.stop();
  if (!s) return;
  await s.stop();
  expect(await leftovers(s)).toEqual(NO_LEFTOVERS);
});

async function start(body: Record<string, unknown>, sandbox = id): Promise<Started> {
  const res = await s.call<Started>('POST', `/v1/sandboxes/${sandbox}/commands`, body);
  if (res.status !== 201) throw new Error(`exec: ${res.status} ${JSON.stringify(res.body)}`);
  return res.body;
}

describe('router: commands, stdin and files through the router', () => {
  it('streams a command’s output; a dropped stream resumes with Last-Event-ID and loses nothing', async () => {
    const c = await start({ cmd: 'sh', args: ['-c', 'for i in $(seq 1 300); do echo line $i; done'] });
    expect(c.stream.url.startsWith(`${router.url}/v1/sandboxes/${id}/`)).toBe(true);
    const first = await readEvents(c.stream.url, c.stream.token, { stopAfter: 3 });
    const lastId = first.at(-1)!.id;
    const rest = await readEvents(c.stream.url, c.stream.token, { lastEventId: lastId });
    const whole = collect([...first, ...rest]);
    const expected = Array.from({ length: 300 }, (_, i) => `line ${i + 1}\n`).join('');
    expect(whole.stdout.toString()).toBe(expected);
    expect(whole.exit.exitCode).toBe(0);
    // ids only grow across the reconnect: nothing repeated
    const ids = [...first, ...rest].map((e) => Number(e.id));
    expect(ids).toEqual([...ids].sort((a, b) => a - b));
    expect(new Set(ids).size).toBe(ids.length);
  });

  it('carries stdin up and files both ways (a 6 MiB upload streamed in chunks)', async () => {
    const c = await start({ cmd: 'cat', stdin: true });
    const events = readEvents(c.stream.url, c.stream.token);
    const base = `${router.url}/v1/sandboxes/${id}/commands/${c.command.id}`;
    const auth = { authorization: `Bearer ${c.stream.token}` };
    const w = await request(`${base}/stdin`, {
      method: 'POST',
      headers: { ...auth, 'content-type': 'application/octet-stream' },
      body: 'through the router\n',
    });
    expect(w.statusCode).toBe(204);
    await w.body.dump();
    const close = await request(`${base}/stdin/close`, { method: 'POST', headers: auth });
    expect(close.statusCode).toBe(204);
    await close.body.dump();
    const out = collect(await events);
    expect(out.stdout.toString()).toBe('through the router\n');

    const { url, token } = await s.token(id, ['files']);
    expect(url.startsWith(router.url)).toBe(true);
    const data = randomBytes(6 * MiB);
    const chunks = Array.from({ length: 96 }, (_, i) => data.subarray(i * 64 * 1024, (i + 1) * 64 * 1024));
    const put = await request(`${url}/files?path=${encodeURIComponent('/home/user/big.bin')}`, {
      method: 'PUT',
      headers: { authorization: `Bearer ${token}`, 'content-type': 'application/octet-stream' },
      body: Readable.from(chunks), // no Content-Length: chunked all the way
    });
    expect(put.statusCode).toBe(200);
    await put.body.dump();
    const get = await request(`${url}/files?path=${encodeURIComponent('/home/user/big.bin')}&token=${token}`);
    expect(get.statusCode).toBe(200);
    expect(get.headers['content-length']).toBe(String(data.length));
    const hash = createHash('sha256');
    for await (const chunk of get.body) hash.update(chunk as Buffer);
    expect(hash.digest('hex')).toBe(createHash('sha256').update(data).digest('hex'));
    const list = await request(`${url}/fs/list?path=/home/user`, {
      headers: { authorization: `Bearer ${token}` },
    });
    expect(JSON.stringify(await list.body.json())).toContain('big.bin');
  });
});

describe('router: HTTP/2', () => {
  let tlsRouter: RouterProcess;
  let ca: Buffer;
  beforeAll(async () => {
    const cert = join(s.dir, 'router.crt');
    const key = join(s.dir, 'router.key');
    await run('openssl', [
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
    tlsRouter = await startRouterProcess(
      {
        SPACE_ROUTER_PORT: String(await freePort()),
        SPACE_REDIS_URL: s.redisUrl,
        SPACE_VERIFY_KEY_FILE: join(s.dir, 'key.pub.pem'),
        SPACE_ROUTER_TLS_CERT_FILE: cert,
        SPACE_ROUTER_TLS_KEY_FILE: key,
      },
      ca,
    );
  });
  afterAll(async () => {
    await tlsRouter?.stop();
  });

  it('serves an HTTP/2 client (ALPN h2): an event stream, an upload without Content-Length, an envd upload', async () => {
    const c = await start({ cmd: 'sh', args: ['-c', 'echo over h2; echo err >&2'] });
    const session = http2Connect(tlsRouter.url, { ca });
    try {
      await once(session, 'connect');
      expect(session.alpnProtocol).toBe('h2');
      const get = (path: string, headers: Record<string, string> = {}) =>
        new Promise<{ status: number; body: Buffer }>((resolve, reject) => {
          const req = session.request({
            ':path': path,
            authorization: `Bearer ${c.stream.token}`,
            ...headers,
          });
          let status = 0;
          const parts: Buffer[] = [];
          req.on('response', (h) => {
            status = Number(h[':status']);
          });
          req.on('data', (d: Buffer) => parts.push(d));
          req.on('end', () => resolve({ status, body: Buffer.concat(parts) }));
          req.on('error', reject);
        });
      const path = new URL(c.stream.url).pathname;
      const events = await get(path);
      expect(events.status).toBe(200);
      const parsed: { event: string; id: string; data: string }[] = [];
      const parser = createParser({
        onEvent: (e) => parsed.push({ event: e.event ?? 'message', id: e.id ?? '', data: e.data }),
      });
      parser.feed(events.body.toString());
      const out = collect(parsed);
      expect(out.stdout.toString()).toBe('over h2\n');
      expect(out.stderr.toString()).toBe('err\n');

      const files = await s.token(id, ['files']);
      const upload = randomBytes(256 * 1024);
      const put = await new Promise<number>((resolve, reject) => {
        const req = session.request({
          ':method': 'PUT',
          ':path': `/v1/sandboxes/${id}/files?path=${encodeURIComponent('/home/user/h2.bin')}`,
          authorization: `Bearer ${files.token}`,
          'content-type': 'application/octet-stream',
        });
        req.on('response', (h) => resolve(Number(h[':status'])));
        req.on('error', reject);
        req.write(upload.subarray(0, 100_000));
        setImmediate(() => req.end(upload.subarray(100_000)));
        req.resume();
      });
      expect(put).toBe(200);
      const back = await new Promise<Buffer>((resolve, reject) => {
        const req = session.request({
          ':path': `/v1/sandboxes/${id}/files?path=${encodeURIComponent('/home/user/h2.bin')}`,
          authorization: `Bearer ${files.token}`,
        });
        const parts: Buffer[] = [];
        req.on('data', (d: Buffer) => parts.push(d));
        req.on('end', () => resolve(Buffer.concat(parts)));
        req.on('error', reject);
      });
      expect(back.equals(upload)).toBe(true);
      // the envd upload of E2B's SDK (its fetch pool speaks h2): X-Metadata-* headers included,
      // a repeated one counted once with its first value, as on HTTP/1.1
      const envd = await new Promise<{ status: number; body: string }>((resolve, reject) => {
        const req = session.request({
          ':method': 'POST',
          ':path': `/files?path=${encodeURIComponent('/home/user/h2-meta.txt')}`,
          'e2b-sandbox-id': id,
          'x-access-token': files.token,
          'content-type': 'application/octet-stream',
          'x-metadata-author': 'ann',
          'x-metadata-k': ['first', 'second'],
        });
        let status = 0;
        let text = '';
        req.on('response', (h) => {
          status = Number(h[':status']);
        });
        req.on('data', (d: Buffer) => {
          text += d.toString();
        });
        req.on('end', () => resolve({ status, body: text }));
        req.on('error', reject);
        req.end('over h2');
      });
      expect(envd).toEqual({
        status: 200,
        body: JSON.stringify([
          {
            name: 'h2-meta.txt',
            type: 'file',
            path: '/home/user/h2-meta.txt',
            metadata: { author: 'ann', k: 'first' },
          },
        ]),
      });
    } finally {
      session.close();
    }
    // the same port still speaks HTTP/1.1 over TLS to clients that do not offer h2
    const h1 = new Agent({ connect: { ca } });
    try {
      const r = await request(`${tlsRouter.url}${new URL(c.stream.url).pathname}`, {
        dispatcher: h1,
        headers: { authorization: `Bearer ${c.stream.token}` },
      });
      expect(r.statusCode).toBe(200);
      expect(await r.body.text()).toContain('event: exit');
    } finally {
      await h1.close();
    }
  });
});

describe('router: refusals', () => {
  it('refuses bad, expired and other-sandbox tokens before forwarding anything', async () => {
    // a sandbox whose node is a tripwire: whatever the router forwards for it arrives there
    let forwarded = 0;
    const trip = createServer((_req, res) => {
      forwarded += 1;
      res.end('{}');
    });
    trip.listen(0, '127.0.0.1');
    await once(trip, 'listening');
    const tripId = 'sbx_tripwiretripwiretrip';
    await s.redis.hset(keys.node('trip-node'), {
      id: 'trip-node',
      url: `http://127.0.0.1:${(trip.address() as { port: number }).port}`,
    });
    await s.redis.set(keys.nodeAlive('trip-node'), '1', 'PX', 60_000);
    await s.redis.hset(keys.sandbox(tripId), {
      id: tripId,
      state: 'running',
      nodeId: 'trip-node',
      sessionId: 'ses_x',
    });
    try {
      const key = await loadSigningKey(join(s.dir, 'key.pem'));
      const mint = (sandboxId: string, ttlSec: number) =>
        mintSessionToken(key, {
          team: 'default',
          sandboxId,
          sessionId: 'ses_x',
          scopes: ['commands', 'files'],
          ttlSec,
        }).then((t) => t.token);
      const path = `${router.url}/v1/sandboxes/${tripId}/fs/stat?path=/`;
      const code = async (token: string) => {
        const r = await request(path, { headers: { authorization: `Bearer ${token}` } });
        const body = (await r.body.json()) as { error?: { code: string } };
        return `${r.statusCode} ${body.error?.code}`;
      };
      expect(await code('garbage')).toBe('401 TOKEN_INVALID');
      expect(await code(await mint(tripId, -10))).toBe('401 TOKEN_EXPIRED');
      expect(await code(await mint(id, 60))).toBe('403 TOKEN_SCOPE');
      // a real sandbox's token on another real sandbox's path: refused the same way
      const mine = await s.token(id, ['files']);
      const r = await request(`${router.url}/v1/sandboxes/sbx_notthisonenotthisone/fs/stat?path=/`, {
        headers: { authorization: `Bearer ${mine.token}` },
      });
      expect(r.statusCode).toBe(403);
      await r.body.dump();
      expect(forwarded).toBe(0);
      // control: a good token for it is forwarded (so the tripwire would have seen the others)
      await code(await mint(tripId, 60));
      expect(forwarded).toBe(1);
    } finally {
      await s.redis.del(keys.sandbox(tripId), keys.node('trip-node'), keys.nodeAlive('trip-node'));
      trip.close();
    }
  });
});

describe('router: 200 concurrent streams with one slow reader', () => {
  it('the others complete and the router’s memory stays bounded while the slow reader is paused', async () => {
    const BIG = 96; // MiB of output behind the slow reader (≈ 128 MiB of SSE)
    const big = await start({ cmd: 'sh', args: ['-c', `head -c ${BIG}M /dev/zero`] });
    const small = await Promise.all(
      Array.from({ length: 4 }, (_, k) =>
        start({ cmd: 'sh', args: ['-c', `for i in $(seq 1 200); do echo c${k} line $i; sleep 0.005; done`] }),
      ),
    );
    // the big command's output is all in the agent's spool before the slow reader starts: then a
    // router that does not hold backpressure would pull all of it at once
    await waitFor(
      'the big command to finish',
      async () => {
        const st = await request(`${router.url}/v1/sandboxes/${id}/commands/${big.command.id}`, {
          headers: { authorization: `Bearer ${big.stream.token}` },
        });
        const body = (await st.body.json()) as { running: boolean };
        return body.running ? undefined : true;
      },
      120_000,
    );
    const before = await router.memory();

    // the slow reader: its own connection, reads one chunk, then stops reading
    const slowClient = new Client(new URL(router.url).origin);
    const slow = await request(big.stream.url, {
      dispatcher: slowClient,
      headers: { authorization: `Bearer ${big.stream.token}` },
    });
    expect(slow.statusCode).toBe(200);
    const firstChunk = await new Promise<Buffer>((resolve) => {
      slow.body.once('data', (c: Buffer) => {
        slow.body.pause();
        resolve(c);
      });
    });

    // 199 readers of the small commands, all at once, beside it
    const others = await Promise.all(
      Array.from({ length: 199 }, (_, i) => {
        const c = small[i % small.length]!;
        return readEvents(c.stream.url, c.stream.token).then(collect);
      }),
    );
    for (const [i, o] of others.entries()) {
      const k = i % small.length;
      expect(o.exit.exitCode).toBe(0);
      expect(o.stdout.toString().split('\n').filter(Boolean)).toHaveLength(200);
      expect(o.stdout.toString().startsWith(`c${k} line 1\n`)).toBe(true);
    }
    const during = await router.memory();
    const metrics = await router.metrics();
    // only the slow stream is still being forwarded
    expect(metricValue(metrics, 'space_router_active_streams')).toBe(1);
    const grew = during.peak - before.rss;
    console.info(
      `router memory: rss before ${(before.rss / MiB).toFixed(1)} MiB, peak ${(during.peak / MiB).toFixed(1)} MiB ` +
        `(+${(grew / MiB).toFixed(1)} MiB) with 200 streams, one paused over ${BIG} MiB of output`,
    );
    // bounded: far below the slow stream's backlog (a router that buffered it would hold it all)
    expect(grew).toBeLessThan(48 * MiB);

    // the slow reader, resumed, gets every byte
    let zeros = 0;
    let exit = '';
    const parser = createParser({
      onEvent: (e) => {
        if (e.event === 'stdout')
          zeros += Buffer.from((JSON.parse(e.data) as { data: string }).data, 'base64').length;
        if (e.event === 'exit') exit = e.data;
      },
    });
    const decoder = new TextDecoder();
    parser.feed(decoder.decode(firstChunk, { stream: true }));
    for await (const chunk of slow.body) parser.feed(decoder.decode(chunk as Buffer, { stream: true }));
    await slowClient.close();
    expect(zeros).toBe(BIG * MiB);
    expect(JSON.parse(exit)).toMatchObject({ exitCode: 0 });
  });
});

describe('router: resume on traffic', () => {
  it('a request for a paused sandbox resumes it and is served, with no client change', async () => {
    const c = await start({ cmd: 'sh', args: ['-c', 'echo before the pause'] });
    await readEvents(c.stream.url, c.stream.token);
    const paused = await s.call<{ operation: { id: string } }>('POST', `/v1/sandboxes/${id}/pause`, {});
    expect(paused.status).toBe(202);
    const op = await s.call<{ state: string; error?: { code: string; message: string } }>(
      'GET',
      `/v1/operations/${paused.body.operation.id}?waitMs=60000`,
    );
    expect(op.body).toMatchObject({ state: 'succeeded' });
    const state = await s.call<{ state: string }>('GET', `/v1/sandboxes/${id}`);
    expect(state.body.state).toBe('paused');
    const before = metricValue(await router.metrics(), 'space_router_resumes_total', 'outcome="resumed"');

    // the same URL and token as before the pause
    const again = collect(await readEvents(c.stream.url, c.stream.token));
    expect(again.stdout.toString()).toBe('before the pause\n');
    expect((await s.call<{ state: string }>('GET', `/v1/sandboxes/${id}`)).body.state).toBe('running');
    const after = metricValue(await router.metrics(), 'space_router_resumes_total', 'outcome="resumed"');
    expect(after - before).toBe(1);
  });
});

describe('router: auto-pause and resume, through the router only', () => {
  it('an idle sandbox pauses itself; a stream reconnect and the next exec resume it with its state intact; usage adds up', async () => {
    const res = await s.call<{ sandbox: { id: string }; operation: { id: string } }>(
      'POST',
      '/v1/sandboxes',
      {
        template: 'base',
        autoPauseSec: 1,
      },
    );
    expect(res.status).toBe(202);
    const sb = res.body.sandbox.id;
    await s.call('GET', `/v1/operations/${res.body.operation.id}?waitMs=60000`);
    const c = await start({ cmd: 'sh', args: ['-c', 'echo state > /home/user/kept; seq 1 50'] }, sb);
    expect(c.stream.url.startsWith(router.url)).toBe(true);
    const first = await readEvents(c.stream.url, c.stream.token, { stopAfter: 1 });
    const paused = await waitFor(
      'auto-pause',
      async () => {
        const r = await s.call<{ state: string; pause: { reason: string } | null }>(
          'GET',
          `/v1/sandboxes/${sb}`,
        );
        return r.body.state === 'paused' ? r.body : undefined;
      },
      30_000,
    );
    expect(paused.pause?.reason).toBe('idle');
    // the client reconnects where it left off: the router resumes the sandbox and serves the rest
    const rest = await readEvents(c.stream.url, c.stream.token, { lastEventId: first.at(-1)!.id });
    const whole = collect([...first, ...rest]);
    expect(whole.stdout.toString()).toBe(Array.from({ length: 50 }, (_, i) => `${i + 1}\n`).join(''));
    expect((await s.call<{ state: string }>('GET', `/v1/sandboxes/${sb}`)).body.state).toBe('running');
    // idle again, paused again; the next exec (its stream through the router) resumes it
    await waitFor(
      'second auto-pause',
      async () =>
        (await s.call<{ state: string }>('GET', `/v1/sandboxes/${sb}`)).body.state === 'paused'
          ? true
          : undefined,
      30_000,
    );
    const again = await start({ cmd: 'cat', args: ['/home/user/kept'] }, sb);
    expect(collect(await readEvents(again.stream.url, again.stream.token)).stdout.toString()).toBe('state\n');
    const u = await s.call<{ startedAt: string; seconds: { active: number; idle: number; paused: number } }>(
      'GET',
      `/v1/sandboxes/${sb}/usage`,
    );
    const { active, idle, paused: p } = u.body.seconds;
    expect(active).toBeGreaterThan(0);
    expect(idle).toBeGreaterThan(1.5); // two idle seconds before the two auto-pauses
    expect(p).toBeGreaterThan(0);
    const life = (Date.now() - Date.parse(u.body.startedAt)) / 1000;
    expect(Math.abs(active + idle + p - life)).toBeLessThan(0.5);
    await s.call('DELETE', `/v1/sandboxes/${sb}`);
  });
});

describe('router: node down', () => {
  it('answers NODE_UNAVAILABLE when the sandbox’s agent is gone', async () => {
    const { token } = await s.token(id, ['files']);
    await s.agent.close('test');
    const r = await request(`${router.url}/v1/sandboxes/${id}/fs/stat?path=/`, {
      headers: { authorization: `Bearer ${token}` },
    });
    const body = (await r.body.json()) as { error: { code: string; details?: { nodeId?: string } } };
    expect([r.statusCode, body.error.code]).toEqual([503, 'NODE_UNAVAILABLE']);
    expect(body.error.details?.nodeId).toBe('test-node');
  });
});
