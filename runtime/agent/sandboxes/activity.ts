/**
 * Activity of the node's sandboxes, for metering and auto-pause: a sandbox is *active* while a
 * command runs in it or a data-plane request (stream, stdin, signal, file transfer) is open, and
 * for `graceMs` after the last of them ends; otherwise *idle*. Each change is reported to Redis
 * (`core/usage.ts`), which closes the previous interval on Redis's clock. Pauses and resumes are
 * reported by the API's operations; a paused sandbox is not tracked here until it resumes.
 *
 * Reports for one sandbox go out in order; one that fails (Redis down) is retried by
 * {@link ActivityMeter.sync}, which the agent calls periodically. Nothing is lost meanwhile: the
 * open interval keeps counting in the state it was in.
 */
import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import { F } from '../../core/log-fields.ts';
import { reportUsage, type UsageState } from '../../core/usage.ts';

/** One sandbox's tracked activity. */
interface Tracked {
  /** Open commands and requests. */
  busy: number;
  /** The state this node believes the sandbox is in. */
  desired: 'active' | 'idle';
  /** The last state Redis accepted from this node (null: not yet reported). */
  reported: UsageState | null;
  paused: boolean;
  timer: NodeJS.Timeout | null;
  chain: Promise<void>;
}

/** Called with each closed interval (for the agent's Prometheus counters). */
export type UsageObserver = (state: UsageState, closedMs: number) => void;

export class ActivityMeter {
  readonly #redis: Redis;
  readonly #graceMs: number;
  readonly #log: Logger;
  #observe: UsageObserver;
  readonly #sandboxes = new Map<string, Tracked>();

  /** @param o.graceMs how long a sandbox stays active after its last command or request, ms. */
  constructor(o: { redis: Redis; graceMs: number; log: Logger; observe?: UsageObserver }) {
    this.#redis = o.redis;
    this.#graceMs = o.graceMs;
    this.#log = o.log;
    this.#observe = o.observe ?? (() => {});
  }

  /** Sets the function told about every closed interval this node reported (metrics). */
  observe(fn: UsageObserver): void {
    this.#observe = fn;
  }

  /**
   * Starts tracking a sandbox this node runs. `reported` is what is already in Redis for it (the
   * API reports `idle` when a create or resume finishes); null makes the next sync report `idle`
   * (after an agent restart: closes whatever interval the previous agent left open).
   */
  track(id: string, o: { paused?: boolean; reported?: UsageState | null } = {}): void {
    if (this.#sandboxes.has(id)) return;
    this.#sandboxes.set(id, {
      busy: 0,
      desired: 'idle',
      reported: o.reported === undefined ? 'idle' : o.reported,
      paused: o.paused ?? false,
      timer: null,
      chain: Promise.resolve(),
    });
  }

  /** Stops tracking (deleted, or hibernated away from this node). */
  untrack(id: string): void {
    const t = this.#sandboxes.get(id);
    if (t?.timer) clearTimeout(t.timer);
    this.#sandboxes.delete(id);
  }

  /** The sandbox was frozen: stop reporting (the API reported `paused`). */
  paused(id: string): void {
    const t = this.#sandboxes.get(id);
    if (!t) return;
    t.paused = true;
    t.reported = 'paused';
  }

  /** The sandbox runs again; the API reports `idle` for it, and any open work makes it active. */
  resumed(id: string): void {
    const t = this.#sandboxes.get(id);
    if (!t) return;
    t.paused = false;
    t.reported = 'idle';
    t.desired = t.busy > 0 ? 'active' : 'idle';
    this.#push(id, t);
  }

  /**
   * Marks one unit of work (a command, a request) open; returns the function that closes it
   * (idempotent). Unknown sandboxes are ignored.
   */
  begin(id: string): () => void {
    const t = this.#sandboxes.get(id);
    if (!t) return () => {};
    t.busy += 1;
    if (t.timer) {
      clearTimeout(t.timer);
      t.timer = null;
    }
    if (t.desired !== 'active') {
      t.desired = 'active';
      this.#push(id, t);
    }
    let open = true;
    return () => {
      if (!open) return;
      open = false;
      t.busy -= 1;
      if (t.busy > 0 || this.#sandboxes.get(id) !== t) return;
      if (t.timer) clearTimeout(t.timer);
      t.timer = setTimeout(() => {
        t.timer = null;
        if (t.busy > 0) return;
        t.desired = 'idle';
        this.#push(id, t);
      }, this.#graceMs);
      t.timer.unref();
    };
  }

  /** Current view: state per tracked sandbox (tests, metrics). */
  state(id: string): { desired: 'active' | 'idle'; reported: UsageState | null; busy: number } | null {
    const t = this.#sandboxes.get(id);
    return t ? { desired: t.desired, reported: t.reported, busy: t.busy } : null;
  }

  /** Re-sends every state Redis has not accepted yet; resolves when they are sent. */
  async sync(): Promise<void> {
    for (const [id, t] of this.#sandboxes) if (!t.paused && t.reported !== t.desired) this.#push(id, t);
    await Promise.all([...this.#sandboxes.values()].map((t) => t.chain));
  }

  #push(id: string, t: Tracked): void {
    t.chain = t.chain.then(async () => {
      const want = t.desired;
      if (t.paused || t.reported === want || this.#sandboxes.get(id) !== t) return;
      try {
        const r = await reportUsage(this.#redis, id, want);
        if (r.previous) this.#observe(r.previous, r.closedMs);
        t.reported = r.state ?? want;
      } catch (err) {
        this.#log.warn({ err, [F.sandboxId]: id, state: want }, 'usage report failed; retrying later');
      }
    });
  }
}
