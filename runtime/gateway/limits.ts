/**
 * Per-connection and per-sandbox limits: the numbers every proxy path applies, a token bucket for
 * DNS query rates, and a byte/idle guard for a pair of sockets. A slow or greedy client holds only
 * its own slots (T24).
 */
import type { Socket } from 'node:net';

/** Limits that apply to one proxied connection (units in the names). */
export interface ConnectionLimits {
  /** Deadline from accept to a whole ClientHello / request head, ms. */
  readonly handshakeTimeoutMs: number;
  /** No bytes either way for this long closes the connection, ms. */
  readonly idleTimeoutMs: number;
  /** Upstream TCP connect timeout, ms. */
  readonly dialTimeoutMs: number;
  /** Bytes both ways one connection may carry. */
  readonly maxConnectionBytes: number;
  /** Largest ClientHello, bytes. */
  readonly maxHelloBytes: number;
  /** Largest HTTP request head, bytes. */
  readonly maxHeaderBytes: number;
  /** Largest request body and largest response body on an intercepted connection, bytes each. */
  readonly maxBodyBytes: number;
}

/** A token bucket: `rate` tokens per second, at most `burst` stored. `now` in ms (injectable). */
export class TokenBucket {
  private tokens: number;
  private last: number;
  private readonly rate: number;
  private readonly burst: number;
  private readonly now: () => number;

  constructor(rate: number, burst: number, now: () => number = Date.now) {
    this.rate = rate;
    this.burst = burst;
    this.now = now;
    this.tokens = burst;
    this.last = now();
  }

  /** Takes one token; false when the bucket is empty (the caller refuses the request). */
  take(): boolean {
    const t = this.now();
    this.tokens = Math.min(this.burst, this.tokens + ((t - this.last) / 1000) * this.rate);
    this.last = t;
    if (this.tokens < 1) return false;
    this.tokens -= 1;
    return true;
  }
}

/** Why a guarded pair was closed by a limit. */
export type LimitReason = 'idle-timeout' | 'byte-limit';

/**
 * Applies the idle timeout and the byte cap to `sockets` (a client and, once dialled, its upstream):
 * any socket idle for `idleTimeoutMs` or more than `maxConnectionBytes` read in total calls
 * `onLimit` once. Returns `add(socket)` to guard a socket dialled later and `bytes()` (total read).
 */
export function guardSockets(
  limits: Pick<ConnectionLimits, 'idleTimeoutMs' | 'maxConnectionBytes'>,
  onLimit: (reason: LimitReason) => void,
): { add(socket: Socket): void; bytes(): number } {
  let total = 0;
  let fired = false;
  const fire = (reason: LimitReason) => {
    if (fired) return;
    fired = true;
    onLimit(reason);
  };
  const sockets: Socket[] = [];
  return {
    add(socket) {
      sockets.push(socket);
      // activity on either side keeps both alive: reset every peer's idle timer on data
      socket.setTimeout(limits.idleTimeoutMs, () => fire('idle-timeout'));
      socket.on('data', (chunk: Buffer) => {
        total += chunk.length;
        if (total > limits.maxConnectionBytes) fire('byte-limit');
        for (const s of sockets) if (s !== socket) s.setTimeout(limits.idleTimeoutMs);
      });
    },
    bytes: () => total,
  };
}
