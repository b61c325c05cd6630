/**
 * Backup and restore of SPACE's Redis with real redis-servers on loopback, configured as the
 * deployment runs them (AOF on, a password): back up a live server, lose it, restore into a fresh
 * one, check every key, value and TTL; then restart the restored server from its own files and
 * check the data is still there (the restore went into its AOF, not into memory only).
 */
import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { afterAll, describe, expect, it } from 'vitest';
import { REDIS_PERSISTENCE } from '../providers/runtime-settings.ts';
import { freePort } from '../test/redis-server.ts';

const SCRIPT = new URL('./redis-backup.sh', import.meta.url).pathname;
const PASSWORD = 'pw-for-the-backup-test';
const work = mkdtempSync(join(tmpdir(), 'space-redis-backup-'));
const started: ChildProcess[] = [];
afterAll(() => {
  for (const p of started) p.kill('SIGKILL');
  rmSync(work, { recursive: true, force: true });
});

/** redis-server as the deployment runs it (its persistence settings and a password), in `dir`. */
async function server(dir: string, port: number): Promise<{ client: Redis; stop: () => Promise<void> }> {
  execFileSync('mkdir', ['-p', dir]);
  const proc = spawn(
    'redis-server',
    [
      '--port',
      String(port),
      '--bind',
      '127.0.0.1',
      '--dir',
      dir,
      ...REDIS_PERSISTENCE.flatMap(([k, v]) => [`--${k}`, v]),
      '--requirepass',
      PASSWORD,
    ],
    { stdio: ['ignore', 'pipe', 'pipe'] },
  );
  started.push(proc);
  let out = '';
  proc.stdout!.on('data', (d: Buffer) => (out += d));
  for (let i = 0; i < 100 && !out.includes('Ready to accept connections'); i++)
    await new Promise((r) => setTimeout(r, 50));
  if (!out.includes('Ready to accept connections')) throw new Error(`redis-server did not start:\n${out}`);
  const client = new Redis({
    port,
    host: '127.0.0.1',
    password: PASSWORD,
    lazyConnect: true,
    maxRetriesPerRequest: 1,
  });
  await client.connect();
  return {
    client,
    stop: async () => {
      client.disconnect();
      proc.kill('SIGTERM'); // Redis flushes its AOF on SIGTERM
      await once(proc, 'exit');
    },
  };
}

const run = async (cmd: string, file: string, port: number) =>
  execFileSync('sh', [SCRIPT, cmd, file], {
    env: {
      PATH: process.env['PATH'] ?? '/usr/bin:/bin',
      REDIS_PORT: String(port),
      REDISCLI_AUTH: PASSWORD,
      RESTORE_PORT: String(await freePort()),
    },
    encoding: 'utf8',
    stdio: ['ignore', 'pipe', 'pipe'],
  });

describe('Redis backup and restore (scripts/redis-backup.sh) with real redis-servers', () => {
  it('backs up a live server, restores into a fresh one with every key, value and TTL, and the restore survives a restart', async () => {
    const livePort = await freePort();
    const live = await server(join(work, 'live'), livePort);
    // SPACE-shaped state: hashes, sets, sorted sets, a stream, TTLs
    const keys = Array.from({ length: 250 }, (_, i) => `space:v1:{s}:sandbox:sbx-${i}`);
    for (const k of keys) await live.client.hset(k, { state: 'running', node: 'node-1' });
    await live.client.set('space:v1:lease:sbx-7', 'node-1', 'EX', 3600);
    await live.client.zadd('space:v1:{s}:deadlines', 100, 'sbx-1', 200, 'sbx-2');
    await live.client.sadd('space:v1:nodes', 'node-1', 'node-2');
    await live.client.xadd('space:v1:events', '*', 'type', 'created');
    const before = await live.client.dbsize();

    const file = join(work, 'backup.rdb');
    await run('backup', file, livePort);
    await live.stop(); // the live server is lost

    const freshPort = await freePort();
    const freshDir = join(work, 'fresh');
    const fresh = await server(freshDir, freshPort);
    expect(await fresh.client.dbsize()).toBe(0);
    const out = await run('restore', file, freshPort);
    expect(out).toContain(`restored ${before} keys`);

    const check = async (c: Redis) => {
      expect(await c.dbsize()).toBe(before);
      expect(await c.hgetall(keys[123]!)).toEqual({ state: 'running', node: 'node-1' });
      expect(await c.zrange('space:v1:{s}:deadlines', 0, -1, 'WITHSCORES')).toEqual([
        'sbx-1',
        '100',
        'sbx-2',
        '200',
      ]);
      expect((await c.smembers('space:v1:nodes')).sort()).toEqual(['node-1', 'node-2']);
      expect(await c.xlen('space:v1:events')).toBe(1);
      const ttl = await c.ttl('space:v1:lease:sbx-7');
      expect(ttl).toBeGreaterThan(3000);
    };
    await check(fresh.client);

    // restart from its own files: the restored data is in its AOF
    await fresh.stop();
    const again = await server(freshDir, freshPort);
    await check(again.client);
    await again.stop();
  }, 30_000);
});
