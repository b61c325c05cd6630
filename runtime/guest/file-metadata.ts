/**
 * File metadata (E2B's `X-Metadata-*` uploads to envd's `/files`; docs/e2b.md), kept by the
 * daemon in memory.
 *
 * envd keeps it as `user.e2b.*` xattrs. SPACE cannot: under gVisor the root file system
 * (gofer/directfs) refuses user xattrs with ENOTSUP (tmpfs takes them), and Node has no xattr
 * call. The daemon lives exactly as long as its sandbox (tini's one child; a pause or hibernation
 * checkpoints its memory with the rest), so its memory is as durable as the sandbox.
 *
 * A file is known by its path, checked against the mtime and size it had when its metadata was
 * set (uploads with metadata get a unique mtime: {@link uniqueMtime}). Not by
 * inode: gVisor hands a freed inode number straight to the next new file, and gives files new
 * numbers after a checkpoint is restored. So:
 * - metadata follows renames made through the file API (a directory's files with it), and
 *   survives chmod, chown and pauses;
 * - a file written again from inside the sandbox (new mtime), or moved there by a command (`mv`),
 *   loses it; so does a file at a path whose metadata belonged to a file since replaced;
 * - a symlink shows the metadata of what it resolves to, as envd's `listxattr` does.
 *
 * Bounded: at most {@link METADATA_STORE_BYTES} and {@link METADATA_STORE_FILES}. When full, a
 * sweep drops the entries whose path no longer holds the file they were set for (one sweep at a
 * time); if that frees too little, the upload is refused (BAD_REQUEST) before its bytes are
 * written.
 */
import type { Stats } from 'node:fs';
import { lstat } from 'node:fs/promises';
import { SpaceError } from '../core/errors.ts';

/** Most bytes of metadata (keys, values, paths and a per-file overhead) one sandbox keeps. */
export const METADATA_STORE_BYTES = 16 * 1024 * 1024;
/** Most files with metadata one sandbox keeps. */
export const METADATA_STORE_FILES = 65_536;
let lastMtimeUs = 0;

/**
 * An mtime for an upload with metadata, set explicitly: under gVisor the mtime a write leaves is
 * the sentry's own until a checkpoint is restored, then the host's (ms apart), which the check
 * would take for a rewrite, while a set one is the same on both sides. Unique per daemon (10 µs
 * apart at least: libuv keeps µs), so two uploads in one ms cannot pass for each other.
 * @returns seconds since the epoch (what `utimes` takes).
 */
export function uniqueMtime(): number {
  lastMtimeUs = Math.max(Date.now() * 1000, lastMtimeUs + 10);
  return lastMtimeUs / 1e6;
}

/** Bytes counted per file besides its keys, values and path (map entry, objects, strings). */
const ENTRY_OVERHEAD_BYTES = 256;

interface Entry {
  mtimeMs: number;
  /** The file's size in bytes when its metadata was set (checked with the mtime). */
  size: number;
  metadata: Record<string, string>;
  bytes: number;
}

/** Whether `e` was set for the file `st` describes (same mtime and size). */
const matches = (e: Entry, st: Stats) => e.mtimeMs === st.mtimeMs && e.size === st.size;

const sizeOf = (path: string, m: Record<string, string>) =>
  Object.entries(m).reduce((a, [k, v]) => a + k.length + v.length, ENTRY_OVERHEAD_BYTES + path.length);

/** The metadata of the files of one sandbox, by real path (see the module doc). */
export class FileMetadataStore {
  readonly #entries = new Map<string, Entry>();
  readonly #limits: { bytes: number; files: number };
  #bytes = 0;
  #sweep: Promise<void> | null = null;

