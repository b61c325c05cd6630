/**
 * The Redis half of `space backup`: which server is the primary, a consistent snapshot of it, and
 * loading a snapshot back.
 *
 * Snapshot: `redis-cli --rdb` against the primary. The server forks and streams the RDB it would
 * send a replica for a full resynchronisation (Redis 7: `REPLCONF rdb-only 1` then `SYNC`), so the
 * file is one point in time, made by the server itself, in its own RDB version, without touching
 * its files or its AOF (redis.io/docs/latest/develop/tools/cli/, "Remote backups of RDB files").
 * Speaking the replication protocol from here would mean parsing both of its transfer forms (sized
 * and diskless `$EOF:` framing) for nothing redis-cli does not already do; redis-cli is on every
 * machine that runs SPACE's Redis or image (host-deps.sh, the control VM's redis-server package).
 *
 * Restore: a snapshot cannot be loaded into a live server with AOF on (it ignores a dump.rdb at
 * start). It is loaded into a throwaway `redis-server` on a loopback port, and every key is copied
 * into the target with `DUMP`/`RESTORE … REPLACE` (TTLs kept) through the same client every service
 * uses (Sentinel URLs included), so the writes land in the target's AOF and reach its replicas.
 * Keys of the snapshot are written first, keys the snapshot lacks are deleted after: at no moment
 * does a record of the snapshot go missing from the target (an agent reconciling meanwhile would
 * destroy a sandbox whose record it cannot find). The deployment's own keys the target holds are
 * left alone ({@link DEPLOYMENT_KEY_PREFIX}).
 */
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { open } from 'node:fs/promises';
import { Redis } from 'ioredis';
import {
  parseRedisUrl,
  type RedisEndpoint,
  redactRedisUrl,
  redisConnection,
  sentinelPasswordOf,
} from '../core/redis-connection.ts';
import { CliError } from './output.ts';
import { freeLoopbackPort } from './up-host.ts';

/** Where to reach one Redis server, with its credentials. */
export interface ServerAddress {
  /** `host:port`, or a socket path. */
  label: string;
  host?: string;
  port?: number;
  path?: string;
  tls: boolean;
  username?: string;
  password?: string;
  db: number;
}

/** Names the SPACE services give their Redis connections (`CLIENT SETNAME`). */
export const API_CONNECTION_NAME = 'space-api';
export const AGENT_CONNECTION_NAME = 'space-agent';

/**
 * The server that holds the data of `url` now: the URL's own server, or for `redis-sentinel://` the
 * primary the first answering sentinel names (`SENTINEL GET-MASTER-ADDR-BY-NAME`).
 * @throws CliError BACKUP_SOURCE_UNAVAILABLE when no sentinel answers or none knows the name.
 */
export async function primaryOf(url: string): Promise<ServerAddress> {
  const e = parseRedisUrl(url);
  if (e.kind === 'socket') return { label: e.path, path: e.path, tls: false, db: 0 };
  if (e.kind === 'direct') {
    const u = new URL(e.url);
    const port = Number(u.port || 6379);
    const host = u.hostname.replace(/^\[|\]$/g, '');
    return {
      label: `${host}:${port}`,
      host,
      port,
      tls: u.protocol === 'rediss:',
      ...(u.username ? { username: decodeURIComponent(u.username) } : {}),
      ...(u.password ? { password: decodeURIComponent(u.password) } : {}),
      db: Number(u.pathname.slice(1) || 0),
    };
  }
  return askSentinels(e);
}

