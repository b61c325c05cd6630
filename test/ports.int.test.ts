/**
 * Servers in sandboxes through the router (issue 45 item 1): the official `e2b` SDK's
 * `getHost(port)` against a real HTTP server started in a real gVisor sandbox of a local stack —
 * plain GET, a WebSocket echo, SSE streamed event by event, a 24 MiB upload and download (bytes
 * checked), a paused sandbox resumed by a request, a closed port, a killed sandbox, private
 * sandboxes (`allowPublicTraffic: false`), E2B's `E2b-Sandbox-Port` header mode and `isRunning()`
 * after `pause()`. The host form is `<port>-<id>.localhost:<router port>` (plain HTTP): browsers
 * resolve `*.localhost` to loopback themselves, Node does not, so the test's HTTP clients resolve
 * it with a lookup of their own (nothing leaves loopback).
 */
import { createHash, randomBytes } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { Sandbox } from 'e2b';
import { Agent, request, WebSocket } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type E2bStack, startE2bStack } from './e2b-stack.ts';
import type { RouterProcess } from './router-process.ts';
import { leftovers, NO_LEFTOVERS, type Stack } from './stack.ts';

let s: Stack;
let router: RouterProcess;
let e2b: E2bStack;

/** Every `*.localhost` name is 127.0.0.1 (what browsers do, RFC 6761 §6.3). */
const loopback = new Agent({
  connect: {
    lookup: (_host: string, opts: { all?: boolean }, cb: (...a: unknown[]) => void) =>
      opts.all ? cb(null, [{ address: '127.0.0.1', family: 4 }]) : cb(null, '127.0.0.1', 4),
  } as never,
});

/** The server the tests start in the sandbox (python3 standard library only). */
const SERVER = String.raw`
import base64, hashlib, http.server, os, socketserver, struct, sys, threading
release = threading.Event()
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'
    def log_message(self, *a): pass
    def reply(self, code, body, ctype='text/plain'):
        self.send_response(code); self.send_header('Content-Type', ctype)
        self.send_header('Content-Length', str(len(body))); self.end_headers(); self.wfile.write(body)
    def do_GET(self):
        if self.path == '/hello':
            return self.reply(200, ('hello from ' + self.headers.get('Host', '')).encode())
        if self.path == '/download':
            data = open('/tmp/upload.bin', 'rb').read()
            return self.reply(200, data, 'application/octet-stream')
        if self.path == '/release':
            release.set(); return self.reply(200, b'released')
        if self.path == '/sse':
            self.send_response(200); self.send_header('Content-Type', 'text/event-stream')
            self.send_header('Connection', 'close'); self.end_headers()
            self.wfile.write(b'data: first\n\n'); self.wfile.flush()
            release.wait(60); release.clear()
            self.wfile.write(b'data: second\n\n'); self.wfile.flush()
            self.close_connection = True; return
        if self.path == '/ws':
            key = self.headers['Sec-WebSocket-Key']
            accept = base64.b64encode(hashlib.sha1((key + '258EAFA5-E914-47DA-95CA-C5AB0DC85B11').encode()).digest()).decode()
            self.send_response(101); self.send_header('Upgrade', 'websocket')
            self.send_header('Connection', 'Upgrade'); self.send_header('Sec-WebSocket-Accept', accept)
            self.end_headers(); self.wfile.flush()
            while True:
                h = self.rfile.read(2)
                if len(h) < 2: break
                op, n = h[0] & 15, h[1] & 127
                if n == 126: n = struct.unpack('>H', self.rfile.read(2))[0]
                elif n == 127: n = struct.unpack('>Q', self.rfile.read(8))[0]
                mask = self.rfile.read(4)
                data = bytes(b ^ mask[i % 4] for i, b in enumerate(self.rfile.read(n)))
                if op == 8:
                    self.wfile.write(b'\x88\x00'); self.wfile.flush(); break
                out = b'echo: ' + data
                head = bytes([0x80 | op]) + (bytes([len(out)]) if len(out) < 126 else b'\x7e' + struct.pack('>H', len(out)))
                self.wfile.write(head + out); self.wfile.flush()
            self.close_connection = True; return
        self.reply(404, b'no such page')
    def do_POST(self):
        n = int(self.headers['Content-Length']); h = hashlib.sha256(); left = n
        with open('/tmp/upload.bin', 'wb') as f:
            while left:
                chunk = self.rfile.read(min(left, 1 << 16))
                if not chunk: break
                h.update(chunk); f.write(chunk); left -= len(chunk)
        self.reply(200, ('%d %s' % (n - left, h.hexdigest())).encode())
class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
S(('0.0.0.0', int(sys.argv[1])), H).serve_forever()
`;

