/**
 * Directory watches (`GET /fs/watch`): inotify through `fs.watch` (gVisor implements inotify for
 * changes made inside the sandbox, which is where every change to its files comes from), turned
 * into typed events by comparing each changed name against what was there before.
 *
 * fs.watch only says "rename" or "change" for a name. The kind is found by lstat-ing the name
 * and comparing with the entry remembered from the start (or the last event): appeared = create
 * (+ write when it already has bytes), vanished = remove, another inode or other size/mtime =
 * write, only other permission bits = chmod. Names are handled one at a time, in arrival order.
 * Upload temp files (`.space-upload-…`) are not reported: their rename into place is. A rescan
 * every {@link WATCH_RESCAN_MS} reports what inotify missed.
 */
import { type FSWatcher, type Stats, watch } from 'node:fs';
import { lstat, readdir, statfs } from 'node:fs/promises';
import type { ServerResponse } from 'node:http';
import { posix } from 'node:path';
import { SpaceError } from '../core/errors.ts';
import type { FileStat, WatchEvent } from '../core/guest-protocol.ts';
import { UPLOAD_TEMP_PREFIX } from './files.ts';
import { errorFields, type Logger } from './log.ts';
import { realTarget, resolveSandboxPath } from './paths.ts';

/** Most entries remembered per watch (a larger tree still reports; only kinds get coarser). */
export const WATCH_MAX_ENTRIES = 100_000;
/**
 * How often the watched tree is compared with what was seen, ms. inotify under gVisor (runsc
 * 2024-07-29, checked by test/e2b.int.test.ts) reported creates and writes but not the unlink of a
 * file the file API removed: the rescan reports what inotify did not, within this period.
 */
export const WATCH_RESCAN_MS = 1000;

interface Seen {
  ino: number;
  size: number;
  mtimeMs: number;
  mode: number;
  dir: boolean;
}

const seenOf = (st: Stats): Seen => ({
  ino: st.ino,
  size: st.size,
  mtimeMs: st.mtimeMs,
  mode: st.mode & 0o7777,
  dir: st.isDirectory(),
});

/**
 * statfs(2) types of network file systems (Linux `include/uapi/linux/magic.h`: NFS, CIFS, SMB,
 * SMB2, FUSE): the ones envd refuses to watch unless the call allows network mounts (envd 0.6.4,
 * as the E2B SDK gates it: https://github.com/e2b-dev/e2b); inotify misses changes made on another
 * machine there.
 */
export const NETWORK_FS_TYPES: ReadonlySet<number> = new Set([
  0x6969, 0xff534d42, 0x517b, 0xfe534d42, 0x65735546,
]);

/** The entries under `root` (relative names), recursively when asked, at most WATCH_MAX_ENTRIES. */
async function snapshot(root: string, recursive: boolean): Promise<Map<string, Seen>> {
  const out = new Map<string, Seen>();
  const walk = async (rel: string): Promise<void> => {
    const names = await readdir(posix.join(root, rel)).catch(() => [] as string[]);
    for (const name of names) {
      if (out.size >= WATCH_MAX_ENTRIES) return;
      const r = rel ? `${rel}/${name}` : name;
      const st = await lstat(posix.join(root, r)).catch(() => null);
      if (!st) continue;
      out.set(r, seenOf(st));
      if (recursive && st.isDirectory()) await walk(r);
    }
  };
  await walk('');
  return out;
}

/**
 * Serves one watch on `res` until the reader leaves: `start`, then events as NDJSON lines.
 * Query: `path`, `recursive`, `entries` (each event but `remove` carries the entry, made by
 * `entryOf` from the sandbox path, lstat and real path, as it is when the event is judged),
 * `networkMounts` (allow a directory on a network file system, {@link NETWORK_FS_TYPES}).
 * @throws SpaceError FILE_NOT_FOUND / FILE_CONFLICT (not a directory), PATH_INVALID, BAD_REQUEST
 *   (a network file system not allowed) — before any byte is sent.
 */
