import { SpaceError } from './errors.ts';

/**
 * The agent ↔ guest protocol: plain HTTP/1.1 over any byte stream (TCP over a veth or tap today,
 * vsock or virtio-serial later), so it works unchanged between the node agent and a gVisor sandbox
 * or a microVM. The guest daemon listens on {@link GUEST_PORT} inside the sandbox.
 *
 * Routes (all JSON unless stated; errors use the core error body `{ error: { code, message } }`):
 *
 * | method | path | body → answer |
 * |---|---|---|
 * | GET | /health | → {@link GuestHealth} |
 * | POST | /token | `{ token }` → 204 (replaces the agent's secret; a restored snapshot's guest gets its own) |
 * | POST | /init | {@link GuestInit} → 204 (sandbox-wide env defaults, set at claim time) |
 * | POST | /processes | {@link ProcessStartRequest} → 201 {@link ProcessInfo} |
 * | GET | /processes | → `{ processes: ProcessInfo[] }` |
 * | GET | /processes/:pid | → {@link ProcessInfo} |
 * | GET | /processes/:pid/output?offset=N | → `application/octet-stream`, a stream of frames (below) from byte N of the frame stream |
 * | POST | /processes/:pid/stdin | raw bytes → 204 once written (409 PROCESS_EXITED after exit or close) |
 * | POST | /processes/:pid/stdin/close | → 204 |
 * | POST | /processes/:pid/resize | `{ cols, rows }` → 204 (a PTY process's terminal size; 409 PROCESS_EXITED, 400 without a PTY) |
 * | POST | /processes/:pid/signal | `{ signal: "SIGTERM" }` → 204 (to the process group; SIGKILL and SIGTERM to every process the command started) |
 * | GET | /files?path=P | → raw bytes (404 FILE_NOT_FOUND, 409 FILE_CONFLICT if a directory) |
 * | PUT | /files?path=P&mode=0644 | raw bytes → 200 {@link FileStat}; atomic: temp file, fsync, rename; header {@link FILE_METADATA_HEADER} = the new file's metadata |
 * | GET | /fs/stat?path=P | → {@link FileStat} |
 * | GET | /fs/list?path=P | → `{ entries: FileStat[] }` sorted by name |
 * | POST | /fs/mkdir | `{ path, parents? }` → 200 {@link FileStat} |
 * | DELETE | /fs?path=P&recursive=1 | → 204 |
 * | POST | /fs/rename | `{ from, to }` → 200 {@link FileStat} of the moved entry (parents of `to` created) |
 * | POST | /oom-kill | → 200 {@link OomKillResult} (version 3: kills the process holding the most memory; the agent's memory guard asks) |
 * | GET | /fs/watch?path=P&recursive=1&entries=1&networkMounts=1 | → `application/x-ndjson`: {@link WatchEvent} lines, `start` first, until the reader leaves; `entries`: events carry the entry; `networkMounts`: a directory on NFS/SMB/FUSE may be watched (else 400) |
 *
 * Output frames: `[type: u8][length: u32 big-endian][payload: length bytes]`; type 1 = stdout bytes,
 * 2 = stderr bytes, 3 = exit (payload is JSON {@link ProcessExit}; always the last frame).
 * A reader that lost its connection reconnects with `offset` = bytes of frame stream it received;
 * the guest keeps a bounded window of already-sent bytes for this, and pauses the child's pipes
 * (backpressure) instead of buffering without bound.
 */

/**
 * The protocol version a guest daemon reports in {@link GuestHealth} (`version`, as a string).
 * 1: everything in the table above but what 2 added; 2: {@link FILE_METADATA_HEADER} and
 * FileStat `metadata`, watch `entries` and `networkMounts`; 3: POST /oom-kill and ProcessExit
 * `oomKilled`. A daemon never changes version while
 * its sandbox lives, so a sandbox made before an upgrade keeps the one it started with.
 */
export const GUEST_PROTOCOL_VERSION = 3;

/** The first guest protocol with file metadata and watch `entries` / `networkMounts`. */
export const METADATA_PROTOCOL = 2;

