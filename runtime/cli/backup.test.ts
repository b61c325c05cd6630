/**
 * `space backup` with real parts: redis-servers on loopback configured as deployed (AOF, a
 * password), a real Redis Sentinel, and s3rver as the S3-compatible store. Backup → object with its
 * SHA-256; restore → an exact copy (values, TTLs, keys made later gone), refused while an API is
 * connected; a changed object is refused; retention deletes only this deployment's old backups.
 */
import { type ChildProcess, execFile, spawn, spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { once } from 'node:events';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { GetObjectCommand, HeadObjectCommand, PutObjectCommand, S3Client } from '@aws-sdk/client-s3';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { REDIS_PERSISTENCE } from '../../providers/runtime-settings.ts';
import { freePort } from '../../test/redis-server.ts';
import { type S3Server, startS3Server } from '../../test/s3-server.ts';
import { runBackup, runRestore } from './backup.ts';
import { loadBackupConfig } from './backup-config.ts';
import { BackupStore, backupName, expired, takenAtOf } from './backup-store.ts';
import { CliError } from './output.ts';

const PASSWORD = 'pw-for-the-backup-command';
const CLI = new URL('./space.ts', import.meta.url).pathname;
const work = mkdtempSync(join(tmpdir(), 'space-backup-test-'));
const procs: ChildProcess[] = [];
let s3: S3Server;
beforeAll(async () => {
  s3 = await startS3Server();
});
afterAll(async () => {
  for (const p of procs) p.kill('SIGKILL');
  await s3?.stop();
  rmSync(work, { recursive: true, force: true });
});

/** redis-server as deployed (persistence settings, a password), or with `args` instead. */
async function redisServer(
  name: string,
  args: string[] = [],
): Promise<{ port: number; url: string; client: Redis }> {
  const port = await freePort();
  const dir = join(work, name);
  spawnSync('mkdir', ['-p', dir]);
  const p = spawn(
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
      '--masterauth',
      PASSWORD,
      ...args,
    ],
    { stdio: ['ignore', 'pipe', 'pipe'] },
  );
  procs.push(p);
  let out = '';
  p.stdout!.on('data', (d: Buffer) => (out += d));
  for (let i = 0; i < 200 && !out.includes('Ready to accept connections'); i++)
    await new Promise((r) => setTimeout(r, 50));
  if (!out.includes('Ready to accept connections')) throw new Error(`redis-server did not start:\n${out}`);
  const url = `redis://:${PASSWORD}@127.0.0.1:${port}`;
  return { port, url, client: new Redis(url, { maxRetriesPerRequest: 1 }) };
}

const s3client = () =>
  new S3Client({
    endpoint: s3.endpoint,
    region: 'us-east-1',
    forcePathStyle: true,
    credentials: { accessKeyId: 'S3RVER', secretAccessKey: 'S3RVER' },
  });

async function codeOf(p: Promise<unknown>): Promise<string> {
  try {
    await p;
  } catch (err) {
    if (err instanceof CliError) return err.code;
    throw err;
  }
  throw new Error('expected a refusal');
}

