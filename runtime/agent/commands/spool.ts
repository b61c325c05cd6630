/**
 * Output spool: each command's output is appended to a file on the node as the same frames the
 * guest sends (`[type u8][length u32 BE][payload]`, see core/guest-protocol.ts). A frame's SSE
 * event id is the byte offset just past it, so a client resuming with `Last-Event-ID: N` reads
 * from byte N — nothing lost, nothing repeated — and any number of readers replay or follow the
 * file at their own pace with bounded memory (one chunk each). The file is the buffer: a slow or
 * absent reader never makes the agent hold output in memory.
 */
import { EventEmitter } from 'node:events';
import { type FileHandle, open } from 'node:fs/promises';
import { FRAME_EXIT, FRAME_HEADER_BYTES } from '../../core/guest-protocol.ts';
import { diskFullError } from '../host/durable-file.ts';

/** Frame type the agent adds when a command's output passed the spool limit (payload JSON `{ droppedAfter }`). */
export const FRAME_TRUNCATED = 4;
/** Bytes a reader reads from the file at a time. */
export const READ_CHUNK_BYTES = 256 * 1024;

/** One decoded frame with its position. */
export interface SpoolFrame {
  type: number;
  payload: Buffer;
  /** Offset just past this frame (its event id). */
  end: number;
}

/** Append-only framed log of one command's output. */
export class Spool {
  readonly path: string;
  readonly #fh: FileHandle;
  readonly #events = new EventEmitter();
  #size: number;
  #closed = false;
  /** The file handle was closed (the sandbox went away or the agent detached): followers stop. */
  #released = false;
  #writing: Promise<void> = Promise.resolve();
  /**
   * The exit frame of a command whose output could not be kept (the disk was full, so it is not in
   * the file either): readers get it after the last frame on disk, with that frame's offset as id.
   */
  #tail: { type: number; payload: Buffer } | null = null;
  /** Epoch ms the log was ended (its exit spooled); null while the command runs. */
  endedAt: number | null = null;
  /** Epoch ms a reader last took the exit frame (read the output to its end); null when none has. */
  readToEndAt: number | null = null;
  /** Readers iterating {@link frames} now. */
  readers = 0;

  private constructor(path: string, fh: FileHandle, size: number, closed: boolean) {
    this.path = path;
    this.#fh = fh;
    this.#size = size;
    this.#closed = closed;
    this.#events.setMaxListeners(0);
  }

