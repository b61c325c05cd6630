/**
 * The router as its own process (`node runtime/router/server.ts`), as deployments run it: the
 * router int tests and the router benchmark start it this way so its memory (RSS, peak RSS) is
 * its own, readable from `/proc/<pid>/status`.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { once } from 'node:events';
import { readFile } from 'node:fs/promises';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { Agent, request } from 'undici';

/** A router child process. */
export interface RouterProcess {
  url: string;
  pid: number;
  /** Resident set size now and its peak since start (`VmRSS`, `VmHWM`), bytes. */
  memory(): Promise<{ rss: number; peak: number }>;
  /** Text of `/metrics`. */
  metrics(): Promise<string>;
  /** SIGTERM, then SIGKILL after 10 s. */
  stop(): Promise<void>;
}

const SERVER = fileURLToPath(new URL('../runtime/router/server.ts', import.meta.url));

/**
 * Starts a router with `env` (SPACE_ROUTER_*, SPACE_REDIS_URL, SPACE_VERIFY_KEY_FILE) and waits up
 * to 20 s for `/healthz`. `ca` (PEM) is trusted for the health check when TLS is on.
 * @throws Error when it exits or does not answer in time (with its output).
 */
export async function startRouterProcess(env: Record<string, string>, ca?: Buffer): Promise<RouterProcess> {
  const proc: ChildProcess = spawn(process.execPath, [SERVER], {
    env: { PATH: process.env.PATH ?? '', SPACE_LOG_LEVEL: 'warn', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  proc.stdout?.on('data', (d: Buffer) => {
    output = (output + d.toString()).slice(-4000);
  });
  proc.stderr?.on('data', (d: Buffer) => {
    output = (output + d.toString()).slice(-4000);
  });
  const exited = once(proc, 'exit');
  const tls = Boolean(env.SPACE_ROUTER_TLS_CERT_FILE);
  const url = `${tls ? 'https' : 'http'}://${env.SPACE_ROUTER_HOST ?? '127.0.0.1'}:${env.SPACE_ROUTER_PORT}`;
  const dispatcher = new Agent(ca ? { connect: { ca } } : {});
  try {
    for (let i = 0; i < 200; i++) {
      if (proc.exitCode !== null) throw new Error(`router exited (${proc.exitCode}): ${output}`);
      const ok = await request(`${url}/healthz`, { dispatcher })
        .then(async (r) => {
          await r.body.text();
          return r.statusCode === 200;
        })
        .catch(() => false);
      if (ok) break;
      if (i === 199) throw new Error(`router did not answer /healthz: ${output}`);
      await sleep(100);
    }
  } catch (err) {
    proc.kill('SIGKILL');
    throw err;
  } finally {
    await dispatcher.close();
  }
  const field = (status: string, name: string) =>
    Number(new RegExp(`^${name}:\\s+(\\d+) kB`, 'm').exec(status)?.[1] ?? Number.NaN) * 1024;
  return {
    url,
    pid: proc.pid!,
    async memory() {
      const status = await readFile(`/proc/${proc.pid}/status`, 'utf8');
      return { rss: field(status, 'VmRSS'), peak: field(status, 'VmHWM') };
    },
    async metrics() {
      const d = new Agent(ca ? { connect: { ca } } : {});
      try {
        const r = await request(`${url}/metrics`, { dispatcher: d });
        return await r.body.text();
      } finally {
        await d.close();
      }
    },
    async stop() {
      if (proc.exitCode !== null) return;
      proc.kill('SIGTERM');
      const timer = setTimeout(() => proc.kill('SIGKILL'), 10_000);
      await exited;
      clearTimeout(timer);
    },
  };
}

/** Sum of a Prometheus metric's samples in `text` whose labels contain `match` (e.g. `outcome="resumed"`). */
export function metricValue(text: string, name: string, match = ''): number {
  let sum = 0;
  for (const line of text.split('\n')) {
    if (!line.startsWith(name)) continue;
    const rest = line.slice(name.length);
    if (!(rest.startsWith(' ') || rest.startsWith('{'))) continue;
    if (match && !rest.includes(match)) continue;
    sum += Number(line.split(' ').pop());
  }
  return sum;
}
