/**
 * Output frames and the per-process output stream.
 *
 * Frame: `[type u8][length u32 BE][payload]` (see core/guest-protocol.ts). An {@link OutputStream}
 * holds the frame bytes of one process as a contiguous byte range `[base, end)`:
 *
 * - `[cursor, end)` is unsent. When it exceeds {@link OUTPUT_HIGH_WATER_BYTES} the stream asks its owner
 *   to pause the child's pipes (`onPause`) and resumes them (`onResume`) once the consumer has taken
 *   it below {@link OUTPUT_LOW_WATER_BYTES}. So a child nobody reads just blocks on its pipe.
 * - `[base, cursor)` is already handed to a consumer connection but may have been lost with it; the
 *   last {@link OUTPUT_REPLAY_WINDOW_BYTES} of it are kept so a reconnect at `offset` N continues at
 *   exactly byte N. Memory per process is therefore bounded by about window + high water + one chunk.
 *
 * One consumer at a time: attaching a new one cuts the old connection.
 */

import type { ServerResponse } from 'node:http';
import type { ProcessExit } from '../core/guest-protocol.ts';
import { FRAME_EXIT, FRAME_HEADER_BYTES, FRAME_STDERR, FRAME_STDOUT } from '../core/guest-protocol.ts';

/** Unsent output (bytes) above which the child's pipes are paused. */
export const OUTPUT_HIGH_WATER_BYTES = 1024 * 1024;
/** Unsent output (bytes) below which paused pipes are resumed. */
export const OUTPUT_LOW_WATER_BYTES = 256 * 1024;
/** Already-sent frame bytes kept for reconnects with `?offset=N`. */
export const OUTPUT_REPLAY_WINDOW_BYTES = 1024 * 1024;

/** Encodes one frame. */
export function encodeFrame(type: number, payload: Uint8Array): Buffer {
  const frame = Buffer.allocUnsafe(FRAME_HEADER_BYTES + payload.length);
  frame[0] = type;
  frame.writeUInt32BE(payload.length, 1);
  frame.set(payload, FRAME_HEADER_BYTES);
  return frame;
}

/** One decoded frame. */
export interface Frame {
  type: number;
  payload: Buffer;
}

/** Incremental frame decoder (for tests and any reader of the stream). */
export class FrameDecoder {
  #pending: Buffer = Buffer.alloc(0);

