/** Test helpers: start the real daemon as a child process and talk HTTP to it. */

import { type ChildProcess, spawn } from 'node:child_process';
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { request as httpRequest, type IncomingMessage } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { WatchEvent } from '../core/guest-protocol.ts';
import { type Frame, FrameDecoder } from './output.ts';

const here = fileURLToPath(new URL('.', import.meta.url));
/** Node 24 (the daemon strips types); vitest itself may run on an older node. */
const NODE =
  Number(process.versions.node.split('.')[0]) >= 24
    ? process.execPath
    : join(here, '../../node_modules/.bin/node');

export interface Guest {
  base: string;
  port: number;
  /** The daemon's sudo socket (core/sudo.ts). */
  sudoSocket: string;
  home: string;
  child: ChildProcess;
  /** Log lines the daemon wrote so far. */
  logs: Record<string, unknown>[];
  stop(): Promise<void>;
}

/** The token test daemons require (see GuestConfig.token). */
export const TEST_TOKEN = 'guest-test-token';
/** Request headers carrying it. */
export const AUTH = { authorization: `Bearer ${TEST_TOKEN}` };

/** Starts `runtime/guest/main.ts` on 127.0.0.1 on a free port with a fresh home directory. */
const running = new Set<ChildProcess>();
process.once('exit', () => {
  for (const child of running) child.kill('SIGKILL');
});

export async function startGuest(env: Record<string, string> = {}): Promise<Guest> {
  const scratch = env.SPACE_GUEST_HOME ? undefined : mkdtempSync(join(tmpdir(), 'space-guest-'));
  // like /home in a sandbox: the user must be able to pass through to its home
  if (scratch) chmodSync(scratch, 0o755);
  const home = env.SPACE_GUEST_HOME ?? join(scratch!, 'home');
  const tokenDir = mkdtempSync(join(tmpdir(), 'space-guest-token-'));
  const tokenFile = join(tokenDir, 'token');
  const sudoDir = mkdtempSync(join(tmpdir(), 'space-guest-sudo-'));
  chmodSync(sudoDir, 0o755); // any user may reach the socket; the handler decides
  const sudoSocket = join(sudoDir, 'sudo.sock');
  writeFileSync(tokenFile, TEST_TOKEN, { mode: 0o400 });
  const child = spawn(NODE, [join(here, 'main.ts')], {
    env: {
      ...process.env,
      SPACE_GUEST_HOST: '127.0.0.1',
      SPACE_GUEST_PORT: '0',
      SPACE_GUEST_HOME: home,
      SPACE_GUEST_TOKEN_FILE: tokenFile,
      // never the host's /run: a socket of the test's own
      SPACE_GUEST_SUDO_SOCKET: sudoSocket,
      ...env,
    },
    stdio: ['ignore', 'inherit', 'pipe'],
  });
  running.add(child);
  child.once('exit', () => {
    running.delete(child);
    rmSync(tokenDir, { recursive: true, force: true });
    rmSync(sudoDir, { recursive: true, force: true });
    if (scratch) rmSync(scratch, { recursive: true, force: true });
  });
  const logs: Record<string, unknown>[] = [];
  const port = await new Promise<number>((resolve, reject) => {
    let buf = '';
    child.stderr!.on('data', (d: Buffer) => {
      buf += d.toString();
      let nl = buf.indexOf('\n');
      while (nl >= 0) {
        const line = buf.slice(0, nl);
        buf = buf.slice(nl + 1);
        try {
          const entry = JSON.parse(line) as Record<string, unknown>;
          logs.push(entry);
          if (entry.msg === 'listening') resolve(entry.port as number);
        } catch {
          process.stderr.write(line + '\n');
        }
        nl = buf.indexOf('\n');
      }
    });
    child.once('exit', (code) => reject(new Error(`guest exited early (${code})`)));
  });
  return {
    base: `http://127.0.0.1:${port}`,
    port,
    sudoSocket,
    home,
    child,
    logs,
    stop: () =>
      new Promise<void>((resolve) => {
        if (child.exitCode !== null || child.signalCode !== null) return resolve();
        child.once('exit', () => resolve());
        child.kill('SIGTERM');
      }),
  };
}

export interface Reply {
  status: number;
  headers: IncomingMessage['headers'];
  body: Buffer;
  json: () => unknown;
}

