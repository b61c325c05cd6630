/**
 * The node's out-of-memory guard for drivers whose sandboxes have no OOM killer of their own
 * (gVisor: the sentry has none, and the host's memory cgroup ends the whole sandbox when one
 * process takes too much — case R21). It reads each running sandbox's host memory charge (less
 * the file pages the host reclaims on its own: Driver.memoryCharge) and,
 * when the charge comes within a margin of its limit, asks the sandbox's guest to kill the process
 * holding the most memory (guest/oom.ts), as Linux's OOM killer would: that process dies alone
 * and the sandbox lives on. Sandboxes are read more often the closer they are to their limit, so
 * idle ones cost a few reads a second.
 *
 * What it cannot catch: memory that no process holds (full tmpfs mounts, bounded in the OCI spec)
 * and an allocation faster than {@link ALLOC_BYTES_PER_MS_PER_VCPU} across the margin. Then the
 * host still ends the sandbox, and its record says `oom`.
 */
import type { Logger } from 'pino';
import { SpaceError } from '../../core/errors.ts';
import type { OomKillResult } from '../../core/guest-protocol.ts';
import { F } from '../../core/log-fields.ts';

/**
 * Fastest allocation the margin has to absorb, bytes per ms per vCPU: ~0.8–0.9 GB/s measured here
 * for Python appending `bytearray(16 MiB)` in a gVisor sandbox (runsc 2024-07-29, both
 * platforms, 2-core VM), rounded up to 1 GiB/s.
 */
export const ALLOC_BYTES_PER_MS_PER_VCPU = 2 ** 30 / 1000;

/**
 * Memory kept between the guard's threshold and the host limit, bytes per vCPU: what the fastest
 * allocation ({@link ALLOC_BYTES_PER_MS_PER_VCPU}) adds while the guard reads ({@link MIN_CHECK_MS})
 * and the guest finds and kills its victim (tens of ms on a busy node). 32 MiB was outrun in the
 * R21 test (Python adding 32 MiB at a time in a 256 MiB sandbox: the host ended the sandbox).
 */
export const MARGIN_BYTES_PER_VCPU = 64 * 2 ** 20;

/** Shortest and longest wait between two reads of one sandbox, ms. */
export const MIN_CHECK_MS = 5;
export const MAX_CHECK_MS = 500;

/** Wait after a kill before the next read of that sandbox (its memory is being freed), ms. */
export const AFTER_KILL_MS = 100;

/**
 * The charge at which the guard kills, bytes: the limit less {@link MARGIN_BYTES_PER_VCPU} per
 * vCPU, the margin never more than a quarter of the limit. Pure.
 */
export function killThreshold(limitBytes: number, vcpus: number): number {
  const margin = Math.min(limitBytes / 4, MARGIN_BYTES_PER_VCPU * Math.max(1, Math.ceil(vcpus)));
  return Math.floor(limitBytes - margin);
}

/**
 * When to read a sandbox again, ms from now: the time its fastest possible allocation needs to
 * reach the threshold, within [{@link MIN_CHECK_MS}, {@link MAX_CHECK_MS}]. Pure.
 */
export function nextCheckMs(chargeBytes: number, thresholdBytes: number, vcpus: number): number {
  const rate = ALLOC_BYTES_PER_MS_PER_VCPU * Math.max(1, Math.ceil(vcpus));
  const ms = (thresholdBytes - chargeBytes) / rate;
  return Math.min(MAX_CHECK_MS, Math.max(MIN_CHECK_MS, Math.floor(ms)));
}

/** A sandbox the guard looks after. */
export interface GuardedSandbox {
  id: string;
  instanceId: string;
  /** Its host memory limit, bytes. */
  limitBytes: number;
  vcpus: number;
  /** Asks its guest to kill the process holding the most memory. */
  oomKill(): Promise<OomKillResult>;
}

