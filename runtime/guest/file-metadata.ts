/**
 * File metadata (E2B's `X-Metadata-*` uploads, shared/reference/e2b-protocol.md §2.7), kept by the
 * daemon in memory.
 *
 * envd keeps it as `user.e2b.*` xattrs. SPACE cannot: under gVisor the root file system
 * (gofer/directfs) refuses user xattrs with ENOTSUP (tmpfs takes them), and Node has no xattr
 * call. The daemon lives exactly as long as its sandbox (tini's one child; a pause or hibernation
 * checkpoints its memory with the rest), so its memory is as durable as the sandbox.
 *
 * A file is known by device + inode, checked against the mtime it had when its metadata was set:
 * - metadata follows the file through renames (the file API's or `mv`), chmod and chown, as
 *   xattrs do;
 * - an inode the file system reuses for a new file (gVisor hands a freed number straight back)
 *   has another mtime, so it never shows the old file's metadata;
 * - unlike xattrs, a write to the file from inside the sandbox (new mtime) drops it: metadata
 *   describes the bytes that were uploaded with it.
 *
 * Bounded: at most {@link METADATA_STORE_BYTES} in all. When full, entries whose file is no
 * longer at the path it was last seen at are dropped; if that frees nothing, the upload is
 * refused (BAD_REQUEST) — before its bytes are written.
 */
import type { Stats } from 'node:fs';
import { lstat } from 'node:fs/promises';
import { SpaceError } from '../core/errors.ts';

/** Most bytes of metadata (keys, values, paths and a per-file overhead) one sandbox keeps. */
export const METADATA_STORE_BYTES = 16 * 1024 * 1024;
/** Bytes counted per file besides its keys, values and path (map entry, strings). */
const ENTRY_OVERHEAD_BYTES = 128;

interface Entry {
  mtimeMs: number;
  /** Sandbox path (as the daemon resolves it) where the file was last seen. */
  path: string;
  metadata: Record<string, string>;
  bytes: number;
}

const keyOf = (st: Stats) => `${st.dev}:${st.ino}`;

const sizeOf = (path: string, m: Record<string, string>) =>
  Object.entries(m).reduce((a, [k, v]) => a + k.length + v.length, ENTRY_OVERHEAD_BYTES + path.length);

/** The metadata of the files of one sandbox (see the module doc). */
export class FileMetadataStore {
  readonly #entries = new Map<string, Entry>();
  readonly #limit: number;
  #bytes = 0;

  /** @param limitBytes the store's bound (default {@link METADATA_STORE_BYTES}). */
  constructor(limitBytes = METADATA_STORE_BYTES) {
    this.#limit = limitBytes;
  }

  /** Bytes held (as counted against the bound). */
  get bytes(): number {
    return this.#bytes;
  }

  /** The metadata of the file `st` describes, or undefined (none, or a file since rewritten). */
  of(st: Stats): Record<string, string> | undefined {
    const key = keyOf(st);
    const e = this.#entries.get(key);
    if (!e) return undefined;
    if (e.mtimeMs !== st.mtimeMs) {
      this.#drop(key, e);
      return undefined;
    }
    return e.metadata;
  }

  /**
   * Makes room for `metadata` at `path`, before the upload writes anything.
   * @throws SpaceError BAD_REQUEST when the store cannot hold it.
   */
  async reserve(path: string, metadata: Record<string, string>): Promise<void> {
    const need = sizeOf(path, metadata);
    if (this.#bytes + need <= this.#limit) return;
    for (const [key, e] of [...this.#entries]) {
      const st = await lstat(e.path).catch(() => null);
      if (!st || keyOf(st) !== key || st.mtimeMs !== e.mtimeMs) this.#drop(key, e);
    }
    if (this.#bytes + need > this.#limit) {
      throw new SpaceError(
        'BAD_REQUEST',
        `the sandbox holds ${this.#bytes} bytes of file metadata (at most ${this.#limit}): upload without metadata, or remove files that have some`,
        { path },
      );
    }
  }

  /** Sets (replaces) the metadata of the file `st` at `path`; an empty set removes it. */
  set(path: string, st: Stats, metadata: Record<string, string>): void {
    const key = keyOf(st);
    const old = this.#entries.get(key);
    if (old) this.#drop(key, old);
    if (!Object.keys(metadata).length) return;
    const e: Entry = { mtimeMs: st.mtimeMs, path, metadata: { ...metadata }, bytes: sizeOf(path, metadata) };
    this.#entries.set(key, e);
    this.#bytes += e.bytes;
  }

  /** Notes that the file `st` is now at `path` (a rename through the file API). */
  moved(path: string, st: Stats): void {
    const key = keyOf(st);
    const e = this.#entries.get(key);
    if (!e || e.mtimeMs !== st.mtimeMs) return;
    this.#bytes += path.length - e.path.length;
    e.bytes += path.length - e.path.length;
    e.path = path;
  }

  /** Forgets the file `st` (removed through the file API). */
  forget(st: Stats): void {
    const key = keyOf(st);
    const e = this.#entries.get(key);
    if (e) this.#drop(key, e);
  }

  #drop(key: string, e: Entry): void {
    this.#entries.delete(key);
    this.#bytes -= e.bytes;
  }
}
