/**
 * The node's state files on its own disk, written so a crash or a full disk never leaves one torn:
 * each write goes to a temporary file in the same folder, is flushed (`fsync`), renamed over the
 * target (atomic within one file system, POSIX `rename(2)`) and the folder is flushed, so after a
 * crash the path holds either the old content or the new, never a prefix or zero bytes. A write the
 * disk has no room for (`ENOSPC`, or `EDQUOT` over a quota) leaves the old file untouched and
 * throws `NODE_DISK_FULL`. Reading is defensive: a file that is empty or not JSON is moved aside
 * (quarantined, `<name>.bad-<epoch ms>`) for an operator to look at, never a reason to stop.
 */
import { open, readFile, rename, unlink } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';
import { SpaceError } from '../../core/errors.ts';

let seq = 0;

/** A temporary file's path beside `path` (same folder, hence the same file system). */
function tempPath(path: string): string {
  seq = (seq + 1) % 1_000_000;
  return join(dirname(path), `.${basename(path)}.tmp-${process.pid}-${seq}`);
}

/** Whether `err` says the disk (or the user's quota on it) is full: `ENOSPC` or `EDQUOT`. */
export function isDiskFull(err: unknown): boolean {
  const code = (err as NodeJS.ErrnoException | null)?.code;
  return code === 'ENOSPC' || code === 'EDQUOT';
}

/**
 * Whether `err` or any error in its `cause` chain says the disk is full (a driver's DRIVER_FAILED
 * around an ENOSPC of its own writes). Follows at most 8 causes.
 */
export function causedByDiskFull(err: unknown): boolean {
  let e: unknown = err;
  for (let i = 0; i < 8 && e; i++) {
    if (isDiskFull(e)) return true;
    e = (e as { cause?: unknown }).cause;
  }
  return false;
}

/**
 * `err` as the coded error a client gets when the node's state disk is full (`NODE_DISK_FULL`,
 * 507, retryable), naming `what` needed the space; any other error is returned unchanged.
 */
export function diskFullError(err: unknown, what: string): unknown {
  if (!isDiskFull(err)) return err;
  return new SpaceError(
    'NODE_DISK_FULL',
    `the node's state disk is full: ${what} needs space (${(err as NodeJS.ErrnoException).code})`,
    undefined,
    { cause: err },
  );
}

/** Flushes a folder's entries (a rename in it) to disk; file systems that cannot are ignored. */
async function syncDir(dir: string): Promise<void> {
  const fh = await open(dir, 'r').catch(() => null);
  if (!fh) return;
  try {
    await fh.sync();
  } catch {
    // some file systems (and tmpfs under some kernels) refuse fsync on a folder: nothing to flush
  } finally {
    await fh.close();
  }
}

/**
 * Replaces `path` with `data` atomically and durably (temp file, fsync, rename, fsync of the
 * folder). `mode` is the new file's permission bits (default 0600). `sync: false` leaves out the
 * two fsyncs (about 1.3 ms, through the thread pool): still whole or not at all for a crash of the
 * agent and a full disk (the write to the temporary file fails before the rename), only not across
 * a power cut — for files of no use after one, e.g. a command's record, whose instance dies with
 * the host.
 * @throws SpaceError NODE_DISK_FULL when the disk has no room (the old file stays as it was); any
 *   other file-system error as thrown (the temporary file is removed on every failure).
 */
export async function writeFileAtomic(
  path: string,
  data: string | Buffer,
  o: { mode?: number; sync?: boolean } = {},
): Promise<void> {
  const sync = o.sync ?? true;
  const tmp = tempPath(path);
  try {
    const fh = await open(tmp, 'w', o.mode ?? 0o600);
    try {
      await fh.writeFile(data);
      if (sync) await fh.sync();
    } finally {
      await fh.close();
    }
    await rename(tmp, path);
  } catch (err) {
    await unlink(tmp).catch(() => {});
    throw diskFullError(err, `writing ${basename(path)}`);
  }
  if (sync) await syncDir(dirname(path));
}

/** What {@link readJsonFile} found. */
export type JsonRead<T> =
  | { ok: true; value: T }
  /** No file at the path. */
  | { ok: false; missing: true }
  /** The file was empty or not JSON; it now sits at `quarantined` (null when it could not be moved). */
  | { ok: false; missing: false; quarantined: string | null; reason: string };

/**
 * Reads and parses a JSON state file. A file that is empty, torn or not an object is renamed aside
 * to `<path>.bad-<epoch ms>` (so the next start does not trip on it again) and reported, not
 * thrown. @throws only what reading an existing file throws (EACCES, EIO).
 */
export async function readJsonFile<T>(path: string): Promise<JsonRead<T>> {
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return { ok: false, missing: true };
    throw err;
  }
  let reason: string;
  try {
    const value = JSON.parse(text) as unknown;
    if (value !== null && typeof value === 'object') return { ok: true, value: value as T };
    reason = 'not a JSON object';
  } catch (err) {
    reason = text.length === 0 ? 'empty file' : (err as Error).message;
  }
  const quarantined = `${path}.bad-${Date.now()}`;
  const moved = await rename(path, quarantined).then(
    () => true,
    () => false,
  );
  return { ok: false, missing: false, quarantined: moved ? quarantined : null, reason };
}