describe('space backup: a snapshot of the primary in an S3-compatible store, restored exactly', () => {
  it('backs up a live server (object with its SHA-256), restores an exact copy into another, and the copy survives a restart', async () => {
    const live = await redisServer('live');
    const keys = Array.from({ length: 1200 }, (_, i) => `space:v1:sandbox:sbx-${i}`);
    const w = live.client.pipeline();
    for (const k of keys) w.hset(k, { state: 'running', nodeId: 'node-1' });
    w.set('space:v1:lease:sbx-7', 'node-1', 'EX', 3600);
    w.zadd('space:v1:deadlines', 100, 'sbx-1', 200, 'sbx-2');
    w.xadd('space:v1:operations:queue', '*', 'op', 'x');
    // the deployment's own keys (the VM verify key, the target version)
    w.set('space:deploy:verify-key', 'key-of-the-old-control-vm');
    w.set('space:deploy:target-version', '1.0.0');
    await w.exec();
    const total = await live.client.dbsize();
    const c = loadBackupConfig({ ...s3.env('exact'), SPACE_REDIS_URL: live.url });
    const lines: string[] = [];
    const r = await runBackup(c, {}, (l) => lines.push(l));
    expect(r.keys).toBe(total);
    expect(r.source).toBe(`127.0.0.1:${live.port}`);
    expect(lines.join('\n')).toContain('redis-cli --rdb');

    // the object is there, and its metadata's SHA-256 is the SHA-256 of its bytes
    const s = s3client();
    const head = await s.send(new HeadObjectCommand({ Bucket: s3.bucket, Key: r.key }));
    expect(head.Metadata?.['sha256']).toBe(r.sha256);
    expect(head.Metadata?.['space-deployment']).toBe('exact');
    const body = await (
      await s.send(new GetObjectCommand({ Bucket: s3.bucket, Key: r.key }))
    ).Body!.transformToByteArray();
    expect(createHash('sha256').update(body).digest('hex')).toBe(r.sha256);
    expect(Buffer.from(body).subarray(0, 5).toString()).toBe('REDIS');
    s.destroy();

    // a fresh server holding other keys (made "after the backup") becomes an exact copy
    const fresh = await redisServer('fresh');
    await fresh.client.hset('space:v1:sandbox:sbx-made-later', { state: 'running' });
    await fresh.client.hset(keys[5]!, { state: 'killed' });
    // a rebuilt control VM published its new verify key before the restore: it stays
    await fresh.client.set('space:deploy:verify-key', 'key-of-the-new-control-vm');
    const rc = loadBackupConfig({ ...s3.env('exact'), SPACE_REDIS_URL: fresh.url });
    const out = await runRestore(rc, 'latest', () => {});
    expect(out).toMatchObject({ key: r.key, restored: total - 1, removed: 1, kept: 1 });
    const check = async (cl: Redis) => {
      expect(await cl.dbsize()).toBe(total);
      expect(await cl.hgetall(keys[5]!)).toEqual({ state: 'running', nodeId: 'node-1' });
      expect(await cl.exists('space:v1:sandbox:sbx-made-later')).toBe(0);
      expect(await cl.zrange('space:v1:deadlines', 0, -1)).toEqual(['sbx-1', 'sbx-2']);
      expect(await cl.xlen('space:v1:operations:queue')).toBe(1);
      expect(await cl.ttl('space:v1:lease:sbx-7')).toBeGreaterThan(3000);
      expect(await cl.get('space:deploy:verify-key')).toBe('key-of-the-new-control-vm');
      expect(await cl.get('space:deploy:target-version')).toBe('1.0.0');
    };
    await check(fresh.client);
    // the restore went through the server (its AOF), not into memory only
    await fresh.client.shutdown('NOSAVE').catch(() => {});
    fresh.client.disconnect();
    const again = await redisServer('fresh');
    await check(again.client);
    for (const x of [live, again]) x.client.disconnect();
  }, 60_000);

  it('counts the keys the snapshot holds, not the live database around it (writes go on during the backup)', async () => {
    const live = await redisServer('busy');
    const writer = live.client.duplicate();
    let writing = true;
    let n = 0;
    // a bounded stream of new keys for as long as the backup runs
    const writes = (async () => {
      while (writing && n < 200_000) await writer.set(`space:v1:k:${n++}`, 'v');
    })();
    await vi.waitFor(() => expect(n).toBeGreaterThan(100));
    const r = await runBackup(
      loadBackupConfig({ ...s3.env('busy'), SPACE_REDIS_URL: live.url }),
      {},
      () => {},
    );
    writing = false;
    await writes;
    writer.disconnect();
    expect(r.keys).toBeGreaterThan(100);
    expect(r.keys).toBeLessThan(n);
    const fresh = await redisServer('busy-copy');
    const out = await runRestore(
      loadBackupConfig({ ...s3.env('busy'), SPACE_REDIS_URL: fresh.url }),
      'latest',
      () => {},
    );
    expect(out).toMatchObject({ key: r.key, restored: r.keys, removed: 0 });
    expect(await fresh.client.dbsize()).toBe(r.keys);
    for (const x of [live, fresh]) x.client.disconnect();
  }, 60_000);

  it('a restore is refused while an API is connected to the target, and nothing is written', async () => {
    const src = await redisServer('src-writers');
    await src.client.set('space:v1:x', '1');
    await runBackup(loadBackupConfig({ ...s3.env('writers'), SPACE_REDIS_URL: src.url }), {}, () => {});
    const target = await redisServer('target-writers');
    await target.client.set('space:v1:y', '2');
    const api = new Redis(target.url, { connectionName: 'space-api' });
    await api.ping();
    const rc = loadBackupConfig({ ...s3.env('writers'), SPACE_REDIS_URL: target.url });
    expect(await codeOf(runRestore(rc, 'latest', () => {}))).toBe('BACKUP_WRITERS_RUNNING');
    expect(await target.client.keys('*')).toEqual(['space:v1:y']);
    api.disconnect();
    // an agent connected is no reason to refuse (nothing of the backup is ever missing); it is said
    const agent = new Redis(target.url, { connectionName: 'space-agent' });
    await agent.ping();
    const lines: string[] = [];
    await runRestore(rc, 'latest', (l) => lines.push(l));
    expect(lines.join('\n')).toMatch(/1 agent connection/);
    expect(await target.client.keys('*')).toEqual(['space:v1:x']);
    for (const x of [agent, src.client, target.client]) x.disconnect();
  }, 60_000);

  it('an object that changed after it was written, or carries no checksum, is refused with BACKUP_CORRUPT and nothing is restored', async () => {
    const src = await redisServer('src-corrupt');
    await src.client.set('space:v1:k', 'v'.repeat(1000));
    const c = loadBackupConfig({ ...s3.env('corrupt'), SPACE_REDIS_URL: src.url });
    const r = await runBackup(c, {}, () => {});
    const target = await redisServer('target-corrupt');
    await target.client.set('space:v1:untouched', '1');
    const rc = loadBackupConfig({ ...s3.env('corrupt'), SPACE_REDIS_URL: target.url });
    const s = s3client();
    const bytes = Buffer.from(
      await (
        await s.send(new GetObjectCommand({ Bucket: s3.bucket, Key: r.key }))
      ).Body!.transformToByteArray(),
    );
    // variants: one flipped bit in the middle; the last byte (the RDB's own CRC64) changed; truncated
    const flipped = Buffer.from(bytes);
    flipped[Math.floor(bytes.length / 2)]! ^= 0x01;
    const lastByte = Buffer.from(bytes);
    lastByte[bytes.length - 1]! ^= 0xff;
    for (const changed of [flipped, lastByte, bytes.subarray(0, bytes.length - 10)]) {
      await s.send(
        new PutObjectCommand({
          Bucket: s3.bucket,
          Key: r.key,
          Body: changed,
          Metadata: { sha256: r.sha256 },
        }),
      );
      const err = await runRestore(rc, r.key, () => {}).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(CliError);
      expect((err as CliError).code).toBe('BACKUP_CORRUPT');
      expect((err as CliError).message).toMatch(/does not match its checksum.*nothing was restored/);
    }
    // a backup-shaped object without a checksum (not written by space backup)
    const foreign = `space-backups/corrupt/${backupName(new Date(Date.now() + 60_000))}`;
    await s.send(new PutObjectCommand({ Bucket: s3.bucket, Key: foreign, Body: bytes }));
    expect(await codeOf(runRestore(rc, 'latest', () => {}))).toBe('BACKUP_CORRUPT');
    expect(await codeOf(runRestore(rc, 'redis-20200101T000000000Z.rdb', () => {}))).toBe('BACKUP_NOT_FOUND');
    // an object whose checksum matches but which is no RDB at all (a wrong file uploaded with it)
    const notRdb = Buffer.from('PK\x03\x04 not a redis snapshot');
    await s.send(
      new PutObjectCommand({
        Bucket: s3.bucket,
        Key: foreign,
        Body: notRdb,
        Metadata: { sha256: createHash('sha256').update(notRdb).digest('hex') },
      }),
    );
    const wrong = await runRestore(rc, foreign, () => {}).catch((e: unknown) => e);
    expect((wrong as CliError).code).toBe('BACKUP_CORRUPT');
    expect((wrong as CliError).message).toMatch(/is not an RDB file although its checksum matches/);
    expect(await target.client.keys('*')).toEqual(['space:v1:untouched']);
    s.destroy();
    for (const x of [src, target]) x.client.disconnect();
  }, 60_000);

  it('retention deletes only this deployment’s backups past it, never another’s or other objects', async () => {
    const src = await redisServer('src-retention');
    await src.client.set('space:v1:k', 'v');
    const env = { ...s3.env('ret-a'), SPACE_REDIS_URL: src.url, SPACE_BACKUP_KEEP_LAST: '0' };
    const c = loadBackupConfig(env);
    const day = 86_400_000;
    const base = Date.parse('2026-11-01T03:00:00Z');
    const made: string[] = [];
    for (let i = 0; i < 6; i++)
      made.push(
        (
          await runBackup(
            c,
            {},
            () => {},
            () => new Date(base + i * day),
          )
        ).key,
      );
    // another deployment in the same bucket and prefix, and objects that are not backups
    const other = loadBackupConfig({
      ...s3.env('ret-b'),
      SPACE_REDIS_URL: src.url,
      SPACE_BACKUP_KEEP_LAST: '0',
    });
    const otherKey = (
      await runBackup(
        other,
        {},
        () => {},
        () => new Date(base),
      )
    ).key;
    const s = s3client();
    const strangers = [
      'space-backups/ret-a/notes.txt',
      'space-backups/ret-a/redis-latest.rdb',
      'elsewhere/ret-a/x',
    ];
    for (const Key of strangers) await s.send(new PutObjectCommand({ Bucket: s3.bucket, Key, Body: 'x' }));

    // keep the newest 2 or anything younger than 3 days at "now" = the last backup + 12 h
    const store = new BackupStore(c);
    const now = new Date(base + 5 * day + 12 * 3_600_000);
    const old = expired(await store.list(), 2, 3, now).map((b) => b.key);
    expect(old).toEqual([made[2], made[1], made[0]]);
    const r = await runBackup(
      c,
      { keepLast: 2, keepDays: 0 },
      () => {},
      () => new Date(base + 6 * day),
    );
    expect(r.pruned.sort()).toEqual(made.slice(0, 5).sort());
    expect((await store.list()).map((b) => b.key)).toEqual([made[5], r.key]);
    store.close();
    // the other deployment's backup and the strangers are all still there
    for (const Key of [otherKey, ...strangers])
      expect((await s.send(new HeadObjectCommand({ Bucket: s3.bucket, Key }))).ContentLength).toBeGreaterThan(
        0,
      );
    s.destroy();
    src.client.disconnect();
  }, 120_000);

  it('with a redis-sentinel:// URL it asks the sentinels for the primary and snapshots that one, past a sentinel that is down', async () => {
    const primary = await redisServer('sentinel-primary');
    const replica = await redisServer('sentinel-replica');
    await replica.client.replicaof('127.0.0.1', primary.port);
    await primary.client.set('space:v1:on-primary', '1');
    const sport = await freePort();
    const conf = join(work, 'sentinel.conf');
    writeFileSync(
      conf,
      [
        `port ${sport}`,
        'bind 127.0.0.1',
        `dir ${work}`,
        `sentinel monitor space-primary 127.0.0.1 ${primary.port} 1`,
        `sentinel auth-pass space-primary ${PASSWORD}`,
        '',
      ].join('\n'),
    );
    const sentinel = spawn('redis-server', [conf, '--sentinel'], { stdio: ['ignore', 'pipe', 'pipe'] });
    procs.push(sentinel);
    const deadPort = await freePort();
    const url = `redis-sentinel://:${PASSWORD}@127.0.0.1:${deadPort},127.0.0.1:${sport}/space-primary?sentinelPassword=`;
    const c = loadBackupConfig({ ...s3.env('sentinel'), SPACE_REDIS_URL: url });
    let r: Awaited<ReturnType<typeof runBackup>> | undefined;
    for (let i = 0; i < 50 && !r; i++) {
      r = await runBackup(c, {}, () => {}).catch(async (e: unknown) => {
        if (!(e instanceof CliError) || e.code !== 'BACKUP_SOURCE_UNAVAILABLE') throw e;
        await new Promise((res) => setTimeout(res, 100)); // the sentinel is still starting
        return undefined;
      });
    }
    expect(r?.source).toBe(`127.0.0.1:${primary.port}`);
    expect(r?.keys).toBe(1);
    // a server that is not the primary is never snapshotted
    const direct = loadBackupConfig({ ...s3.env('sentinel'), SPACE_REDIS_URL: replica.url });
    expect(await codeOf(runBackup(direct, {}, () => {}))).toBe('BACKUP_SOURCE_UNAVAILABLE');
    sentinel.kill('SIGTERM');
    await once(sentinel, 'exit');
    for (const x of [primary, replica]) x.client.disconnect();
  }, 60_000);

  it('as the space CLI: --json answers on stdout, progress and coded errors on stderr, exit 125 on a refusal', async () => {
    const src = await redisServer('src-cli');
    await src.client.set('space:v1:k', 'v');
    // not spawnSync: s3rver answers from this process's event loop
    const cli = async (env: Record<string, string>, ...args: string[]) =>
      new Promise<{ status: number | null; stdout: string; stderr: string }>((resolve) => {
        execFile(
          process.execPath,
          [CLI, 'backup', ...args],
          { encoding: 'utf8', env: { PATH: process.env['PATH'] ?? '/usr/bin:/bin', ...env } },
          (err, stdout, stderr) =>
            resolve({ status: err ? (typeof err.code === 'number' ? err.code : null) : 0, stdout, stderr }),
        );
      });
    const env = { ...s3.env('cli'), SPACE_REDIS_URL: src.url };
    const none = await cli({}, 'list', '--json');
    expect(none.status).toBe(125);
    expect(JSON.parse(none.stderr).error.code).toBe('BACKUP_NOT_CONFIGURED');
    for (let i = 0; i < 2; i++) {
      const ran = await cli(env, 'run', '--json');
      expect(ran.status, ran.stderr).toBe(0);
      expect(JSON.parse(ran.stdout)).toMatchObject({ keys: 1, source: `127.0.0.1:${src.port}` });
      expect(
        ran.stderr
          .split('\n')
          .filter(Boolean)
          .map((l) => Object.keys(JSON.parse(l))),
      ).toContainEqual(['progress']);
    }
    const listed = JSON.parse((await cli(env, 'list', '--json')).stdout) as { backups: { key: string }[] };
    expect(listed.backups).toHaveLength(2);
    for (const b of listed.backups) expect(b.key).toMatch(/^space-backups\/cli\/redis-/);
    const dry = JSON.parse((await cli(env, 'prune', '--keep-last', '1', '--dry-run', '--json')).stdout);
    expect(dry).toEqual({ deleted: [], wouldDelete: [listed.backups[0]!.key] });
    expect(JSON.parse((await cli(env, 'list', '--json')).stdout).backups).toHaveLength(2);
    const bad = await cli(env, 'prune', '--keep-last', 'many');
    expect(bad.status).toBe(125);
    expect(bad.stderr).toMatch(/--keep-last takes a whole number/);
    src.client.disconnect();
  }, 120_000);

  it('without a bucket every command refuses with BACKUP_NOT_CONFIGURED; bad settings are named', () => {
    expect(() => loadBackupConfig({})).toThrow(expect.objectContaining({ code: 'BACKUP_NOT_CONFIGURED' }));
    expect(() =>
      loadBackupConfig({
        SPACE_BACKUP_S3_BUCKET: 'b',
        SPACE_BACKUP_S3_ACCESS_KEY_ID: 'k',
        SPACE_BACKUP_DEPLOYMENT: 'a/b',
      }),
    ).toThrow(/SPACE_BACKUP_DEPLOYMENT.*\n.*set both or neither/s);
    expect(() =>
      loadBackupConfig({ SPACE_BACKUP_S3_BUCKET: 'b', SPACE_BACKUP_S3_ENDPOINT: 'ftp://x' }),
    ).toThrow(/SPACE_BACKUP_S3_ENDPOINT/);
  });
});

