/**
 * Issue 49's refusals (runtime cases R22, R23, R25, R26, R27), against the real stack and a
 * router process: a refusal is immediate, carries its own code and the error envelope, reaches a
 * client that writes its whole body before reading, and leaves no socket held.
 */
import { execFile } from 'node:child_process';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freePort } from './redis-server.ts';
import { type RouterProcess, startRouterProcess } from './router-process.ts';
import { leftovers, NO_LEFTOVERS, readEvents, type Stack, startStack } from './stack.ts';

const run = promisify(execFile);
const MiB = 1024 * 1024;
const CLIENT = fileURLToPath(new URL('./whole-body-client.py', import.meta.url));
const UPLOAD_LIMIT = 64 * MiB;

let s: Stack;
let router: RouterProcess;
let id: string;
let token: string;

beforeAll(async () => {
  const port = await freePort();
  s = await startStack({
    SPACE_ROUTER_URL: `http://127.0.0.1:${port}`,
    SPACE_MAX_UPLOAD_BYTES: String(UPLOAD_LIMIT),
  });
  router = await startRouterProcess({
    SPACE_ROUTER_PORT: String(port),
    SPACE_REDIS_URL: s.redisUrl,
    SPACE_VERIFY_KEY_FILE: join(s.dir, 'key.pub.pem'),
    SPACE_MAX_UPLOAD_BYTES: String(UPLOAD_LIMIT),
  });
  // 512 MiB: /tmp is a tmpfs of 256 MiB, small enough to fill for the full-disk case
  id = await s.createSandbox({ memoryMiB: 512, timeoutSec: 900 });
  token = (await s.token(id)).token;
});
afterAll(async () => {
  await router?.stop();
  if (!s) return;
  await s.stop();
  expect(await leftovers(s)).toEqual(NO_LEFTOVERS);
});

interface Sent {
  status: number;
  code?: string;
  closed?: boolean;
  error?: string;
  body?: string;
  seconds: number;
}

/** Sends `bytes` with a client that writes the whole request before it reads (whole-body-client.py). */
async function sendWhole(
  url: string,
  method: string,
  bytes: number,
  o: { type?: string; mode?: 'http.client' | 'raw' } = {},
): Promise<Sent> {
  const { stdout } = await run(
    'python3',
    [CLIENT, url, method, String(bytes), o.type ?? 'application/octet-stream', o.mode ?? 'http.client'],
    { timeout: 60_000 },
  );
  return JSON.parse(stdout) as Sent;
}

const bases = () => ({ agent: s.agent.url, router: router.url });
const q = (path: string) => `?path=${encodeURIComponent(path)}&token=${token}`;