/** One HTTP request; `body` may be a Buffer, a string, or a JSON value; `headers` add to the auth. */
export function call(
  g: Guest,
  method: string,
  path: string,
  body?: unknown,
  headers: Record<string, string> = {},
): Promise<Reply> {
  return new Promise((resolve, reject) => {
    const opts = { method, agent: false, headers: { ...AUTH, ...headers } };
    const req = httpRequest(`${g.base}${path}`, opts, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('error', reject);
      res.on('end', () => {
        const buf = Buffer.concat(chunks);
        resolve({
          status: res.statusCode!,
          headers: res.headers,
          body: buf,
          json: () => JSON.parse(buf.toString()),
        });
      });
    });
    req.on('error', reject);
    if (body === undefined) req.end();
    else if (Buffer.isBuffer(body) || typeof body === 'string') req.end(body);
    else {
      req.setHeader('content-type', 'application/json');
      req.end(JSON.stringify(body));
    }
  });
}

/** Starts a process; returns its info. */
export async function run(
  g: Guest,
  body: Record<string, unknown>,
): Promise<{ pid: number } & Record<string, unknown>> {
  const r = await call(g, 'POST', '/processes', body);
  if (r.status !== 201) throw new Error(`start failed: ${r.status} ${r.body.toString()}`);
  return r.json() as { pid: number };
}

export interface Output {
  frames: Frame[];
  stdout: Buffer;
  stderr: Buffer;
  exit: Record<string, unknown> | undefined;
  /** Frame bytes received. */
  bytes: number;
  /** The raw frame-stream bytes received. */
  raw: Buffer;
}

/** Reads the output stream from `offset` until it ends (or `maxBytes` were received, then cuts it). */
export function readOutput(
  g: Guest,
  pid: number,
  offset = 0,
  maxBytes = Number.POSITIVE_INFINITY,
): Promise<Output> {
  return new Promise((resolve, reject) => {
    const decoder = new FrameDecoder();
    const frames: Frame[] = [];
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    let exit: Record<string, unknown> | undefined;
    let bytes = 0;
    const raw: Buffer[] = [];
    const finish = () =>
      resolve({
        frames,
        stdout: Buffer.concat(out),
        stderr: Buffer.concat(err),
        exit,
        bytes,
        raw: Buffer.concat(raw),
      });
    const req = httpRequest(
      `${g.base}/processes/${pid}/output?offset=${offset}`,
      { agent: false, headers: AUTH },
      (res) => {
        if (res.statusCode !== 200) {
          const chunks: Buffer[] = [];
          res.on('data', (c: Buffer) => chunks.push(c));
          res.on('end', () =>
            reject(new Error(`output ${res.statusCode}: ${Buffer.concat(chunks).toString()}`)),
          );
          return;
        }
        res.on('data', (c: Buffer) => {
          let chunk = c;
          if (bytes + chunk.length > maxBytes) chunk = chunk.subarray(0, maxBytes - bytes);
          bytes += chunk.length;
          raw.push(chunk);
          for (const f of decoder.push(chunk)) {
            frames.push(f);
            if (f.type === 1) out.push(f.payload);
            else if (f.type === 2) err.push(f.payload);
            else if (f.type === 3) exit = JSON.parse(f.payload.toString()) as Record<string, unknown>;
          }
          if (bytes >= maxBytes) {
            req.destroy();
            finish();
          }
        });
        res.on('end', finish);
        res.on('error', () => finish());
      },
    );
    req.on('error', (e) => (bytes >= maxBytes ? undefined : reject(e)));
    req.end();
  });
}

/** Percent-encodes a sandbox path for a query string. */
export function q(path: string): string {
  return encodeURIComponent(path);
}

/**
 * Opens `GET /fs/watch?<query>`; collects its events until `stop()` (`start` resolves `started`,
 * a refusal rejects it).
 */
export function openWatch(
  g: Guest,
  query: string,
): { events: WatchEvent[]; stop: () => void; started: Promise<void> } {
  const events: WatchEvent[] = [];
  let buf = '';
  let started!: () => void;
  let refused!: (e: Error) => void;
  const ready = new Promise<void>((resolve, reject) => {
    started = resolve;
    refused = reject;
  });
  const req = httpRequest(`${g.base}/fs/watch?${query}`, { agent: false, headers: AUTH }, (res) => {
    if (res.statusCode !== 200) refused(new Error(`watch answered ${res.statusCode}`));
    res.on('data', (c: Buffer) => {
      buf += c.toString();
      for (let i = buf.indexOf('\n'); i >= 0; i = buf.indexOf('\n')) {
        const line = buf.slice(0, i);
        if (res.statusCode !== 200) return;
        const e = JSON.parse(line) as WatchEvent;
        buf = buf.slice(i + 1);
        if (e.type === 'start') started();
        else events.push(e);
      }
    });
    res.on('error', () => {});
  });
  req.on('error', () => {});
  req.end();
  return { events, stop: () => req.destroy(), started: ready };
}