describe('backup names and retention rules', () => {
  const at = (iso: string) => ({ key: `p/d/${backupName(new Date(iso))}`, takenAt: iso, size: 1 });
  const list = [
    at('2026-11-01T00:00:00.000Z'),
    at('2026-11-02T00:00:00.000Z'),
    at('2026-11-03T00:00:00.000Z'),
    at('2026-11-04T00:00:00.000Z'),
  ];
  const now = new Date('2026-11-04T12:00:00.000Z');
  const keys = (b: { takenAt: string }[]) => b.map((x) => x.takenAt.slice(0, 10));

  it('names sort by time and read back; other names are not backups', () => {
    const d = new Date('2026-12-07T15:04:05.678Z');
    expect(backupName(d)).toBe('redis-20261207T150405678Z.rdb');
    expect(takenAtOf(backupName(d))?.toISOString()).toBe(d.toISOString());
    for (const n of [
      'redis-latest.rdb',
      'redis-20261207T150405678Z.rdb.tmp',
      'x/redis-20261207T150405678Z.rdb',
    ])
      expect(takenAtOf(n)).toBeNull();
  });

  it('keeps the newest N, or those younger than N days, or either; never the newest; nothing with no rule', () => {
    expect(keys(expired(list, 2, 0, now))).toEqual(['2026-11-02', '2026-11-01']);
    expect(keys(expired(list, 0, 2, now))).toEqual(['2026-11-02', '2026-11-01']);
    expect(keys(expired(list, 1, 3, now))).toEqual(['2026-11-01']);
    expect(keys(expired(list, 3, 1, now))).toEqual(['2026-11-01']);
    expect(expired(list, 0, 0, now)).toEqual([]);
    // all older than the age rule: the newest stays anyway
    expect(keys(expired(list, 0, 1, new Date('2027-01-01T00:00:00Z')))).toEqual([
      '2026-11-03',
      '2026-11-02',
      '2026-11-01',
    ]);
  });
});