/** Writes and starts the server on `port` in `sbx`, and waits (bounded) until it answers through the router. */
async function startServer(sbx: Sandbox, port: number, headers: Record<string, string> = {}): Promise<void> {
  await sbx.files.write('/home/user/srv.py', SERVER);
  await sbx.commands.run(`python3 /home/user/srv.py ${port}`, { background: true });
  for (let i = 0; i < 100; i++) {
    const res = await get(sbx, port, '/hello', headers);
    if (res.statusCode === 200) return;
    await sleep(200);
  }
  throw new Error(`the server on port ${port} did not come up`);
}

/** GET `path` of `port` of `sbx` through the router's host form; body read as text. */
async function get(sbx: Sandbox, port: number, path: string, headers: Record<string, string> = {}) {
  const res = await request(`http://${sbx.getHost(port)}${path}`, { dispatcher: loopback, headers });
  return { statusCode: res.statusCode, headers: res.headers, text: await res.body.text() };
}

beforeAll(async () => {
  e2b = await startE2bStack();
  s = e2b.s;
  router = e2b.router;
});
afterAll(async () => {
  await loopback.close();
  await e2b?.stopRouter();
  if (!s) return;
  await s.stop();
  expect(await leftovers(s)).toEqual(NO_LEFTOVERS);
});