  /** Feeds bytes; returns the frames completed by them. */
  push(chunk: Uint8Array): Frame[] {
    this.#pending = this.#pending.length === 0 ? Buffer.from(chunk) : Buffer.concat([this.#pending, chunk]);
    const frames: Frame[] = [];
    let at = 0;
    while (this.#pending.length - at >= FRAME_HEADER_BYTES) {
      const length = this.#pending.readUInt32BE(at + 1);
      if (this.#pending.length - at - FRAME_HEADER_BYTES < length) break;
      const start = at + FRAME_HEADER_BYTES;
      frames.push({ type: this.#pending[at]!, payload: this.#pending.subarray(start, start + length) });
      at = start + length;
    }
    this.#pending = this.#pending.subarray(at);
    return frames;
  }

  /** Bytes of an incomplete frame still held. */
  get pendingBytes(): number {
    return this.#pending.length;
  }
}

/** Why {@link OutputStream.attach} refused an offset. */
export interface OffsetRefusal {
  offset: number;
  windowStart: number;
  windowEnd: number;
}

interface Consumer {
  res: ServerResponse;
  waitingDrain: boolean;
}

export interface OutputStreamHooks {
  /** Unsent bytes passed the high water mark: stop reading the child's pipes. */
  onPause?: () => void;
  /** Unsent bytes fell below the low water mark: read again. */
  onResume?: () => void;
  /** The exit frame has been written out completely to a consumer. */
  onDelivered?: () => void;
}

/** The frame byte stream of one process (see the file comment). */
export class OutputStream {
  readonly #hooks: OutputStreamHooks;
  readonly #chunks: Buffer[] = [];
  readonly #starts: number[] = [];
  #head = 0;
  #base = 0;
  #end = 0;
  #cursor = 0;
  #finished = false;
  #paused = false;
  #consumer: Consumer | null = null;
  #pumping = false;

  constructor(hooks: OutputStreamHooks = {}) {
    this.#hooks = hooks;
  }

  /** Appends a stdout frame. */
  stdout(data: Uint8Array): void {
    if (data.length > 0) this.#append(encodeFrame(FRAME_STDOUT, data));
  }

  /** Appends a stderr frame. */
  stderr(data: Uint8Array): void {
    if (data.length > 0) this.#append(encodeFrame(FRAME_STDERR, data));
  }

  /** Appends the exit frame; nothing may follow it. */
  finish(exit: ProcessExit): void {
    if (this.#finished) return;
    this.#append(encodeFrame(FRAME_EXIT, Buffer.from(JSON.stringify(exit))));
    this.#finished = true;
    this.#pump();
  }

  get finished(): boolean {
    return this.#finished;
  }

  get paused(): boolean {
    return this.#paused;
  }

  /** Frame bytes produced so far. */
  get end(): number {
    return this.#end;
  }

  /** Oldest offset a consumer may still attach at. */
  get windowStart(): number {
    return this.#base;
  }

  /** Frame bytes not yet handed to a consumer. */
  get unsentBytes(): number {
    return this.#end - this.#cursor;
  }

  /** Bytes held in memory (window + unsent). */
  get heldBytes(): number {
    return this.#end - this.#base;
  }

  get hasConsumer(): boolean {
    return this.#consumer !== null;
  }

  /**
   * Makes `res` the consumer from frame byte `offset` on, cutting any previous consumer.
   * Returns a refusal (and leaves everything unchanged) when `offset` is outside `[base, end]`.
   */
  attach(res: ServerResponse, offset: number): OffsetRefusal | null {
    if (offset < this.#base || offset > this.#end) {
      return { offset, windowStart: this.#base, windowEnd: this.#end };
    }
    const old = this.#consumer;
    const consumer: Consumer = { res, waitingDrain: false };
    this.#consumer = consumer;
    if (old) old.res.destroy();
    this.#cursor = offset;
    res.on('close', () => {
      if (this.#consumer === consumer) this.#consumer = null;
    });
    res.writeHead(200, { 'content-type': 'application/octet-stream', 'cache-control': 'no-store' });
    res.flushHeaders();
    this.#updatePause();
    this.#pump();
    return null;
  }

  /** Cuts the consumer, if any. */
  dispose(): void {
    const old = this.#consumer;
    this.#consumer = null;
    old?.res.destroy();
  }

  #append(frame: Buffer): void {
    if (this.#finished) return;
    this.#chunks.push(frame);
    this.#starts.push(this.#end);
    this.#end += frame.length;
    this.#updatePause();
    this.#pump();
  }

  /** Index of the chunk holding byte `offset` (offset < end). */
  #locate(offset: number): number {
    let lo = this.#head;
    let hi = this.#chunks.length - 1;
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (this.#starts[mid]! <= offset) lo = mid;
      else hi = mid - 1;
    }
    return lo;
  }

  #pump(): void {
    if (this.#pumping) return;
    this.#pumping = true;
    try {
      for (;;) {
        const consumer = this.#consumer;
        if (!consumer || consumer.waitingDrain) return;
        const { res } = consumer;
        if (res.destroyed || res.writableEnded) return;
        if (this.#cursor >= this.#end) {
          if (this.#finished) {
            res.end(() => {
              if (this.#consumer === consumer) this.#consumer = null;
              this.#hooks.onDelivered?.();
            });
          }
          return;
        }
        const i = this.#locate(this.#cursor);
        const chunk = this.#chunks[i]!;
        const slice = chunk.subarray(this.#cursor - this.#starts[i]!);
        this.#cursor += slice.length;
        const ok = res.write(slice);
        this.#trim();
        this.#updatePause();
        if (!ok) {
          consumer.waitingDrain = true;
          res.once('drain', () => {
            consumer.waitingDrain = false;
            if (this.#consumer === consumer) this.#pump();
          });
          return;
        }
      }
    } finally {
      this.#pumping = false;
    }
  }

  /** Drops sent chunks that fell out of the replay window. */
  #trim(): void {
    const keepFrom = this.#cursor - OUTPUT_REPLAY_WINDOW_BYTES;
    while (this.#head < this.#chunks.length - 1) {
      const next = this.#starts[this.#head + 1]!;
      if (next > keepFrom) break;
      this.#head++;
      this.#base = next;
    }
    if (this.#head > 1024 && this.#head * 2 > this.#chunks.length) {
      this.#chunks.splice(0, this.#head);
      this.#starts.splice(0, this.#head);
      this.#head = 0;
    }
  }

  #updatePause(): void {
    const unsent = this.#end - this.#cursor;
    if (!this.#paused && unsent > OUTPUT_HIGH_WATER_BYTES) {
      this.#paused = true;
      this.#hooks.onPause?.();
    } else if (this.#paused && unsent <= OUTPUT_LOW_WATER_BYTES) {
      this.#paused = false;
      this.#hooks.onResume?.();
    }
  }
}
