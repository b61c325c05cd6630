/**
 * `space up`'s process supervision: each service a child in its own process group with its log
 * file (and, with --verbose, its lines on our stderr), stopped by SIGTERM then SIGKILL after a
 * per-service timeout ({@link STOP_TIMEOUT_MS}); readiness polls (Redis PING, HTTP 200 on a URL)
 * until a deadline (`START_TIMEOUT`); and what is shown when one dies (the tail of its log).
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { closeSync, createWriteStream, fstatSync, openSync, readdirSync, readFileSync } from 'node:fs';
import { connect } from 'node:net';
import { constants as osConstants } from 'node:os';
import { createInterface } from 'node:readline';
import { setTimeout as sleep } from 'node:timers/promises';
import { request } from 'undici';
import { parseStat } from '../core/proc-stat.ts';
import { CliError, note } from './output.ts';
import { LOCAL_HOST as HOST } from './up-host.ts';

/** How long each child gets to stop after SIGTERM before SIGKILL, ms. */
export const STOP_TIMEOUT_MS = {
  router: 15_000,
  agent: 120_000,
  gateway: 15_000,
  api: 15_000,
  redis: 15_000,
} as const;

/** Answers true once `redis-cli PING` would (speaks RESP directly; LOADING counts as not yet). */
export function redisPing(port: number, host = HOST): Promise<boolean> {
  return new Promise((resolve) => {
    const sock = connect({ port, host });
    let buf = '';
    const done = (ok: boolean) => {
      sock.destroy();
      resolve(ok);
    };
    sock.setTimeout(1000, () => done(false));
    sock.once('error', () => done(false));
    sock.once('connect', () => sock.write('PING\r\n'));
    sock.on('data', (d) => {
      buf += d.toString();
      if (buf.includes('\r\n')) done(buf.startsWith('+PONG'));
    });
  });
}

/** True when GET `url` answers 200 within 2 s (headers and body each). */
export async function httpOk(url: string): Promise<boolean> {
  try {
    const res = await request(url, { headersTimeout: 2000, bodyTimeout: 2000 });
    await res.body.text();
    return res.statusCode === 200;
  } catch {
    return false;
  }
}

/**
 * Polls `check` every 200 ms until it answers true; returns early once `signal` is aborted.
 * @throws CliError START_TIMEOUT (naming `what`) after `timeoutMs`.
 */
export async function until(
  what: string,
  timeoutMs: number,
  check: () => Promise<boolean>,
  signal?: AbortSignal,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (signal?.aborted) return;
    if (await check()) return;
    await sleep(200);
  }
  throw new CliError('START_TIMEOUT', `${what} was not ready after ${Math.round(timeoutMs / 1000)} s`);
}

/** The last `n` lines of `file` from byte `from` on. */
export function logTail(file: string, from: number, n = 25): string[] {
  try {
    const text = readFileSync(file).subarray(from).toString('utf8');
    return text.split('\n').filter(Boolean).slice(-n);
  } catch {
    return [];
  }
}

/**
 * Pids of the live children of process `parent` whose command line contains `marker`, read from
 * `/proc`. Empty when there are none or `parent` is unknown.
 */
export function childPids(parent: number | undefined, marker: string): number[] {
  if (parent === undefined) return [];
  const found: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const proc = parseStat(readFileSync(`/proc/${entry}/stat`, 'utf8'));
      if (proc?.ppid !== parent || proc.zombie) continue;
      if (readFileSync(`/proc/${entry}/cmdline`, 'utf8').includes(marker)) found.push(proc.pid);
    } catch {
      // exited meanwhile
    }
  }
  return found;
}

/** The name of signal number `n` (`SIGKILL` for 9), if it is one. */
export function signalName(n: number): string | undefined {
  return Object.entries(osConstants.signals).find(([, v]) => v === n)?.[0];
}

/** SIGKILL to `pid`, ignoring a process that is already gone. */
function killQuietly(pid: number): void {
  try {
    process.kill(pid, 'SIGKILL');
  } catch {
    // gone
  }
}

/** One supervised child process with its log file. */
export class Child {
  readonly name: string;
  readonly logFile: string;
  readonly logStart: number;
  readonly proc: ChildProcess;
  readonly exited: Promise<{ code: number | null; signal: string | null; error?: string }>;
  /** The service's own program when `file` is a wrapper that runs it (its child): tini. */
  readonly service: string | undefined;
  done = false;

  constructor(
    name: string,
    file: string,
    args: string[],
    env: NodeJS.ProcessEnv,
    logFile: string,
    verbose: boolean,
    service?: string,
  ) {
    this.name = name;
    this.service = service;
    this.logFile = logFile;
    const fd = openSync(logFile, 'a', 0o600);
    this.logStart = fstatSync(fd).size;
    if (verbose) {
      closeSync(fd);
      this.proc = spawn(file, args, { env, detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
      const log = createWriteStream(logFile, { flags: 'a' });
      for (const s of [this.proc.stdout!, this.proc.stderr!]) {
        s.pipe(log, { end: false });
        createInterface({ input: s }).on('line', (line) =>
          process.stderr.write(`${name.padEnd(5)}| ${line}\n`),
        );
      }
      this.proc.once('close', () => log.end());
    } else {
      this.proc = spawn(file, args, { env, detached: true, stdio: ['ignore', fd, fd] });
      closeSync(fd);
    }
    this.exited = new Promise((resolve) => {
      this.proc.once('error', (err) => {
        this.done = true;
        resolve({ code: null, signal: null, error: err.message });
      });
      this.proc.once('exit', (code, signal) => {
        this.done = true;
        // tini exits 128 + n when signal n ended the service it runs: say which signal
        const passed = service && code !== null && code > 128 ? signalName(code - 128) : undefined;
        resolve(passed ? { code: null, signal: passed } : { code, signal });
      });
    });
  }

  /** SIGTERM, wait up to `timeoutMs`, then SIGKILL. */
  async stop(timeoutMs: number): Promise<void> {
    if (this.done) return;
    this.proc.kill('SIGTERM');
    const t = sleep(timeoutMs).then(() => 'timeout' as const);
    if ((await Promise.race([this.exited, t])) === 'timeout') {
      note(`space: ${this.name} did not stop within ${Math.round(timeoutMs / 1000)} s; killing it`);
      // a service under a wrapper (the agent under tini): tini cannot pass SIGKILL on, so the
      // service is killed first, by itself (the sandboxes tini reaps for are not its to end)
      if (this.service) for (const pid of childPids(this.proc.pid, this.service)) killQuietly(pid);
      this.proc.kill('SIGKILL');
      await this.exited;
    }
  }
}

/** Why the stack stops: a signal to us, or a child that exited on its own. */
export type StopReason = { kind: 'signal'; signal: string } | { kind: 'died'; child: Child; how: string };

/** Thrown by a start step that a stop reason overtook. */
export class StopFirst extends Error {
  readonly reason: StopReason;
  constructor(reason: StopReason) {
    super('stopped');
    this.reason = reason;
  }
}