/** The first guest protocol with POST /oom-kill. */
export const OOM_KILL_PROTOCOL = 3;

/** TCP port the guest daemon listens on inside every sandbox (same number as E2B's envd). */
export const GUEST_PORT = 49983;

/** Frame type tags of the output stream. */
export const FRAME_STDOUT = 1;
export const FRAME_STDERR = 2;
export const FRAME_EXIT = 3;
/** Bytes in a frame header (type + length). */
export const FRAME_HEADER_BYTES = 5;

/** GET /health answer. */
export interface GuestHealth {
  ok: true;
  /** Guest daemon protocol version. */
  version: string;
  /** Guest uptime in ms. */
  uptimeMs: number;
}

/** POST /init body: defaults applied to every later process. */
export interface GuestInit {
  /** Sandbox-wide environment variables (merged under each process's own env). */
  env: Record<string, string>;
}

/** POST /processes body. */
export interface ProcessStartRequest {
  /** Executable (looked up on PATH) — or, with `shell`, a shell script run by `/bin/sh -c`. */
  cmd: string;
  /** Arguments (ignored with `shell`). */
  args?: string[];
  /** When true, `cmd` is a shell script. */
  shell?: boolean;
  env?: Record<string, string>;
  /** Working directory; default the user's home. */
  cwd?: string;
  /** `user` (uid 1000, default) or `root`. */
  user?: 'user' | 'root';
  /** Keep stdin open for later writes; when false stdin is /dev/null (EOF at once). */
  stdin?: boolean;
  /** Kill every process the command started after this many ms (0 or absent: no limit). */
  timeoutMs?: number;
  /** Caller's id for the process (the API's command id); echoed in ProcessInfo. */
  tag?: string;
  /**
   * Run it on a pseudo-terminal of this size (characters): its output comes as stdout frames,
   * stdin (kept open) is typed into the terminal. Needs python3 in the sandbox (see guest/pty.ts).
   */
  pty?: { cols: number; rows: number };
}

/** How a process ended. */
export interface ProcessExit {
  /** Exit code, or null when killed by a signal. */
  exitCode: number | null;
  /** Signal name (`SIGKILL`) when the process died from a signal, else null. */
  signal: string | null;
  /** True when the guest killed it because `timeoutMs` passed. */
  timedOut: boolean;
  /** Set when the process could not start (exitCode is then 126 or 127, as a shell reports). */
  error?: string;
  /**
   * True when the guest killed one of the command's processes (it or a child) because the sandbox
   * ran out of memory (POST /oom-kill); the process killed got SIGKILL.
   */
  oomKilled?: boolean;
  /**
   * Set by the node agent when it ended the command itself for a reason with a stable code from
   * core/errors.ts: `NODE_DISK_FULL` (the node's disk had no room for the command's output; the
   * process was killed and `error` says after which byte the output stops); `SANDBOX_NOT_RUNNING`
   * (the sandbox ended — killed, crashed, its guest lost — while the command ran: no exit of its
   * own will come; E2B's envd emulation ends the stream as E2B's edge does, runtime/router/envd).
   */
  errorCode?: string;
}

/** POST /oom-kill answer: the process killed, or null when none but the daemon was left. */
export interface OomKillResult {
  killed: { pid: number; comm: string; rssBytes: number } | null;
}

/** A process the guest runs or ran. */
export interface ProcessInfo {
  pid: number;
  tag?: string;
  cmd: string;
  args: string[];
  /** Epoch ms. */
  startedAt: number;
  running: boolean;
  exit?: ProcessExit;
}

/** One file-system entry. */
export interface FileStat {
  name: string;
  /** Absolute path inside the sandbox. */
  path: string;
  type: 'file' | 'dir' | 'symlink' | 'other';
  /** Bytes. */
  size: number;
  /** Permission bits, e.g. 0o644. */
  mode: number;
  /** Epoch ms. */
  mtimeMs: number;
  /**
   * For a symlink: what it resolves to (and so what a download of it sends), or null when it
   * dangles or points where files cannot be read. Listings carry it too. `mode` (the target's
   * permission bits) is absent from guests older than the E2B symlink fix.
   */
  target?: { path: string; type: 'file' | 'dir' | 'symlink' | 'other'; size: number; mode?: number } | null;
  /**
   * The file's metadata ({@link FILE_METADATA_HEADER}), only when it has some. Absent from guests
   * older than file metadata.
   */
  metadata?: Record<string, string>;
}