describe('r22-refused-upload: a refused upload answers its own code to a client that writes everything first', () => {
  it('a platform path, a directory, under a regular file and a full disk, through the agent and the router', async () => {
    const made = await s.exec(id, {
      cmd: 'sh',
      args: ['-c', 'echo x > /home/user/r22-file && mkdir -p /home/user/r22-dir'],
    });
    expect(made.exit.exitCode).toBe(0);
    const cases: [string, string, number][] = [
      ['/proc/x', 'PATH_INVALID', 400],
      ['/home/user/r22-dir', 'FILE_CONFLICT', 409],
      ['/home/user/r22-file/under', 'FILE_CONFLICT', 409],
    ];
    for (const [hop, base] of Object.entries(bases())) {
      for (const [path, code, status] of cases) {
        const url = `${base}/v1/sandboxes/${id}/files${q(path)}`;
        const viaClient = await sendWhole(url, 'PUT', 30_000_000);
        expect(viaClient, `${hop} ${path} (http.client)`).toMatchObject({ status, code });
        // the same with a raw socket, read to its end: the server closes the connection itself
        const raw = await sendWhole(url, 'PUT', 30_000_000, { mode: 'raw' });
        expect(raw, `${hop} ${path} (raw)`).toMatchObject({ status, code, closed: true });
      }
    }
    // a full disk refuses in the middle of the body: /tmp (256 MiB) is filled up to ~8 MiB first
    const fill = await s.exec(id, {
      cmd: 'sh',
      args: ['-c', 'dd if=/dev/zero of=/tmp/r22-fill bs=1M count=248 2>/dev/null; df -k /tmp | tail -1'],
    });
    expect(fill.exit.exitCode).toBe(0);
    try {
      for (const [hop, base] of Object.entries(bases())) {
        const url = `${base}/v1/sandboxes/${id}/files${q('/tmp/r22-big')}`;
        const full = await sendWhole(url, 'PUT', 30_000_000, { mode: 'raw' });
        expect(full, `${hop} full disk`).toMatchObject({ status: 507, code: 'DISK_FULL', closed: true });
      }
      // the refused uploads left nothing behind, and the sandbox serves on
      const ls = await s.exec(id, {
        cmd: 'sh',
        args: ['-c', 'ls -A /tmp /home/user/r22-dir | grep -c space-upload || true'],
      });
      expect(ls.stdout.toString().trim()).toBe('0');
    } finally {
      await s.exec(id, { cmd: 'rm', args: ['-f', '/tmp/r22-fill'] });
    }
    // an upload that is not refused still works on the same routes
    for (const base of Object.values(bases())) {
      const ok = await sendWhole(
        `${base}/v1/sandboxes/${id}/files${q('/home/user/r22-ok')}`,
        'PUT',
        3_000_000,
      );
      expect(ok.status).toBe(200);
    }
  });
});

