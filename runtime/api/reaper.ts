/**
 * Lifetime enforcement: every interval, claim sandboxes past their deadline (expire.lua moves
 * each to killing and queues its delete operation atomically). Any API replica may run it;
 * the script makes double claims impossible.
 */
import type { Logger } from 'pino';
import { F } from '../core/log-fields.ts';
import type { SandboxStore } from './sandbox-store.ts';

export class Reaper {
  readonly #store: SandboxStore;
  readonly #log: Logger;
  readonly #intervalMs: number;
  #timer: NodeJS.Timeout | null = null;
  #running: Promise<void> | null = null;

  constructor(store: SandboxStore, log: Logger, intervalMs: number) {
    this.#store = store;
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
    } catch (err) {
      this.#log.error({ err }, 'expiry sweep failed');
    }
  }

  async stop(): Promise<void> {
    if (this.#timer) clearInterval(this.#timer);
    await this.#running;
  }
}
