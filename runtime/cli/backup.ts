/**
 * `space backup run|list|restore|prune`: snapshots of SPACE's Redis (the state of record) shipped
 * to an S3-compatible store, with a SHA-256 checked at restore and retention. These commands talk
 * to Redis and the store directly, not to the API: they run beside Redis (the control VM's
 * `space-backup.timer`, the Kubernetes `space-backup` CronJob) or on an operator's machine with the
 * same settings (backup-config.ts). How the pieces work: backup-redis.ts (snapshot, restore),
 * backup-store.ts (objects, retention).
 */
import { createHash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { mkdtemp, rm, stat } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pipeline } from 'node:stream/promises';
import type { Command } from 'commander';
import { redactRedisUrl } from '../core/redis-connection.ts';
import { type BackupConfig, loadBackupConfig } from './backup-config.ts';
import { dbOf, looksLikeRdb, primaryOf, restoreInto, snapshot, snapshotKeys } from './backup-redis.ts';
import { BackupStore, expired } from './backup-store.ts';
import { isJson } from './context.ts';
import { CliError, formatBytes, parseNonNegativeInt, printJson, println, table } from './output.ts';

/** Retention flags, overriding SPACE_BACKUP_KEEP_LAST / SPACE_BACKUP_KEEP_DAYS. */
interface RetentionFlags {
  keepLast?: number;
  keepDays?: number;
}

/** A progress line on stderr (`{"progress": …}` with `--json`), so stdout keeps only the answer. */
function progressOf(cmd: Command): (line: string) => void {
  const json = isJson(cmd);
  return (line) =>
    process.stderr.write(json ? `${JSON.stringify({ progress: line })}\n` : `backup: ${line}\n`);
}