describe('r23-size-limits-at-the-first-hop: a body over its limit is 413 at once, through the router too', () => {
  it('a 10 MiB JSON body to every data-plane route that takes one, and an upload declared over the limit', async () => {
    const paths = [
      `/v1/sandboxes/${id}/fs/mkdir`,
      `/v1/sandboxes/${id}/fs/rename`,
      `/v1/sandboxes/${id}/commands/cmd_aaaaaaaaaaaaaaaaaaaa/signal`,
      `/v1/sandboxes/${id}/commands/cmd_aaaaaaaaaaaaaaaaaaaa/resize`,
    ];
    for (const [hop, base] of Object.entries(bases())) {
      for (const path of paths) {
        const r = await sendWhole(`${base}${path}?token=${token}`, 'POST', 10 * MiB, {
          type: 'application/json',
          mode: 'raw',
        });
        expect(r, `${hop} ${path}`).toMatchObject({ status: 413, code: 'BODY_TOO_LARGE', closed: true });
      }
      const up = await sendWhole(
        `${base}/v1/sandboxes/${id}/files${q('/home/user/r23-big')}`,
        'PUT',
        UPLOAD_LIMIT + 1,
        {
          mode: 'raw',
        },
      );
      expect(up, `${hop} upload over the limit`).toMatchObject({
        status: 413,
        code: 'BODY_TOO_LARGE',
        closed: true,
      });
    }
    // a chunked JSON body (no Content-Length) over the limit: the agent counts it and the router
    // passes its 413 on
    const chunks = async function* () {
      for (let i = 0; i < 10; i++) yield Buffer.alloc(MiB, 0x20);
    };
    const chunked = await request(`${router.url}/v1/sandboxes/${id}/fs/mkdir?token=${token}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: Readable.from(chunks()),
    });
    const body = (await chunked.body.json()) as { error: { code: string } };
    expect([chunked.statusCode, body.error.code]).toEqual([413, 'BODY_TOO_LARGE']);
  });
});

describe('r25-every-error-has-the-envelope', () => {
  it('headers too large (431), bad JSON, an unsupported type and an unknown route, on the API, router and agent', async () => {
    const services = { api: s.apiUrl, router: router.url, agent: s.agent.url };
    for (const [name, base] of Object.entries(services)) {
      const big = await request(`${base}/healthz`, { headers: { 'x-big': 'x'.repeat(64 * 1024) } });
      const bigBody = (await big.body.json()) as { error?: { code: string; message: string } };
      expect([name, big.statusCode, bigBody.error?.code]).toEqual([name, 431, 'HEADERS_TOO_LARGE']);
      expect(typeof bigBody.error?.message).toBe('string');
      const nowhere = await request(`${base}/v1/no-such-route`, {
        method: 'POST',
        headers: name === 'api' ? { authorization: `Bearer ${s.apiKey}` } : {},
      });
      const nowhereBody = (await nowhere.body.json()) as { error?: { code: string } };
      expect([name, nowhere.statusCode, nowhereBody.error?.code]).toEqual([name, 404, 'NOT_FOUND']);
    }
    // bad JSON and an unsupported content type where a body is parsed (API, agent)
    const apiAuth = { authorization: `Bearer ${s.apiKey}` };
    for (const [name, url, headers] of [
      ['api', `${s.apiUrl}/v1/sandboxes`, apiAuth],
      ['agent', `${s.agent.url}/v1/sandboxes/${id}/fs/mkdir?token=${token}`, {}],
    ] as const) {
      const badJson = await request(url, {
        method: 'POST',
        headers: { ...headers, 'content-type': 'application/json' },
        body: '{"path":',
      });
      const b1 = (await badJson.body.json()) as { error?: { code: string } };
      expect([name, badJson.statusCode, b1.error?.code]).toEqual([name, 400, 'BAD_REQUEST']);
      const badType = await request(url, {
        method: 'POST',
        headers: { ...headers, 'content-type': 'text/x-nothing' },
        body: 'x',
      });
      const b2 = (await badType.body.json()) as { error?: { code: string } };
      expect(b2.error?.code, name).toBeTruthy();
      expect(badType.statusCode, name).toBeGreaterThanOrEqual(400);
    }
  });

  it('a shape larger than any node is a 4xx naming the largest on offer, not a retryable 503', async () => {
    const node = (await s.call<{ nodes: { vcpus: number; memoryMiB: number }[] }>('GET', '/v1/nodes')).body
      .nodes[0]!;
    // (more vCPUs than the node's are refused by the schema's own maximum here: the node offers 64;
    // largestShapes' unit test covers nodes that differ in both)
    for (const shape of [{ memoryMiB: node.memoryMiB + 1024 }, { memoryMiB: node.memoryMiB + 1, vcpus: 1 }]) {
      const r = await s.call<{ error: { code: string; message: string; details: { largest: unknown } } }>(
        'POST',
        '/v1/sandboxes',
        { template: 'base', ...shape },
      );
      expect([r.status, r.body.error.code], JSON.stringify(shape)).toEqual([400, 'SHAPE_TOO_LARGE']);
      expect(r.body.error.details.largest).toEqual([{ vcpus: node.vcpus, memoryMiB: node.memoryMiB }]);
      expect(r.body.error.message).toContain(`${node.vcpus} vCPU / ${node.memoryMiB} MiB`);
    }
  });
});

describe('r26-filters-mean-what-they-say', () => {
  it('the list refuses a metadata key with two values, and matches every pair of different keys', async () => {
    const tagged = await s.createSandbox({ metadata: { role: 'a', team: 'r26' } });
    try {
      const list = (query: string) =>
        s.call<{ sandboxes: { id: string }[]; error?: { code: string } }>('GET', `/v1/sandboxes?${query}`);
      const twice = await list(`metadata=${encodeURIComponent('role=a&role=b')}`);
      expect([twice.status, twice.body.error?.code]).toEqual([400, 'BAD_REQUEST']);
      const repeated = await list(
        `metadata=${encodeURIComponent('role=a')}&metadata=${encodeURIComponent('role=b')}`,
      );
      expect([repeated.status, repeated.body.error?.code]).toEqual([400, 'BAD_REQUEST']);
      const both = await list(
        `metadata=${encodeURIComponent('role=a')}&metadata=${encodeURIComponent('team=r26')}`,
      );
      expect(both.body.sandboxes.map((x) => x.id)).toEqual([tagged]);
      const other = await list(
        `metadata=${encodeURIComponent('role=a')}&metadata=${encodeURIComponent('team=other')}`,
      );
      expect(other.body.sandboxes).toEqual([]);
    } finally {
      await s.call('DELETE', `/v1/sandboxes/${tagged}`);
    }
  });
});

/** The stdout bytes of SSE events (no exit event needed: a stream may end before it). */
function stdoutOf(events: { event: string; data: string }[]): string {
  return events
    .filter((e) => e.event === 'stdout')
    .map((e) => Buffer.from((JSON.parse(e.data) as { data: string }).data, 'base64').toString())
    .join('');
}

describe('r27-hibernated-on-the-agent-url', () => {
  it('answers 409 SANDBOX_PAUSED for guest calls and still serves the spooled output, as documented', async () => {
    const sb = await s.createSandbox({ autoPauseSec: 0, memoryMiB: 256 });
    try {
      const started = await s.call<{ command: { id: string } }>('POST', `/v1/sandboxes/${sb}/commands`, {
        cmd: 'sh',
        args: ['-c', 'echo spooled-before; sleep 600'],
      });
      expect(started.status).toBe(201);
      const cmd = started.body.command.id;
      // a token made before the pause (asking for one resumes a paused sandbox)
      const t = (await s.token(sb)).token;
      const agent = `${s.agent.url}/v1/sandboxes/${sb}`;
      const auth = { authorization: `Bearer ${t}` };
      const eventsUrl = `${agent}/commands/${cmd}/events`;
      // the output is spooled before the pause (the stream follows the running command: one event)
      const before = await readEvents(eventsUrl, t, { stopAfter: 1 });
      expect(stdoutOf(before)).toBe('spooled-before\n');
      const paused = await s.call<{ operation: { id: string } }>('POST', `/v1/sandboxes/${sb}/pause`, {
        mode: 'hibernated',
      });
      expect(paused.status).toBe(202);
      const op = await s.call<{ state: string }>(
        'GET',
        `/v1/operations/${paused.body.operation.id}?waitMs=60000`,
      );
      expect(op.body.state).toBe('succeeded');

      // guest calls: 409 SANDBOX_PAUSED, not 404
      for (const [method, path] of [
        ['GET', `/fs/stat?path=/`],
        ['GET', `/files?path=/etc/hostname`],
        ['POST', `/commands/${cmd}/signal`],
      ] as const) {
        const r = await request(`${agent}${path}`, {
          method,
          headers: { ...auth, ...(method === 'POST' ? { 'content-type': 'application/json' } : {}) },
          body: method === 'POST' ? JSON.stringify({ signal: 'SIGTERM' }) : undefined,
        });
        const body = (await r.body.json()) as { error: { code: string } };
        expect([path, r.statusCode, body.error.code]).toEqual([path, 409, 'SANDBOX_PAUSED']);
      }
      // spooled output: the events so far, the command and the list
      // the stream of a hibernated sandbox is what was spooled, then it ends (no exit yet)
      const ev = await readEvents(eventsUrl, t);
      expect(stdoutOf(ev)).toBe('spooled-before\n');
      expect(ev.map((e) => e.event)).toEqual(['stdout']);
      const got = await request(`${agent}/commands/${cmd}`, { headers: auth });
      expect(got.statusCode).toBe(200);
      expect(await got.body.json()).toMatchObject({ id: cmd, running: true });
      const list = await request(`${agent}/commands`, { headers: auth });
      expect(((await list.body.json()) as { commands: { id: string }[] }).commands.map((c) => c.id)).toEqual([
        cmd,
      ]);
      // a token of another sandbox is refused as before
      const other = await request(`${s.agent.url}/v1/sandboxes/${id}/commands/${cmd}`, { headers: auth });
      expect(other.statusCode).toBe(403);
      await other.body.dump();
    } finally {
      await s.call('DELETE', `/v1/sandboxes/${sb}`);
    }
  });
});