async function askSentinels(e: Extract<RedisEndpoint, { kind: 'sentinel' }>): Promise<ServerAddress> {
  const sentinelPassword = sentinelPasswordOf(e);
  const tried: string[] = [];
  for (const s of e.sentinels) {
    const client = new Redis({
      host: s.host,
      port: s.port,
      lazyConnect: true,
      maxRetriesPerRequest: 0,
      retryStrategy: () => null,
      connectTimeout: 3000,
      ...(sentinelPassword ? { password: sentinelPassword } : {}),
    });
    client.on('error', () => {});
    try {
      await client.connect();
      const addr = (await client.call('SENTINEL', 'GET-MASTER-ADDR-BY-NAME', e.primaryName)) as
        | [string, string]
        | null;
      if (addr) {
        const [host, port] = addr;
        return {
          label: `${host}:${port}`,
          host,
          port: Number(port),
          tls: false,
          ...(e.username ? { username: e.username } : {}),
          ...(e.password ? { password: e.password } : {}),
          db: e.db,
        };
      }
      tried.push(`${s.host}:${s.port} (knows no primary "${e.primaryName}")`);
    } catch (err) {
      tried.push(`${s.host}:${s.port} (${(err as Error).message})`);
    } finally {
      client.disconnect();
    }
  }
  throw new CliError('BACKUP_SOURCE_UNAVAILABLE', `no sentinel named the primary: ${tried.join('; ')}`);
}

/** A plain client of one server (no Sentinel), for checks and the throwaway server. */
function clientOf(a: ServerAddress): Redis {
  return new Redis({
    ...(a.path ? { path: a.path } : { host: a.host!, port: a.port! }),
    ...(a.tls ? { tls: {} } : {}),
    ...(a.username ? { username: a.username } : {}),
    ...(a.password ? { password: a.password } : {}),
    db: a.db,
    lazyConnect: true,
    maxRetriesPerRequest: 1,
    retryStrategy: () => null,
  });
}

/**
 * Takes a snapshot of `server` into `file` with `redis-cli --rdb`, after checking that the
 * server is a primary (`ROLE`). What the snapshot holds is counted by loading it
 * ({@link snapshotKeys}): a `DBSIZE` read around it counts a live database at another moment.
 * @throws CliError BACKUP_SOURCE_UNAVAILABLE when the server cannot be reached or is not a
 * primary, BACKUP_SNAPSHOT_FAILED when redis-cli fails.
 */
