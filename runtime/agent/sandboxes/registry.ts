/**
 * The node's registry of sandboxes in memory: those it runs, creates and deletes in flight, the
 * tombstones deletes leave, and the pause/resume in flight per sandbox. Every verb reads and writes
 * the same registry, so a verb's view of the others (is it being created? deleted?) is one lookup.
 */
import { SpaceError } from '../../core/errors.ts';
import type { LocalSandbox } from './types.ts';

/** Tombstones older than this are forgotten (ms): far longer than any create can take. */
export const TOMBSTONE_TTL_MS = 24 * 3600 * 1000;

export class SandboxRegistry {
  /** Sandboxes this node runs (paused or not), by id. */
  readonly running = new Map<string, LocalSandbox>();
  /** Creates in flight: a second create of the same id joins the first. */
  readonly creating = new Map<string, Promise<LocalSandbox>>();
  /** Deleted ids and when (ms since the epoch): a create that arrives late is refused. */
  readonly tombstones = new Map<string, number>();
  /** Deletes in progress: a second delete of the same sandbox (API retry, reconciliation) joins it. */
  readonly deleting = new Map<string, Promise<void>>();
  /** Pause/resume in flight per sandbox (one at a time). */
  readonly lifecycle = new Map<string, Promise<unknown>>();
  /** Set by shutdown: creates and resumes are refused from then on. */
  closing = false;

  /** The running sandbox or SANDBOX_NOT_FOUND. */
  get(id: string): LocalSandbox {
    const sb = this.running.get(id);
    if (!sb) throw new SpaceError('SANDBOX_NOT_FOUND', `no sandbox ${id} on this node`, { sandboxId: id });
    return sb;
  }

  list(): LocalSandbox[] {
    return [...this.running.values()];
  }

  /**
   * Whether the sandbox is being made or destroyed by this agent: then an instance that does not
   * answer is not one that stopped on its own.
   */
  inTransit(id: string): boolean {
    return this.creating.has(id) || this.tombstones.has(id);
  }

  /** Leaves a tombstone for `id` (now) and forgets those older than {@link TOMBSTONE_TTL_MS}. */
  tombstone(id: string, now = Date.now()): void {
    this.tombstones.set(id, now);
    const cutoff = now - TOMBSTONE_TTL_MS;
    for (const [t, at] of this.tombstones) if (at < cutoff) this.tombstones.delete(t);
  }

  /** Runs `fn` after any pause/resume of `id` in flight (one at a time per sandbox). */
  async serial<T>(id: string, fn: () => Promise<T>): Promise<T> {
    const prior = this.lifecycle.get(id) ?? Promise.resolve();
    const p = prior.catch(() => {}).then(fn);
    this.lifecycle.set(id, p);
    try {
      return await p;
    } finally {
      if (this.lifecycle.get(id) === p) this.lifecycle.delete(id);
    }
  }

  /**
   * Holds the sandbox's guest for one call: a pause waits (bounded) until every hold is released
   * before it freezes the guest, so no call hangs on a frozen guest. Returns the sandbox and the
   * release function (idempotent).
   * @throws SpaceError SANDBOX_PAUSED while a pause holds or is taking it, SANDBOX_NOT_FOUND.
   */
  holdGuest(id: string): { sb: LocalSandbox; release: () => void } {
    const sb = this.get(id);
    if (sb.paused) {
      throw new SpaceError('SANDBOX_PAUSED', `sandbox ${id} is paused; resume it first`, { sandboxId: id });
    }
    sb.guestCalls += 1;
    let held = true;
    return {
      sb,
      release: () => {
        if (!held) return;
        held = false;
        sb.guestCalls -= 1;
      },
    };
  }
}
