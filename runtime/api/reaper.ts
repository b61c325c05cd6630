/**
 * Lifetime enforcement: every interval, claim sandboxes past their deadline (expire.lua moves
 * each to killing and queues its delete operation atomically, or queues a pause for one created
 * with `onTimeout: 'pause'`), pause sandboxes whose idle timer
 * ran out (`autoPauseSec`), and every {@link RECONCILE_INTERVAL_MS} run the reconciler. Any API
 * replica may run it; the scripts make double claims impossible.
 */
import type { Logger } from 'pino';
import { SpaceError } from '../core/errors.ts';
import { requestLifecycle } from '../core/lifecycle-requests.ts';
import { F } from '../core/log-fields.ts';
import { isRedisUnavailable } from '../core/redis-errors.ts';
import { keys } from '../core/redis-keys.ts';
import type { Reconciler } from './reconciler.ts';
import type { SandboxStore } from './sandbox-store.ts';

/** How often the reconciliation pass runs (ms). */
export const RECONCILE_INTERVAL_MS = 2_000;

export class Reaper {
  readonly #store: SandboxStore;
  readonly #log: Logger;
  readonly #intervalMs: number;
  readonly #reconciler: Reconciler | null;
  #lastReconcile = 0;
  #timer: NodeJS.Timeout | null = null;
  #running: Promise<void> | null = null;

  constructor(store: SandboxStore, log: Logger, intervalMs: number, reconciler: Reconciler | null = null) {
    this.#store = store;
    this.#reconciler = reconciler;
    this.#log = log;
    this.#intervalMs = intervalMs;
  }

  start(): void {
    this.#timer = setInterval(() => {
      if (this.#running) return;
      this.#running = this.#tick().finally(() => (this.#running = null));
    }, this.#intervalMs);
  }

  async #tick(): Promise<void> {
    try {
      const { killed, paused } = await this.#store.claimExpired();
      for (const id of killed) this.#log.info({ [F.sandboxId]: id }, 'sandbox lifetime reached');
      for (const id of paused) this.#log.info({ [F.sandboxId]: id }, 'sandbox lifetime reached: pausing');
      await this.#autoPause();
      if (this.#reconciler && Date.now() - this.#lastReconcile >= RECONCILE_INTERVAL_MS) {
        this.#lastReconcile = Date.now();
        await this.#reconciler.pass();
      }
    } catch (err) {
      // nodes cannot heartbeat while Redis is away: the reconciler must not count that silence
      if (isRedisUnavailable(err)) this.#reconciler?.noteStoreOutage();
      this.#log.error({ err }, 'expiry sweep failed');
    }
  }

  /**
   * Pauses sandboxes idle past their `autoPauseSec` (the agents and the API put them on the
   * `autopause` timer when they turn idle). Whoever removes an entry first owns it; a sandbox that
   * turned active, or is no longer running, is left alone.
   */
  async #autoPause(now = Date.now(), limit = 100): Promise<void> {
    const redis = this.#store.redis;
    const due = await redis.zrangebyscore(keys.autoPause(), '-inf', now, 'LIMIT', 0, limit);
    for (const id of due) {
      if ((await redis.zrem(keys.autoPause(), id)) !== 1) continue;
      if ((await redis.hget(keys.sandbox(id), 'state')) !== 'running') continue;
      try {
        const asked = await requestLifecycle(redis, 'sandbox.pause', id, { reason: 'idle' });
        this.#log.info({ [F.sandboxId]: id, [F.operationId]: asked.operationId }, 'sandbox idle: pausing');
      } catch (err) {
        if (!(err instanceof SpaceError)) throw err;
      }
    }
  }

  async stop(): Promise<void> {
    if (this.#timer) clearInterval(this.#timer);
    await this.#running;
  }
}