export async function snapshot(server: ServerAddress, file: string): Promise<void> {
  const c = clientOf(server);
  c.on('error', () => {});
  try {
    await c.connect();
    const role = (await c.call('ROLE')) as [string, ...unknown[]];
    if (role[0] !== 'master')
      throw new CliError(
        'BACKUP_SOURCE_UNAVAILABLE',
        `${server.label} is a ${role[0]}, not the primary (a failover under way?)`,
      );
  } catch (err) {
    if (err instanceof CliError) throw err;
    throw new CliError('BACKUP_SOURCE_UNAVAILABLE', `Redis at ${server.label}: ${(err as Error).message}`);
  } finally {
    c.disconnect();
  }
  const args = [
    ...(server.path ? ['-s', server.path] : ['-h', server.host!, '-p', String(server.port)]),
    ...(server.tls ? ['--tls'] : []),
    ...(server.username ? ['--user', server.username] : []),
    '--rdb',
    file,
  ];
  // the password through REDISCLI_AUTH, never on the command line (redis-cli reads it since 5.0.3)
  const { REDISCLI_AUTH: _ignored, ...inherited } = process.env;
  const env = server.password ? { ...inherited, REDISCLI_AUTH: server.password } : inherited;
  const p = spawn('redis-cli', args, { env, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  p.stdout.on('data', (d: Buffer) => (out += d));
  p.stderr.on('data', (d: Buffer) => (out += d));
  const [code] = (await Promise.race([
    once(p, 'exit'),
    once(p, 'error').then(([e]) => {
      throw new CliError('BACKUP_SNAPSHOT_FAILED', `redis-cli: ${(e as Error).message}`);
    }),
  ])) as [number | null];
  if (code !== 0)
    throw new CliError(
      'BACKUP_SNAPSHOT_FAILED',
      `redis-cli --rdb from ${server.label} failed: ${out.trim()}`,
    );
}

/** True when `file` starts as an RDB does (`REDIS` and a 4-digit version). */
export async function looksLikeRdb(file: string): Promise<boolean> {
  // the first 9 bytes only: a snapshot may be gigabytes
  const fh = await open(file, 'r');
  try {
    const { buffer, bytesRead } = await fh.read(Buffer.alloc(9), 0, 9, 0);
    return /^REDIS\d{4}$/.test(buffer.subarray(0, bytesRead).toString('latin1'));
  } finally {
    await fh.close();
  }
}

/** The SPACE services connected to the Redis of `client`, by name (from `CLIENT LIST`). */
export async function connectedServices(client: Redis): Promise<{ api: number; agent: number }> {
  const list = (await client.call('CLIENT', 'LIST')) as string;
  const names = list.split('\n').map((l) => / name=(\S*)/.exec(l)?.[1] ?? '');
  return {
    api: names.filter((n) => n === API_CONNECTION_NAME).length,
    agent: names.filter((n) => n === AGENT_CONNECTION_NAME).length,
  };
}

/** A snapshot served by a throwaway `redis-server` ({@link openSnapshot}). */
interface OpenSnapshot {
  /** A client of the throwaway server. */
  client: Redis;
  /** Disconnects and kills the server. */
  close(): Promise<void>;
}

/**
 * Starts a throwaway `redis-server` on a free loopback port that loads the RDB at `dir/fileName`
 * (no persistence of its own) and connects to it.
 * @throws CliError BACKUP_CORRUPT when redis-server cannot load the file (its log's reason).
 */
async function openSnapshot(dir: string, fileName: string): Promise<OpenSnapshot> {
  const port = await freeLoopbackPort();
  const server = spawn(
    'redis-server',
    [
      '--port',
      String(port),
      '--bind',
      '127.0.0.1',
      '--dir',
      dir,
      '--dbfilename',
      fileName,
      '--appendonly',
      'no',
      '--save',
      '',
      '--databases',
      '16',
    ],
    { stdio: ['ignore', 'pipe', 'pipe'] },
  );
  let log = '';
  server.stdout.on('data', (d: Buffer) => (log += d));
  server.stderr.on('data', (d: Buffer) => (log += d));
  const client = new Redis({ host: '127.0.0.1', port, lazyConnect: true, maxRetriesPerRequest: 1 });
  client.on('error', () => {});
  const close = async () => {
    client.disconnect();
    if (server.exitCode === null) {
      server.kill('SIGKILL');
      await once(server, 'exit');
    }
  };
  try {
    await waitReady(server, () => log);
    await client.connect();
    return { client, close };
  } catch (err) {
    await close();
    throw err;
  }
}

/**
 * The number of keys database `db` of the RDB at `dir/fileName` holds, by loading it: this also
 * proves the file loads before it is shipped.
 * @throws CliError BACKUP_CORRUPT when redis-server cannot load it.
 */
export async function snapshotKeys(dir: string, fileName: string, db: number): Promise<number> {
  const snap = await openSnapshot(dir, fileName);
  try {
    await snap.client.select(db);
    return await snap.client.dbsize();
  } finally {
    await snap.close();
  }
}

/** What {@link restoreInto} did. */
export interface RestoreResult {
  /** Keys copied from the snapshot. */
  restored: number;
  /** Keys of the target the snapshot lacks, deleted. */
  removed: number;
  /** Deployment keys ({@link DEPLOYMENT_KEY_PREFIX}) the target held, left as they were. */
  kept: number;
}

/**
 * Loads the RDB at `file` (in `dir`, a private folder) into a throwaway `redis-server` on a
 * loopback port and makes the database of `url` an exact copy of the snapshot's database of the
 * same number, as described in the module comment. `progress` gets a line now and then.
 * @throws CliError BACKUP_CORRUPT when redis-server cannot load the file, BACKUP_WRITERS_RUNNING
 * when an API is connected to the target (checked before anything is written).
 */
export async function restoreInto(
  url: string,
  dir: string,
  fileName: string,
  progress: (line: string) => void,
): Promise<RestoreResult> {
  const target = redisConnection(url, { lazyConnect: true, maxRetriesPerRequest: 3 });
  target.on('error', () => {});
  let snapshot: OpenSnapshot | undefined;
  try {
    await target.connect();
    const running = await connectedServices(target);
    if (running.api > 0)
      throw new CliError(
        'BACKUP_WRITERS_RUNNING',
        `${running.api} API connection(s) to ${redactRedisUrl(url)}: stop the API before a restore (nothing was written)`,
        {
          hint: 'systemctl stop space-api on the control VM, or kubectl -n space scale deploy/space-api --replicas=0; start it again afterwards',
        },
      );
    if (running.agent > 0)
      progress(
        `${running.agent} agent connection(s): their sandboxes without a record in the backup are destroyed at their next reconciliation pass`,
      );
    snapshot = await openSnapshot(dir, fileName);
    const snap = snapshot.client;
    const db = dbOf(url);
    await snap.select(db);
    const total = await snap.dbsize();
    progress(`snapshot loaded: ${total} keys in db ${db}; copying into ${redactRedisUrl(url)}`);
    let restored = 0;
    let kept = 0;
    let cursor = '0';
    do {
      const [next, batch] = await snap.scan(cursor, 'COUNT', 500);
      cursor = next;
      if (batch.length === 0) continue;
      const read = snap.pipeline();
      for (const k of batch) read.dumpBuffer(k).pttl(k);
      const answers = (await read.exec()) ?? [];
      // the deployment's own keys the target holds describe the running deployment: kept
      const deploy = batch.filter(isDeploymentKey);
      const held = await Promise.all(deploy.map((k) => target.exists(k)));
      const present = new Set(deploy.filter((_, i) => held[i] === 1));
      const write = target.pipeline();
      let written = 0;
      for (let i = 0; i < batch.length; i++) {
        const payload = answers[2 * i]?.[1] as Buffer | null;
        const pttl = answers[2 * i + 1]?.[1] as number;
        if (!payload) continue; // expired between SCAN and DUMP
        if (present.has(batch[i]!)) {
          kept++;
          continue;
        }
        write.restore(batch[i]!, Math.max(pttl, 0), payload, 'REPLACE');
        written++;
      }
      for (const [err] of (await write.exec()) ?? []) if (err) throw err;
      restored += written;
    } while (cursor !== '0');
    // then the keys the snapshot lacks (made after it was taken)
    let removed = 0;
    cursor = '0';
    do {
      const [next, batch] = await target.scan(cursor, 'COUNT', 500);
      cursor = next;
      if (batch.length === 0) continue;
      const probe = snap.pipeline();
      for (const k of batch) probe.exists(k);
      const there = (await probe.exec()) ?? [];
      const gone = batch.filter((k, i) => there[i]?.[1] === 0 && !isDeploymentKey(k));
      if (gone.length > 0) removed += await target.unlink(...gone);
    } while (cursor !== '0');
    if (kept) progress(`kept ${kept} deployment key(s) (${DEPLOYMENT_KEY_PREFIX}*) the target already holds`);
    return { restored, removed, kept };
  } catch (err) {
    if (err instanceof CliError) throw err;
    throw new CliError(
      'BACKUP_RESTORE_FAILED',
      `restore into ${redactRedisUrl(url)}: ${(err as Error).message}`,
      {
        cause: err,
      },
    );
  } finally {
    target.disconnect();
    await snapshot?.close();
  }
}

/**
 * Keys the deployment publishes about itself (the VM verify key, the target version, the VM
 * configuration: runtime/core/redis-keys.ts), not records: a rebuilt control VM publishes a new
 * verify key, and an old one from a backup would make every session token it signs invalid at the
 * agents. A restore keeps those the target holds and never deletes them; absent ones come back.
 */
export const DEPLOYMENT_KEY_PREFIX = 'space:deploy:';

function isDeploymentKey(k: string): boolean {
  return k.startsWith(DEPLOYMENT_KEY_PREFIX);
}

/** The database number `url` selects. */
export function dbOf(url: string): number {
  const e = parseRedisUrl(url);
  if (e.kind === 'sentinel') return e.db;
  if (e.kind === 'socket') return 0;
  return Number(new URL(e.url).pathname.slice(1) || 0);
}

async function waitReady(p: ReturnType<typeof spawn>, log: () => string): Promise<void> {
  for (let i = 0; i < 6000; i++) {
    if (log().includes('Ready to accept connections')) return;
    if (p.exitCode !== null) break;
    await new Promise((r) => setTimeout(r, 50));
  }
  const why = log()
    .split('\n')
    .filter((l) => /#|error|bad|short read|crc/i.test(l))
    .slice(-3)
    .join(' / ');
  throw new CliError(
    'BACKUP_CORRUPT',
    `redis-server could not load the snapshot: ${why || 'no reason given'}`,
  );
}
