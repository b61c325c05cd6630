/**
 * The file API: read (streamed), atomic write (temp file in the same directory, fsync, rename),
 * stat, list, mkdir and delete. Paths are checked by paths.ts. Uploads stream to disk, never into
 * memory; the guest puts no size cap on them (the agent does).
 */

import { randomBytes } from 'node:crypto';
import type { Stats } from 'node:fs';
import { chown, lstat, mkdir, open, readdir, rename, rm, rmdir, stat, unlink } from 'node:fs/promises';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { posix } from 'node:path';
import { Transform } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { SpaceError } from '../core/errors.ts';
import { FILE_METADATA_HEADER, type FileStat, parseFileMetadataHeader } from '../core/guest-protocol.ts';
import { FileMetadataStore, uniqueMtime } from './file-metadata.ts';
import { isObject, sendJson } from './http.ts';
import { errorFields, type Logger } from './log.ts';
import { realTarget, resolveSandboxPath } from './paths.ts';

export interface FilesOptions {
  /** Base of relative paths (the user's home). */
  home: string;
  /** Owner given to files and directories the API creates (null: leave as the daemon's). */
  owner: { uid: number; gid: number } | null;
  log: Logger;
  /** Where file metadata is kept (default: a store of its own). */
  metadata?: FileMetadataStore;
}

/** Name prefix of an upload's temp file (renamed into place when complete; watchers skip it). */
export const UPLOAD_TEMP_PREFIX = '.space-upload-';

/** Default permission bits of a new file. */
export const DEFAULT_FILE_MODE = 0o644;
/** Permission bits of a new directory. */
export const DEFAULT_DIR_MODE = 0o755;

type Op = 'read' | 'write';

/** Maps a file-system error to a coded error. */
function fsError(err: unknown, path: string, op: Op): unknown {
  if (err instanceof SpaceError) return err;
  const code = (err as NodeJS.ErrnoException).code;
  switch (code) {
    case 'ENOENT':
      return new SpaceError('FILE_NOT_FOUND', `no such file or directory: ${path}`, { path });
    case 'ENOTDIR':
      return op === 'write'
        ? new SpaceError('FILE_CONFLICT', `a parent of ${path} is not a directory`, { path })
        : new SpaceError('FILE_NOT_FOUND', `no such file or directory: ${path}`, { path });
    case 'EISDIR':
      return new SpaceError('FILE_CONFLICT', `${path} is a directory`, { path });
    case 'EEXIST':
      return new SpaceError('FILE_CONFLICT', `${path} already exists`, { path });
    case 'ENOTEMPTY':
      return new SpaceError('FILE_CONFLICT', `directory ${path} is not empty`, { path });
    case 'ENAMETOOLONG':
    case 'ELOOP':
      return new SpaceError('PATH_INVALID', `${path}: ${code}`, { path });
    case 'EACCES':
    case 'EPERM':
      return new SpaceError('BAD_REQUEST', `permission denied: ${path}`, { path });
    case 'EROFS':
      return new SpaceError('BAD_REQUEST', `read-only file system: ${path}`, { path });
    case 'ENOSPC':
    case 'EDQUOT':
      return new SpaceError('DISK_FULL', `no space left on device: ${path}`, { path });
    default:
      return err;
  }
}

function typeOf(st: Stats): FileStat['type'] {
  if (st.isFile()) return 'file';
  if (st.isDirectory()) return 'dir';
  if (st.isSymbolicLink()) return 'symlink';
  return 'other';
}

/** FileStat of `st` for the sandbox path `path`. */
export function toFileStat(path: string, st: Stats): FileStat {
  return {
    name: path === '/' ? '/' : posix.basename(path),
    path,
    type: typeOf(st),
    size: st.size,
    mode: st.mode & 0o7777,
    mtimeMs: Math.floor(st.mtimeMs),
  };
}

function parseMode(value: string | null): number | undefined {
  if (value === null || value === '') return undefined;
  if (!/^0?[0-7]{3,4}$/.test(value) || Number.parseInt(value, 8) > 0o7777) {
    throw new SpaceError('BAD_REQUEST', 'mode must be octal permission bits, e.g. 0644');
  }
  return Number.parseInt(value, 8);
}