async function withWorkDir<T>(fn: (dir: string) => Promise<T>): Promise<T> {
  const dir = await mkdtemp(join(tmpdir(), 'space-backup-'));
  try {
    return await fn(dir);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

async function sha256Of(file: string): Promise<string> {
  const h = createHash('sha256');
  await pipeline(createReadStream(file), h);
  return h.digest('hex');
}

/** What `space backup run` did. */
export interface BackupRunResult {
  key: string;
  sha256: string;
  /** Bytes of the RDB file. */
  size: number;
  /** Keys the snapshot holds in the database of the Redis URL (counted by loading it). */
  keys: number;
  source: string;
  pruned: string[];
}

/**
 * One backup: the primary's snapshot, uploaded with its checksum, then retention applied.
 * @throws CliError from loadBackupConfig, primaryOf, snapshot and the store.
 */
export async function runBackup(
  c: BackupConfig,
  retention: RetentionFlags,
  progress: (line: string) => void,
  now: () => Date = () => new Date(),
): Promise<BackupRunResult> {
  const store = new BackupStore(c);
  try {
    return await withWorkDir(async (dir) => {
      const server = await primaryOf(c.redisUrl);
      progress(`snapshot of ${server.label} (redis-cli --rdb)`);
      const at = now();
      const file = join(dir, 'dump.rdb');
      await snapshot(server, file);
      if (!(await looksLikeRdb(file)))
        throw new CliError('BACKUP_SNAPSHOT_FAILED', `what ${server.label} sent is not an RDB file`);
      // counted from the file itself, which also proves it loads before it is shipped
      const keys = await snapshotKeys(dir, 'dump.rdb', dbOf(c.redisUrl)).catch((err: unknown) => {
        throw err instanceof CliError && err.code === 'BACKUP_CORRUPT'
          ? new CliError('BACKUP_SNAPSHOT_FAILED', `what ${server.label} sent does not load: ${err.message}`)
          : err;
      });
      const [sha256, { size }] = await Promise.all([sha256Of(file), stat(file)]);
      progress(
        `uploading ${formatBytes(size)} (${keys} keys, sha256 ${sha256.slice(0, 12)}…) to ${store.url}`,
      );
      const key = await store.put(file, at, { sha256, keys, source: server.label });
      const pruned = await prune(store, c, retention, progress, now());
      return { key, sha256, size, keys, source: server.label, pruned };
    });
  } finally {
    store.close();
  }
}

async function prune(
  store: BackupStore,
  c: BackupConfig,
  r: RetentionFlags,
  progress: (line: string) => void,
  now: Date,
  dryRun = false,
): Promise<string[]> {
  const keepLast = r.keepLast ?? c.keepLast;
  const keepDays = r.keepDays ?? c.keepDays;
  const old = expired(await store.list(), keepLast, keepDays, now).map((b) => b.key);
  if (old.length > 0) {
    progress(
      `${dryRun ? 'would delete' : 'deleting'} ${old.length} backup(s) past retention (keep last ${keepLast || '-'}, ${keepDays || '-'} days)`,
    );
    if (!dryRun) await store.delete(old);
  }
  return old;
}

/**
 * Restores backup `ref` into the Redis of the settings: downloads it, checks its SHA-256, and makes
 * the target an exact copy (backup-redis.ts). @throws CliError BACKUP_NOT_FOUND, BACKUP_CORRUPT,
 * BACKUP_WRITERS_RUNNING, BACKUP_RESTORE_FAILED, BACKUP_STORE_FAILED.
 */
export async function runRestore(
  c: BackupConfig,
  ref: string,
  progress: (line: string) => void,
): Promise<{ key: string; sha256: string; restored: number; removed: number; kept: number }> {
  const store = new BackupStore(c);
  try {
    return await withWorkDir(async (dir) => {
      const key = await store.resolve(ref);
      progress(`downloading ${key}`);
      const meta = await store.get(key, join(dir, 'restore.rdb'));
      if (!(await looksLikeRdb(join(dir, 'restore.rdb'))))
        throw new CliError('BACKUP_CORRUPT', `${key} is not an RDB file although its checksum matches`);
      progress(`checksum ok (sha256 ${meta.sha256.slice(0, 12)}…); loading it`);
      const r = await restoreInto(c.redisUrl, dir, 'restore.rdb', progress);
      return { key, sha256: meta.sha256, ...r };
    });
  } finally {
    store.close();
  }
}

const RETENTION_HELP = `
Retention: a backup is kept when it is among the newest SPACE_BACKUP_KEEP_LAST (--keep-last) or
younger than SPACE_BACKUP_KEEP_DAYS days (--keep-days); 0 turns a rule off; the newest is always
kept. Only this deployment's backups (<prefix><deployment>/redis-<time>.rdb) are ever deleted.`;

/** Registers `space backup`. */
export function registerBackup(program: Command): void {
  const backup = program
    .command('backup')
    .description(
      'snapshots of the state of record (Redis) in an S3-compatible store: run, list, restore, prune',
    )
    .addHelpText(
      'after',
      `
Settings come from the environment (docs/configuration.md, "space backup"): SPACE_REDIS_URL,
SPACE_BACKUP_S3_BUCKET (required), SPACE_BACKUP_S3_ENDPOINT, SPACE_BACKUP_S3_REGION,
SPACE_BACKUP_S3_PREFIX, SPACE_BACKUP_DEPLOYMENT, SPACE_BACKUP_S3_ACCESS_KEY_ID/SECRET_ACCESS_KEY,
SPACE_BACKUP_KEEP_LAST, SPACE_BACKUP_KEEP_DAYS. Needs redis-cli (run) and redis-server (restore).

Examples:
  space backup run
  space backup list --json
  space backup restore latest        # stop the API first
  space backup prune --keep-last 7 --dry-run`,
    );
  const retentionOptions = (c: Command) =>
    c
      .option(
        '--keep-last <n>',
        'keep the newest N (overrides SPACE_BACKUP_KEEP_LAST)',
        parseNonNegativeInt('--keep-last'),
      )
      .option(
        '--keep-days <n>',
        'keep those younger than N days (overrides SPACE_BACKUP_KEEP_DAYS)',
        parseNonNegativeInt('--keep-days'),
      );

  retentionOptions(
    backup
      .command('run')
      .description(
        'snapshot the primary (asking Sentinel which one it is), upload it with its SHA-256, then apply retention',
      )
      .addHelpText('after', RETENTION_HELP),
  ).action(async (o: RetentionFlags, cmd: Command) => {
    const r = await runBackup(loadBackupConfig(), o, progressOf(cmd));
    if (isJson(cmd)) printJson(r);
    else {
      println(
        `backed up ${r.keys} keys from ${r.source} to ${r.key} (${formatBytes(r.size)}, sha256 ${r.sha256})`,
      );
      if (r.pruned.length) println(`deleted ${r.pruned.length} older backup(s) past retention`);
    }
  });

  backup
    .command('list')
    .alias('ls')
    .description("this deployment's backups, oldest first")
    .action(async (_o: unknown, cmd: Command) => {
      const c = loadBackupConfig();
      const store = new BackupStore(c);
      try {
        const all = await store.list();
        if (isJson(cmd)) return printJson({ store: store.url, backups: all });
        if (all.length === 0) return println(`no backups in ${store.url}`);
        println(
          table(
            ['TAKEN', 'SIZE', 'KEY'],
            all.map((b) => [b.takenAt, formatBytes(b.size), b.key]),
          ),
        );
      } finally {
        store.close();
      }
    });

  backup
    .command('restore')
    .description(
      'make Redis an exact copy of a backup (checksum checked first); refused while an API is connected',
    )
    .argument('<backup>', '`latest`, or a key or name from `space backup list`')
    .addHelpText(
      'after',
      `
Stop the API first (it is refused while one is connected); agents may keep running. Keys of the
backup are written first, keys it lacks are deleted after, so no record of the backup is ever
missing. Afterwards start the API: reconciliation makes records and node inventories agree.
Sandboxes created after the backup have no record: their agents destroy them. Records of
sandboxes that ended after it are marked killed (node_lost). See docs/operations.md "Backups".`,
    )
    .action(async (ref: string, _o: unknown, cmd: Command) => {
      const c = loadBackupConfig();
      const r = await runRestore(c, ref, progressOf(cmd));
      if (isJson(cmd)) printJson(r);
      else
        println(
          `restored ${r.restored} keys from ${r.key} into ${redactRedisUrl(c.redisUrl)}; removed ${r.removed} keys the backup lacks; kept ${r.kept} deployment keys`,
        );
    });

  retentionOptions(
    backup
      .command('prune')
      .description('delete backups of this deployment past retention')
      .option('--dry-run', 'only say which would be deleted')
      .addHelpText('after', RETENTION_HELP),
  ).action(async (o: RetentionFlags & { dryRun?: boolean }, cmd: Command) => {
    const c = loadBackupConfig();
    const store = new BackupStore(c);
    try {
      const gone = await prune(store, c, o, progressOf(cmd), new Date(), o.dryRun === true);
      if (isJson(cmd)) printJson({ deleted: o.dryRun ? [] : gone, wouldDelete: o.dryRun ? gone : [] });
      else if (gone.length === 0) println('nothing past retention');
      else for (const k of gone) println(`${o.dryRun ? 'would delete' : 'deleted'} ${k}`);
    } finally {
      store.close();
    }
  });
}