export interface MemoryGuardOptions {
  /** The sandboxes to guard now (running, not paused); asked on every tick. */
  sandboxes(): GuardedSandbox[];
  /** The instance's host memory charge now, bytes; undefined when it cannot be read (gone). */
  charge(instanceId: string): number | undefined;
  log: Logger;
}

interface Watch {
  nextAt: number;
  /** A kill is in flight: no second one until it answered. */
  killing: boolean;
  /** The guest cannot kill (an older daemon): never asked again. */
  unsupported: boolean;
}

/** See the file comment. `start()` begins; `stop()` ends every timer. */
export class MemoryGuard {
  readonly #o: MemoryGuardOptions;
  readonly #watches = new Map<string, Watch>();
  #timer: NodeJS.Timeout | null = null;
  #stopped = true;

  constructor(o: MemoryGuardOptions) {
    this.#o = o;
  }

  start(): void {
    if (!this.#stopped) return;
    this.#stopped = false;
    this.#schedule(0);
  }

  stop(): void {
    this.#stopped = true;
    if (this.#timer) clearTimeout(this.#timer);
    this.#timer = null;
  }

  #schedule(ms: number): void {
    if (this.#stopped) return;
    this.#timer = setTimeout(() => this.tick(), ms);
    this.#timer.unref();
  }

  /**
   * One pass: reads every sandbox that is due, kills where a charge crossed its threshold, and
   * schedules the next pass for the earliest sandbox due. Exposed for tests; never throws.
   */
  tick(now = Date.now()): void {
    if (this.#timer) clearTimeout(this.#timer);
    this.#timer = null;
    const seen = new Set<string>();
    let earliest = now + MAX_CHECK_MS;
    for (const sb of this.#o.sandboxes()) {
      seen.add(sb.id);
      let w = this.#watches.get(sb.id);
      if (!w) {
        w = { nextAt: now, killing: false, unsupported: false };
        this.#watches.set(sb.id, w);
      }
      if (!w.unsupported && !w.killing && w.nextAt <= now) w.nextAt = this.#check(sb, w, now);
      if (!w.unsupported && !w.killing) earliest = Math.min(earliest, w.nextAt);
    }
    for (const id of this.#watches.keys()) if (!seen.has(id)) this.#watches.delete(id);
    this.#schedule(Math.max(MIN_CHECK_MS, earliest - now));
  }

  /** Reads one sandbox; returns when to read it next. */
  #check(sb: GuardedSandbox, w: Watch, now: number): number {
    const charge = this.#o.charge(sb.instanceId);
    if (charge === undefined) return now + MAX_CHECK_MS;
    const threshold = killThreshold(sb.limitBytes, sb.vcpus);
    if (charge < threshold) return now + nextCheckMs(charge, threshold, sb.vcpus);
    w.killing = true;
    const log = this.#o.log.child({ [F.sandboxId]: sb.id });
    sb.oomKill()
      .then(({ killed }) => {
        if (killed) {
          log.warn(
            { pid: killed.pid, comm: killed.comm, rssBytes: killed.rssBytes, chargeBytes: charge },
            'process killed: the sandbox ran out of memory',
          );
          w.nextAt = Date.now() + AFTER_KILL_MS;
        } else {
          // nothing but the guest daemon left: what holds the memory is no process (a tmpfs)
          w.nextAt = Date.now() + MAX_CHECK_MS;
        }
      })
      .catch((err: unknown) => {
        if (err instanceof SpaceError && err.code === 'BAD_REQUEST') {
          w.unsupported = true;
          log.info({ err }, 'the sandbox’s guest cannot kill on memory pressure (older daemon)');
        } else {
          log.warn({ err }, 'out-of-memory kill failed');
        }
        w.nextAt = Date.now() + AFTER_KILL_MS;
      })
      .finally(() => {
        w.killing = false;
        if (!this.#stopped) this.tick();
      });
    return now + AFTER_KILL_MS;
  }
}