  /** Opens (creating if needed) the spool at `path`; an existing one continues where it ended. */
  static async open(path: string): Promise<Spool> {
    const fh = await open(path, 'a+');
    const { size, mtimeMs } = await fh.stat();
    const spool = new Spool(path, fh, size, false);
    if (size > 0 && (await spool.#lastFrameType()) === FRAME_EXIT) {
      spool.#closed = true;
      spool.endedAt = mtimeMs; // ended under an earlier agent: when it was last written
    }
    return spool;
  }

  /**
   * Opens an existing spool only to read it (a hibernated sandbox's, in the store another node may
   * restore from): never created, never appended to. Throws ENOENT when there is none.
   */
  static async openToRead(path: string): Promise<Spool> {
    const fh = await open(path, 'r');
    const { size } = await fh.stat();
    const spool = new Spool(path, fh, size, false);
    if (size > 0 && (await spool.#lastFrameType()) === FRAME_EXIT) spool.#closed = true;
    return spool;
  }

  async #lastFrameType(): Promise<number | null> {
    let last: number | null = null;
    // not a reader: neither counted nor setting readToEndAt
    for await (const f of this.#frames(0, { follow: false }, false)) last = f.type;
    return last;
  }

  /** Bytes durably appended so far. */
  get size(): number {
    return this.#size;
  }

  /** True once the exit frame (or a close) ended the log. */
  get closed(): boolean {
    return this.#closed;
  }

  /**
   * Whether `offset` is where a frame starts (0, the end, or just past a frame): the only valid
   * resume points. Walks the frame headers from the start (reads 5 bytes per frame).
   */
  async isBoundary(offset: number): Promise<boolean> {
    if (offset === 0 || offset === this.#size) return true;
    if (offset > this.#size) return false;
    const head = Buffer.alloc(FRAME_HEADER_BYTES);
    let pos = 0;
    while (pos < offset) {
      const { bytesRead } = await this.#fh.read(head, 0, FRAME_HEADER_BYTES, pos);
      if (bytesRead < FRAME_HEADER_BYTES) return false;
      pos += FRAME_HEADER_BYTES + head.readUInt32BE(1);
    }
    return pos === offset;
  }

  /**
   * Appends whole frames (already encoded); readers are woken once the bytes are written.
   * @throws SpaceError NODE_DISK_FULL when the disk has no room (ENOSPC/EDQUOT): the file is cut
   *   back to its last whole frame, so readers never see part of one; the spool stays usable.
   */
  append(bytes: Buffer): Promise<void> {
    const done = this.#writing.then(async () => {
      let off = 0;
      try {
        while (off < bytes.length) {
          const { bytesWritten } = await this.#fh.write(bytes, off, bytes.length - off, this.#size + off);
          off += bytesWritten;
        }
      } catch (err) {
        if (off > 0) await this.#fh.truncate(this.#size).catch(() => {});
        throw diskFullError(err, 'command output');
      }
      this.#size += bytes.length;
      this.#events.emit('grow');
    });
    // one failed append must not fail every later one (nor be an unhandled rejection)
    this.#writing = done.catch(() => {});
    return done;
  }

  /**
   * Ends the log with `exitFrame` kept in memory only, for when the disk has no room for it:
   * readers get it after the last frame on disk (its event id is that frame's). Lost when the
   * agent restarts (the next one resumes the command's output from the guest, or ends it).
   */
  async failWith(exitFrame: Buffer): Promise<void> {
    await this.#writing;
    this.#tail = { type: exitFrame[0]!, payload: exitFrame.subarray(FRAME_HEADER_BYTES) };
    this.#closed = true;
    this.endedAt ??= Date.now();
    this.#events.emit('grow');
  }

  /** Marks the log complete (after the exit frame); followers finish once they reach the end. */
  async finish(): Promise<void> {
    await this.#writing;
    this.#closed = true;
    this.endedAt ??= Date.now();
    this.#events.emit('grow');
  }

  /**
   * Reads frames from byte `from`, following new ones until the log is finished (or only what
   * exists, with `follow: false`). Stops early when `signal` aborts. Throws RangeError when `from`
   * is past the end or not on a frame boundary. A reader that takes the exit frame and asks for
   * more sets {@link readToEndAt}; readers are counted in {@link readers} while they iterate.
   */
  frames(from: number, opts: { follow?: boolean; signal?: AbortSignal } = {}): AsyncGenerator<SpoolFrame> {
    return this.#frames(from, opts, true);
  }

  /** {@link frames}; `reader`: counted in {@link readers} and setting {@link readToEndAt}. */
  async *#frames(
    from: number,
    opts: { follow?: boolean; signal?: AbortSignal },
    reader: boolean,
  ): AsyncGenerator<SpoolFrame> {
    if (reader) this.readers += 1;
    try {
      const follow = opts.follow ?? true;
      if (from > this.#size) throw new RangeError(`offset ${from} is past the end (${this.#size})`);
      let pos = from;
      let buf: Buffer = Buffer.alloc(0);
      let bufStart = from;
      for (;;) {
        if (opts.signal?.aborted || this.#released) return;
        // decode every complete frame in the buffer
        for (;;) {
          if (buf.length < FRAME_HEADER_BYTES) break;
          const type = buf[0]!;
          if (type < 1 || type > FRAME_TRUNCATED)
            throw new RangeError(`offset ${bufStart} is not a frame boundary`);
          const len = buf.readUInt32BE(1);
          if (buf.length < FRAME_HEADER_BYTES + len) break;
          const end = bufStart + FRAME_HEADER_BYTES + len;
          yield { type, payload: buf.subarray(FRAME_HEADER_BYTES, FRAME_HEADER_BYTES + len), end };
          buf = buf.subarray(FRAME_HEADER_BYTES + len);
          bufStart = end;
          if (type === FRAME_EXIT) {
            if (reader) this.readToEndAt = Date.now();
            return;
          }
        }
        if (pos < this.#size) {
          const want = Math.min(READ_CHUNK_BYTES, this.#size - pos);
          const chunk = Buffer.allocUnsafe(want);
          const { bytesRead } = await this.#fh.read(chunk, 0, want, pos);
          pos += bytesRead;
          buf =
            buf.length === 0
              ? chunk.subarray(0, bytesRead)
              : Buffer.concat([buf, chunk.subarray(0, bytesRead)]);
          continue;
        }
        if (this.#tail && buf.length === 0 && this.#closed) {
          yield { type: this.#tail.type, payload: this.#tail.payload, end: this.#size };
          if (reader) this.readToEndAt = Date.now();
          return;
        }
        if (!follow || this.#closed || this.#released) return;
        await new Promise<void>((resolve) => {
          const done = () => {
            this.#events.off('grow', done);
            opts.signal?.removeEventListener('abort', done);
            resolve();
          };
          this.#events.on('grow', done);
          opts.signal?.addEventListener('abort', done);
        });
      }
    } finally {
      if (reader) this.readers -= 1;
    }
  }

  /** Closes the file; readers following it end (they have nothing more to wait for). */
  async close(): Promise<void> {
    await this.#writing;
    this.#released = true;
    await this.#fh.close();
    this.#events.emit('grow');
  }
}

/** Encodes one frame. */
export function encodeFrame(type: number, payload: Buffer): Buffer {
  const head = Buffer.allocUnsafe(FRAME_HEADER_BYTES);
  head[0] = type;
  head.writeUInt32BE(payload.length, 1);
  return Buffer.concat([head, payload]);
}

/**
 * Incremental frame splitter for a byte stream: feed chunks, get whole frames (as their raw
 * bytes, ready to append) plus their types.
 */
export class FrameSplitter {
  #buf: Buffer = Buffer.alloc(0);
  /** Raw bytes consumed as whole frames so far. */
  consumed = 0;

  push(chunk: Buffer): { type: number; raw: Buffer }[] {
    this.#buf = this.#buf.length === 0 ? chunk : Buffer.concat([this.#buf, chunk]);
    const out: { type: number; raw: Buffer }[] = [];
    for (;;) {
      if (this.#buf.length < FRAME_HEADER_BYTES) break;
      const len = this.#buf.readUInt32BE(1);
      const total = FRAME_HEADER_BYTES + len;
      if (this.#buf.length < total) break;
      out.push({ type: this.#buf[0]!, raw: this.#buf.subarray(0, total) });
      this.#buf = this.#buf.subarray(total);
      this.consumed += total;
    }
    return out;
  }
}
