/**
 * Lifetime enforcement: every interval, claim sandboxes past their deadline (expire.lua moves
 * each to killing and queues its delete operation atomically), and every
 * {@link RECONCILE_INTERVAL_MS} run the reconciler. Any API replica may run it; the scripts make
 * double claims impossible.
 */
import type { Logger } from 'pino';
import { F } from '../core/log-fields.ts';
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
      const ids = await this.#store.claimExpired();
      for (const id of ids) this.#log.info({ [F.sandboxId]: id }, 'sandbox lifetime reached');
      if (this.#reconciler && Date.now() - this.#lastReconcile >= RECONCILE_INTERVAL_MS) {
        this.#lastReconcile = Date.now();
        await this.#reconciler.pass();
      }
    } catch (err) {
      this.#log.error({ err }, 'expiry sweep failed');
    }
  }

  async stop(): Promise<void> {
    if (this.#timer) clearInterval(this.#timer);
    await this.#running;
  }
}