  /** @param limits bounds (default {@link METADATA_STORE_BYTES}, {@link METADATA_STORE_FILES}). */
  constructor(limits: { bytes?: number; files?: number } = {}) {
    this.#limits = {
      bytes: limits.bytes ?? METADATA_STORE_BYTES,
      files: limits.files ?? METADATA_STORE_FILES,
    };
  }

  /** Bytes held, as counted against the bound. */
  get bytes(): number {
    return this.#bytes;
  }

  /** Files with metadata held (including stale ones not swept yet). */
  get files(): number {
    return this.#entries.size;
  }

  /**
   * The metadata of the file at `path` (`st` = its lstat/stat now), or undefined: none, or set
   * for a file since replaced there. Never changes the store (a stale entry waits for a sweep).
   */
  of(path: string, st: Stats): Record<string, string> | undefined {
    const e = this.#entries.get(path);
    return e && matches(e, st) ? e.metadata : undefined;
  }

  /**
   * Makes room for `metadata` at `path` before an upload writes anything (nothing to do for none).
   * Concurrent uploads may each pass and together overshoot the bound by their own sizes.
   * @throws SpaceError BAD_REQUEST when the store cannot hold it.
   */
  async makeRoom(path: string, metadata: Record<string, string>): Promise<void> {
    if (!Object.keys(metadata).length) return;
    // what the path holds now is replaced, so it makes room too
    const fits = () => {
      const have = this.#entries.get(path);
      const need = sizeOf(path, metadata) - (have?.bytes ?? 0);
      return (
        this.#bytes + need <= this.#limits.bytes && this.#entries.size - (have ? 1 : 0) < this.#limits.files
      );
    };
    if (fits()) return;
    this.#sweep ??= this.#sweepStale().finally(() => {
      this.#sweep = null;
    });
    await this.#sweep;
    if (!fits()) {
      throw new SpaceError(
        'BAD_REQUEST',
        `the sandbox keeps metadata for ${this.#entries.size} files in ${this.#bytes} bytes ` +
          `(at most ${this.#limits.files} files, ${this.#limits.bytes} bytes): ` +
          'upload without metadata, or remove files that have some',
        { path },
      );
    }
  }

  /**
   * Sets (replaces) the metadata of the file `st` that is, or is about to be renamed, at `path`;
   * an empty set removes it.
   * @returns a function that puts back what was there (for a rename that then failed).
   */
  set(path: string, st: Stats, metadata: Record<string, string>): () => void {
    const before = this.#entries.get(path);
    this.#delete(path);
    let mine: Entry | undefined;
    if (Object.keys(metadata).length) {
      mine = { mtimeMs: st.mtimeMs, size: st.size, metadata: { ...metadata }, bytes: sizeOf(path, metadata) };
      this.#put(path, mine);
    }
    // only while the path still holds what this set left (another upload may have set it since)
    return () => {
      if (this.#entries.get(path) !== mine) return;
      this.#delete(path);
      if (before) this.#put(path, before);
    };
  }

  /**
   * A rename through the file API moved `from` (a file, or a directory and everything under it) to
   * `to`: the metadata moves with it, and what `to` held before is gone.
   */
  moved(from: string, to: string): void {
    const moving: [string, Entry][] = [];
    for (const [p, e] of this.#entries) {
      if (p === from || p.startsWith(`${from}/`)) moving.push([p, e]);
    }
    this.removed(to);
    for (const [p, e] of moving) {
      this.#delete(p);
      const q = to + p.slice(from.length);
      this.#put(q, { ...e, bytes: e.bytes + q.length - p.length });
    }
  }

  /** `path` (a file, or a directory and everything under it) was removed through the file API. */
  removed(path: string): void {
    for (const p of [...this.#entries.keys()]) {
      if (p === path || p.startsWith(`${path}/`)) this.#delete(p);
    }
  }

  /** Drops every entry whose path no longer holds the file it was set for. */
  async #sweepStale(): Promise<void> {
    for (const [p, e] of [...this.#entries]) {
      const st = await lstat(p).catch(() => null);
      // only if the entry is still the one checked (an upload may have replaced it meanwhile)
      if ((!st || !matches(e, st)) && this.#entries.get(p) === e) this.#delete(p);
    }
  }

  #put(path: string, e: Entry): void {
    this.#entries.set(path, e);
    this.#bytes += e.bytes;
  }

  #delete(path: string): void {
    const e = this.#entries.get(path);
    if (!e) return;
    this.#entries.delete(path);
    this.#bytes -= e.bytes;
  }
}