/** The file API bound to one home and owner. */
export class Files {
  readonly #opts: FilesOptions;
  readonly #metadata: FileMetadataStore;

  constructor(opts: FilesOptions) {
    this.#opts = opts;
    this.#metadata = opts.metadata ?? new FileMetadataStore();
  }

  /**
   * The FileStat of `st` (an lstat) at the sandbox path `path` (`real` = where it is, symlinks
   * in its parents resolved), with its metadata when it has some; a symlink also says what it
   * resolves to, and shows that file's metadata (as envd's `listxattr` does).
   */
  async entry(path: string, st: Stats, real: string): Promise<FileStat> {
    const out = toFileStat(path, st);
    let metadata = this.#metadata.of(real, st);
    if (out.type === 'symlink') {
      const t = await linkTarget(path);
      out.target = t ? t.target : null;
      metadata = t ? this.#metadata.of(t.target.path, t.st) : undefined;
    }
    if (metadata) out.metadata = { ...metadata };
    return out;
  }

  #path(query: URLSearchParams): string {
    return resolveSandboxPath(query.get('path'), this.#opts.home);
  }

  async #chown(path: string): Promise<void> {
    const { owner } = this.#opts;
    if (!owner) return;
    await chown(path, owner.uid, owner.gid);
  }

  /** Creates `dir` and missing parents (each owned by the default user). */
  async #mkdirp(dir: string, shown: string): Promise<void> {
    const missing: string[] = [];
    let cur = dir;
    for (;;) {
      try {
        const st = await stat(cur);
        if (!st.isDirectory()) {
          throw new SpaceError('FILE_CONFLICT', `${cur} exists and is not a directory`, { path: shown });
        }
        break;
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'ENOENT' || cur === '/')
          throw fsError(err, shown, 'write');
        missing.push(cur);
        cur = posix.dirname(cur);
      }
    }
    for (const d of missing.reverse()) {
      try {
        await mkdir(d, DEFAULT_DIR_MODE);
        await this.#chown(d);
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw fsError(err, shown, 'write');
        if (!(await stat(d)).isDirectory()) {
          throw new SpaceError('FILE_CONFLICT', `${d} exists and is not a directory`, { path: shown });
        }
      }
    }
  }

  /** GET /files: streams a regular file. */
  async read(res: ServerResponse, query: URLSearchParams): Promise<void> {
    const path = this.#path(query);
    const real = await realTarget(path, true);
    let fh: Awaited<ReturnType<typeof open>>;
    let size: number;
    try {
      fh = await open(real, 'r');
    } catch (err) {
      throw fsError(err, path, 'read');
    }
    try {
      const st = await fh.stat();
      if (st.isDirectory()) throw new SpaceError('FILE_CONFLICT', `${path} is a directory`, { path });
      if (!st.isFile()) throw new SpaceError('FILE_CONFLICT', `${path} is not a regular file`, { path });
      size = st.size;
      res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': size });
    } catch (err) {
      await fh.close();
      throw err;
    }
    if (size === 0) {
      await fh.close();
      res.end();
      return;
    }
    // exactly the bytes the header promised (R10): a file that grows meanwhile is cut at its
    // size then; one that shrinks ends the connection, never a short body on a live connection
    const stream = fh.createReadStream({ autoClose: true, start: 0, end: size - 1 });
    let sent = 0;
    const exact = new Transform({
      transform(chunk: Buffer, _enc, done) {
        sent += chunk.length;
        done(null, chunk);
      },
      flush(done) {
        // failing here destroys the response instead of ending it short
        done(
          sent === size ? null : new Error(`the file shrank during the download (${sent} of ${size} bytes)`),
        );
      },
    });
    try {
      await pipeline(stream, exact, res);
    } catch (err) {
      // The reader went away (or the file shrank): the connection is cut; nothing more to say.
      this.#opts.log('debug', 'file read ended early', { path, ...errorFields(err) });
      res.destroy();
    }
  }

  /** PUT /files: atomic streamed write; answers the new FileStat. */
  async write(req: IncomingMessage, res: ServerResponse, query: URLSearchParams): Promise<void> {
    const path = this.#path(query);
    const requestedMode = parseMode(query.get('mode'));
    const metadata = parseFileMetadataHeader(req.headers[FILE_METADATA_HEADER]) ?? {};
    const real = await realTarget(path, true);
    const dir = posix.dirname(real);
    let previous: Stats | undefined;
    try {
      previous = await stat(real);
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if (code !== 'ENOENT' && code !== 'ENOTDIR') throw fsError(err, path, 'write');
    }
    if (previous?.isDirectory()) throw new SpaceError('FILE_CONFLICT', `${path} is a directory`, { path });
    await this.#metadata.makeRoom(real, metadata);
    await this.#mkdirp(dir, path);

    const temp = posix.join(dir, `${UPLOAD_TEMP_PREFIX}${randomBytes(8).toString('hex')}`);
    let fh: Awaited<ReturnType<typeof open>>;
    try {
      fh = await open(temp, 'wx', 0o600);
    } catch (err) {
      throw fsError(err, path, 'write');
    }
    let renamed = false;
    let undoMetadata: (() => void) | undefined;
    try {
      // a failed write must not destroy the request (and with it the socket the refusal goes out on)
      for await (const chunk of req.iterator({ destroyOnReturn: false })) {
        const buf = chunk as Buffer;
        let at = 0;
        while (at < buf.length) at += (await fh.write(buf, at)).bytesWritten;
      }
      await fh.chmod(requestedMode ?? (previous ? previous.mode & 0o7777 : DEFAULT_FILE_MODE));
      const { owner } = this.#opts;
      if (owner) await fh.chown(previous?.uid ?? owner.uid, previous?.gid ?? owner.gid);
      if (Object.keys(metadata).length) {
        const t = uniqueMtime(); // one both sides of gVisor agree on, even after a restore
        await fh.utimes(t, t);
      }
      await fh.sync();
      // the new file's metadata is exactly this upload's (none without the header), in place
      // before the rename shows the file (a watch describes it at once)
      undoMetadata = this.#metadata.set(real, await fh.stat(), metadata);
      await fh.close();
      await rename(temp, real);
      renamed = true;
      await syncDir(dir);
    } catch (err) {
      await fh.close().catch(() => {});
      if (!renamed) {
        undoMetadata?.();
        await unlink(temp).catch(() => {});
      }
      const failure = err as NodeJS.ErrnoException;
      const fromDisk = typeof failure.syscall === 'string' && failure.code !== 'ECONNRESET';
      if (!fromDisk && !req.complete) {
        this.#opts.log('info', 'upload aborted', { path });
        res.destroy();
        return;
      }
      throw fsError(err, path, 'write');
    }
    sendJson(res, 200, await this.entry(path, await lstat(real), real));
  }

  /**
   * GET /fs/stat (does not follow a final symlink; a symlink's `target` says what it resolves to,
   * so what a download of it would send).
   */
  async stat(query: URLSearchParams): Promise<FileStat> {
    const path = this.#path(query);
    const real = await realTarget(path, false);
    let st: Stats;
    try {
      st = await lstat(real);
    } catch (err) {
      throw fsError(err, path, 'read');
    }
    return this.entry(path, st, real);
  }

  /** GET /fs/list: entries sorted by name. */
  async list(query: URLSearchParams): Promise<FileStat[]> {
    const path = this.#path(query);
    const real = await realTarget(path, true);
    let names: string[];
    try {
      const st = await stat(real);
      if (!st.isDirectory()) throw new SpaceError('FILE_CONFLICT', `${path} is not a directory`, { path });
      names = await readdir(real);
    } catch (err) {
      throw fsError(err, path, 'read');
    }
    names.sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
    const entries: FileStat[] = [];
    const batch = 64;
    // a listed symlink says what it resolves to, as stat does (E2B clients type it by its target)
    for (let i = 0; i < names.length; i += batch) {
      const described = await Promise.all(
        names.slice(i, i + batch).map(async (name) => {
          const at = posix.join(real, name);
          const st = await lstat(at).catch(() => null);
          return st && this.entry(posix.join(path, name), st, at);
        }),
      );
      for (const e of described) if (e) entries.push(e);
    }
    return entries;
  }

  /** POST /fs/mkdir: `{ path, parents? }`; an existing directory is fine. */
  async mkdir(body: unknown): Promise<FileStat> {
    if (!isObject(body)) throw new SpaceError('BAD_REQUEST', 'body must be a json object');
    if (body.parents !== undefined && typeof body.parents !== 'boolean') {
      throw new SpaceError('BAD_REQUEST', 'parents must be a boolean');
    }
    const path = resolveSandboxPath(body.path, this.#opts.home);
    const real = await realTarget(path, true);
    if (body.parents === true) {
      await this.#mkdirp(real, path);
    } else {
      try {
        await mkdir(real, DEFAULT_DIR_MODE);
        await this.#chown(real);
      } catch (err) {
        const code = (err as NodeJS.ErrnoException).code;
        if (code !== 'EEXIST') throw fsError(err, path, code === 'ENOENT' ? 'read' : 'write');
        if (!(await stat(real)).isDirectory()) {
          throw new SpaceError('FILE_CONFLICT', `${path} exists and is not a directory`, { path });
        }
      }
    }
    return this.entry(path, await lstat(real), real);
  }

  /**
   * POST /fs/rename: `{ from, to }` moves a file or directory (missing parents of `to` are
   * created; an existing file at `to` is replaced, as rename(2) does); answers the moved entry.
   */
  async rename(body: unknown): Promise<FileStat> {
    if (!isObject(body)) throw new SpaceError('BAD_REQUEST', 'body must be a json object');
    const from = resolveSandboxPath(body.from, this.#opts.home);
    const to = resolveSandboxPath(body.to, this.#opts.home);
    if (from === '/' || to === '/')
      throw new SpaceError('PATH_INVALID', 'refusing to move /', { path: from });
    const realFrom = await realTarget(from, false);
    const realTo = await realTarget(to, false);
    try {
      await lstat(realFrom);
    } catch (err) {
      throw fsError(err, from, 'read');
    }
    await this.#mkdirp(posix.dirname(realTo), to);
    try {
      await rename(realFrom, realTo);
    } catch (err) {
      throw fsError(err, to, 'write');
    }
    this.#metadata.moved(realFrom, realTo);
    return this.entry(to, await lstat(realTo), realTo);
  }

  /** DELETE /fs: a file, an empty directory, or (recursive) a whole tree. */
  async remove(query: URLSearchParams): Promise<void> {
    const path = this.#path(query);
    if (path === '/') throw new SpaceError('PATH_INVALID', 'refusing to delete /', { path });
    const recursive = query.get('recursive') === '1' || query.get('recursive') === 'true';
    const real = await realTarget(path, false);
    try {
      const st = await lstat(real);
      if (!st.isDirectory()) await unlink(real);
      else if (recursive) await rm(real, { recursive: true, force: false });
      else await rmdir(real);
      this.#metadata.removed(real);
    } catch (err) {
      throw fsError(err, path, 'read');
    }
  }
}

async function syncDir(dir: string): Promise<void> {
  try {
    const fh = await open(dir, 'r');
    try {
      await fh.sync();
    } finally {
      await fh.close();
    }
  } catch {
    // Some file systems refuse fsync on directories; the rename itself is still atomic.
  }
}

/**
 * What the symlink at `path` resolves to (following every link) and its stat, or null when it
 * dangles or resolves where files cannot be read (a platform-owned location).
 */
async function linkTarget(
  path: string,
): Promise<{ target: NonNullable<FileStat['target']>; st: Stats } | null> {
  try {
    const t = await realTarget(path, true);
    const st = await stat(t);
    return { target: { path: t, type: typeOf(st), size: st.size, mode: st.mode & 0o7777 }, st };
  } catch {
    return null;
  }
}
