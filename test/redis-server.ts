/** Starts a throwaway real `redis-server` on a free loopback port (no persistence). */
import { type ChildProcess, spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { freeLoopbackPort } from '../runtime/cli/up-host.ts';

/** A free TCP port on 127.0.0.1 (asks the kernel). */
export const freePort = freeLoopbackPort;

export interface RedisServer {
  url: string;
  stop(): Promise<void>;
}

/** Spawns redis-server and resolves once it accepts connections. Throws if it can't start. */
export async function startRedisServer(): Promise<RedisServer> {
  const port = await freePort();
  const dir = await mkdtemp(join(tmpdir(), 'space-redis-'));
  const proc: ChildProcess = spawn(
    'redis-server',
    ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', dir],
    { stdio: ['ignore', 'pipe', 'pipe'] },
  );
  let out = '';
  proc.stdout?.on('data', (d: Buffer) => (out += d.toString()));
  const ready = new Promise<void>((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`redis-server did not start:\n${out}`)), 10_000);
    proc.stdout?.on('data', () => {
      if (out.includes('Ready to accept connections')) {
        clearTimeout(t);
        resolve();
      }
    });
    proc.once('exit', (code) => {
      clearTimeout(t);
      reject(new Error(`redis-server exited with ${code}:\n${out}`));
    });
  });
  await ready;
  return {
    url: `redis://127.0.0.1:${port}`,
    async stop() {
      if (proc.exitCode === null) {
        proc.kill('SIGTERM');
        await once(proc, 'exit');
      }
      await rm(dir, { recursive: true, force: true });
    },
  };
}