describe('getHost(port): a server in a public sandbox', () => {
  it('serves GET, WebSocket, SSE, 24 MiB both ways; a closed port, a pause and a kill answer as E2B', async () => {
    const sbx = await Sandbox.create();
    try {
      await startServer(sbx, 8000);
      const hello = await get(sbx, 8000, '/hello');
      expect(hello.statusCode).toBe(200);
      // the server sees the host the client asked for
      expect(hello.text).toBe(`hello from ${sbx.getHost(8000)}`);
      expect((await get(sbx, 8000, '/nothing')).statusCode).toBe(404);

      // a large upload and download, every byte checked
      const blob = randomBytes(24 * 1024 * 1024);
      const up = await request(`http://${sbx.getHost(8000)}/upload`, {
        dispatcher: loopback,
        method: 'POST',
        body: blob,
        headers: { 'content-type': 'application/octet-stream' },
      });
      expect(up.statusCode).toBe(200);
      expect(await up.body.text()).toBe(`${blob.length} ${createHash('sha256').update(blob).digest('hex')}`);
      const down = await request(`http://${sbx.getHost(8000)}/download`, { dispatcher: loopback });
      expect(down.statusCode).toBe(200);
      expect(Buffer.from(await down.body.arrayBuffer()).equals(blob)).toBe(true);

      // SSE: the first event arrives while the response is still open (the server holds the
      // second until it is released), so nothing buffers the stream
      const sse = await request(`http://${sbx.getHost(8000)}/sse`, { dispatcher: loopback });
      expect(sse.headers['content-type']).toBe('text/event-stream');
      const events = sse.body[Symbol.asyncIterator]();
      let seen = '';
      while (!seen.includes('data: first\n\n')) {
        const next = await events.next();
        expect(next.done).toBe(false);
        seen += Buffer.from(next.value as Buffer).toString();
      }
      expect(seen).not.toContain('second');
      expect((await get(sbx, 8000, '/release')).text).toBe('released');
      for (let next = await events.next(); !next.done; next = await events.next()) {
        seen += Buffer.from(next.value as Buffer).toString();
      }
      expect(seen).toBe('data: first\n\ndata: second\n\n');

      // a WebSocket echo, through the router's upgrade
      const ws = new WebSocket(`ws://${sbx.getHost(8000)}/ws`, { dispatcher: loopback } as never);
      const echoes: string[] = [];
      await new Promise<void>((resolve, reject) => {
        ws.onerror = (e) =>
          reject(new Error(`websocket failed: ${String((e as { message?: unknown }).message)}`));
        ws.onopen = () => ws.send('one');
        ws.onmessage = (m) => {
          echoes.push(String(m.data));
          if (echoes.length === 1) ws.send('x'.repeat(1000));
          else ws.close();
        };
        ws.onclose = () => resolve();
      });
      expect(echoes).toEqual(['echo: one', `echo: ${'x'.repeat(1000)}`]);

      // nothing listens on 8001: E2B's answer
      const closed = await get(sbx, 8001, '/');
      expect(closed.statusCode).toBe(502);
      expect(JSON.parse(closed.text)).toEqual({
        sandboxId: sbx.sandboxId,
        message: 'The sandbox is running but port is not open',
        port: 8001,
        code: 502,
      });

      // paused: not running for the SDK's probe, and the next request resumes it (server intact)
      expect(await sbx.isRunning()).toBe(true);
      expect(await sbx.pause()).toBe(true);
      expect(await sbx.isRunning()).toBe(false);
      const resumed = await get(sbx, 8000, '/hello');
      expect(resumed.statusCode).toBe(200);
      expect((await sbx.getInfo()).state).toBe('running');
      expect(await sbx.isRunning()).toBe(true);
    } finally {
      await sbx.kill();
    }
    // killed: E2B's "not found"
    const gone = await get(sbx, 8000, '/hello');
    expect(gone.statusCode).toBe(502);
    expect(JSON.parse(gone.text)).toEqual({
      sandboxId: sbx.sandboxId,
      message: 'The sandbox was not found',
      code: 502,
    });
  });

  it('routes by E2b-Sandbox-Id + E2b-Sandbox-Port on the router’s own address (E2B_SANDBOX_URL mode)', async () => {
    const sbx = await Sandbox.create();
    try {
      await startServer(sbx, 49999);
      const ask = async (path: string, port: string) => {
        const res = await request(`${router.url}${path}`, {
          headers: { 'e2b-sandbox-id': sbx.sandboxId, 'e2b-sandbox-port': port },
        });
        return { statusCode: res.statusCode, text: await res.body.text() };
      };
      expect(await ask('/hello', '49999')).toMatchObject({
        statusCode: 200,
        text: expect.stringMatching(/^hello from /),
      });
      // envd's /health is envd's only on envd's port: here it is the server's page (404)
      expect(await ask('/health', '49999')).toEqual({ statusCode: 404, text: 'no such page' });
      expect((await ask('/health', '49983')).statusCode).toBe(204);
      expect((await ask('/hello', '49998')).statusCode).toBe(502);
    } finally {
      await sbx.kill();
    }
  });
});

describe('getHost(port): a private sandbox (network.allowPublicTraffic: false)', () => {
  it('refuses requests without its traffic access token or with a wrong one, serves them with it', async () => {
    const sbx = await Sandbox.create({ network: { allowPublicTraffic: false } });
    try {
      const token = sbx.trafficAccessToken;
      expect(typeof token).toBe('string');
      await startServer(sbx, 8000, { 'e2b-traffic-access-token': token ?? '' });
      const none = await get(sbx, 8000, '/hello');
      expect(none.statusCode).toBe(403);
      expect(JSON.parse(none.text)).toEqual({
        sandboxId: sbx.sandboxId,
        message:
          "Sandbox is secured with traffic access token. Token header 'e2b-traffic-access-token' is missing",
        code: 403,
      });
      const wrong = await get(sbx, 8000, '/hello', { 'e2b-traffic-access-token': 'nope' });
      expect(wrong.statusCode).toBe(403);
      expect(JSON.parse(wrong.text).message).toMatch(/is invalid$/);
      // the header may come in any case (Code Interpreter sends E2B-Traffic-Access-Token)
      const ok = await get(sbx, 8000, '/hello', { 'E2B-Traffic-Access-Token': token ?? '' });
      expect(ok.statusCode).toBe(200);
      // refused before anything happens: a paused private sandbox stays paused for a bad token
      expect(await sbx.pause()).toBe(true);
      expect((await get(sbx, 8000, '/hello')).statusCode).toBe(403);
      expect((await sbx.getInfo()).state).toBe('paused');
    } finally {
      await sbx.kill();
    }
  });
});