/**
 * Request header of `PUT /files`: the new file's metadata as a JSON object of strings (printable
 * ASCII, so the JSON text is a valid header value). An upload without it leaves the file with
 * none: metadata describes what was uploaded, as E2B's `X-Metadata-*` headers do (envd ≥ 0.6.2,
 * where envd keeps it as `user.e2b.*` xattrs; the E2B SDK: https://github.com/e2b-dev/e2b,
 * packages/js-sdk, npm `e2b` 2.51.0).
 */
export const FILE_METADATA_HEADER = 'x-space-file-metadata';

/**
 * Limits of one file's metadata, envd's (§2.7): a key ≤ 246 bytes (255 for the xattr name less
 * its `user.e2b.` prefix of 9), keys and values printable ASCII, Σ (9 + key + value) ≤ 4096
 * bytes.
 */
export const FILE_METADATA_LIMITS = { keyBytes: 246, totalBytes: 4096, xattrPrefixBytes: 9 } as const;

const PRINTABLE = /^[\x20-\x7e]*$/;

/**
 * Why `m` is not valid file metadata (see {@link FILE_METADATA_LIMITS}), or null when it is.
 * Keys must be non-empty; they are stored as given (E2B lowercases header names before this).
 * Pure.
 */
export function fileMetadataProblem(m: unknown): string | null {
  if (typeof m !== 'object' || m === null || Array.isArray(m)) return 'metadata must be an object of strings';
  let total = 0;
  for (const [k, v] of Object.entries(m)) {
    if (typeof v !== 'string') return `metadata value of "${k}" must be a string`;
    if (!k) return 'metadata key must not be empty';
    if (k.length > FILE_METADATA_LIMITS.keyBytes) {
      return `metadata key "${k.slice(0, 32)}…" is longer than ${FILE_METADATA_LIMITS.keyBytes} bytes`;
    }
    if (!PRINTABLE.test(k)) return `metadata key "${k}" is not printable ASCII`;
    if (!PRINTABLE.test(v)) return `metadata value of "${k}" is not printable ASCII`;
    total += FILE_METADATA_LIMITS.xattrPrefixBytes + k.length + v.length;
  }
  if (total > FILE_METADATA_LIMITS.totalBytes) {
    return `metadata takes ${total} bytes, more than ${FILE_METADATA_LIMITS.totalBytes}`;
  }
  return null;
}

/**
 * The metadata a {@link FILE_METADATA_HEADER} value carries; undefined without the header.
 * @throws SpaceError BAD_REQUEST when it is not JSON or not valid metadata.
 */
export function parseFileMetadataHeader(
  raw: string | string[] | undefined,
): Record<string, string> | undefined {
  if (raw === undefined) return undefined;
  let m: unknown;
  try {
    m = JSON.parse(Array.isArray(raw) ? (raw[0] ?? '') : raw);
  } catch {
    throw new SpaceError('BAD_REQUEST', `${FILE_METADATA_HEADER} is not JSON`);
  }
  const problem = fileMetadataProblem(m);
  if (problem) throw new SpaceError('BAD_REQUEST', problem);
  return m as Record<string, string>;
}

/**
 * One line of a directory watch. `start` comes once, when the watch is armed (changes after it
 * are reported); the others name an entry relative to the watched directory (`sub/file.txt` when
 * recursive). A new non-empty file reports `create` then `write`; a file replaced by a rename
 * (every upload) reports `write`.
 */
export interface WatchEvent {
  type: 'start' | 'create' | 'write' | 'remove' | 'rename' | 'chmod';
  /** Absent on `start`. */
  name?: string;
  /** With `entries=1`: the entry as it is after the event (absent when it is gone). */
  entry?: FileStat;
}