export async function serveWatch(
  res: ServerResponse,
  query: URLSearchParams,
  home: string,
  log: Logger,
  entryOf: (path: string, st: Stats, real: string) => Promise<FileStat>,
): Promise<void> {
  const flag = (name: string) => query.get(name) === '1' || query.get(name) === 'true';
  const path = resolveSandboxPath(query.get('path'), home);
  const recursive = flag('recursive');
  const entries = flag('entries');
  const root = await realTarget(path, true);
  const st = await lstat(root).catch(() => null);
  if (!st) throw new SpaceError('FILE_NOT_FOUND', `no such directory: ${path}`, { path });
  if (!st.isDirectory()) throw new SpaceError('FILE_CONFLICT', `${path} is not a directory`, { path });
  if (!flag('networkMounts') && NETWORK_FS_TYPES.has((await statfs(root)).type)) {
    throw new SpaceError(
      'BAD_REQUEST',
      `cannot watch ${path}: it is on a network file system (allow network mounts to watch it)`,
      { path },
    );
  }

  const seen = await snapshot(root, recursive);
  const send = (e: WatchEvent) => {
    if (!res.destroyed) res.write(`${JSON.stringify(e)}\n`);
  };
  let queue: Promise<void> = Promise.resolve();
  const judge = async (kind: string, name: string) => {
    const now = await lstat(posix.join(root, name)).catch(() => null);
    const before = seen.get(name);
    if (!now) {
      if (!before) return; // came and went before we looked: nothing anyone can read
      seen.delete(name);
      if (before.dir) for (const k of seen.keys()) if (k.startsWith(`${name}/`)) seen.delete(k);
      send({ type: 'remove', name });
      return;
    }
    const after = seenOf(now);
    if (seen.size < WATCH_MAX_ENTRIES || before) seen.set(name, after);
    const entry = entries
      ? { entry: await entryOf(posix.join(path, name), now, posix.join(root, name)) }
      : {};
    if (!before) {
      send({ type: 'create', name, ...entry });
      if (!after.dir && after.size > 0) send({ type: 'write', name, ...entry });
      return;
    }
    const contentChanged =
      before.ino !== after.ino || before.size !== after.size || before.mtimeMs !== after.mtimeMs;
    if (contentChanged && !after.dir) send({ type: 'write', name, ...entry });
    else if (before.mode !== after.mode) send({ type: 'chmod', name, ...entry });
    else if (kind === 'change' && !after.dir) send({ type: 'write', name, ...entry });
  };

  const rescan = async () => {
    const now = await snapshot(root, recursive);
    for (const name of seen.keys()) {
      if (!now.has(name) && seen.has(name)) await judge('rename', name);
    }
    for (const [name, after] of now) {
      if (posix.basename(name).startsWith(UPLOAD_TEMP_PREFIX)) continue;
      const before = seen.get(name);
      if (
        !before ||
        before.ino !== after.ino ||
        before.size !== after.size ||
        before.mtimeMs !== after.mtimeMs ||
        before.mode !== after.mode
      ) {
        await judge('rescan', name);
      }
    }
  };
  const timer = setInterval(() => {
    queue = queue.then(rescan).catch(() => {});
  }, WATCH_RESCAN_MS);

  let watcher: FSWatcher;
  try {
    watcher = watch(root, { recursive, persistent: false }, (kind, file) => {
      if (!file) return;
      const name = String(file);
      if (posix.basename(name).startsWith(UPLOAD_TEMP_PREFIX)) return;
      queue = queue.then(() => judge(kind, name)).catch(() => {});
    });
  } catch (err) {
    clearInterval(timer);
    throw new SpaceError('BAD_REQUEST', `cannot watch ${path}: ${(err as Error).message}`, { path });
  }
  watcher.on('error', (err) => {
    log('warn', 'watch failed', { path, ...errorFields(err) });
    res.destroy();
  });
  res.writeHead(200, { 'content-type': 'application/x-ndjson', 'cache-control': 'no-store' });
  send({ type: 'start' });
  await new Promise<void>((resolve) => res.once('close', resolve));
  clearInterval(timer);
  watcher.close();
}
