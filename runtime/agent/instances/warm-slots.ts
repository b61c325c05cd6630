/**
 * The warm pool's side on the node: it boots slots through the factory (each with its guest
 * connection open and its state directory made ahead, so a claim is a rename and a write), keeps
 * their guests checked, discards them, and paces refills between creates. The pool (warm-pool.ts)
 * takes its `boot`, `discard` and `schedule` from here: nothing calls back into the sandbox manager.
 */
import { rm } from 'node:fs/promises';
import type { Logger } from 'pino';
import { F } from '../../core/log-fields.ts';
import { untraced } from '../../core/tracing.ts';
import type { InstanceInfo } from '../drivers/driver.ts';
import { GuestClient } from '../guest-client.ts';
import type { StateFiles } from '../sandboxes/state-files.ts';
import type { InstanceFactory, InstanceShape } from './factory.ts';
import { refillDelay } from './refill-pacing.ts';
import type { WarmPool } from './warm-pool.ts';

/**
 * Each ready warm slot's guest is asked whether it answers at most this often (ms), by the
 * watchdog, one slot at a time, and not while a create is in flight. Asking every slot on every
 * pass (5 s) cost a node with 32 slots ~0.4 s of CPU in a burst each pass — a request into a
 * gVisor sandbox is ~12 ms of CPU under the ptrace platform — and the creates that met the burst
 * waited: sequential warm creates took a median 18–24 ms on a 32-slot pool against 10–13 ms with
 * those checks off (`npm run bench -- latency --phases warm --concurrency 1`, 2-core VM). A slot
 * whose instance died is still caught at once by the claim (its process is gone); only a guest
 * that stopped answering inside a live instance may now wait up to this long to be replaced, and
 * the create that claims it first fails its guest calls and ends as crashed. Below the guest's
 * keep-alive (65 s), so the slot's connection stays open for its claim.
 */
export const WARM_SLOT_CHECK_MS = 30_000;

export class WarmSlots {
  readonly #factory: InstanceFactory;
  readonly #files: StateFiles;
  readonly #log: Logger;
  /** Whether a create is in flight or the node shuts down: slot checks wait for the next pass. */
  readonly #busy: () => boolean;
  /** Whether the node shuts down: no refill starts. */
  readonly #closing: () => boolean;
  /**
   * Guest clients of warm slots by instance id, connected when the slot was made and pinged by
   * {@link check} every {@link WARM_SLOT_CHECK_MS}, so a claim's first guest call reuses an open
   * connection; with when each last answered (ms since the epoch).
   */
  readonly #guests = new Map<string, { guest: GuestClient; checkedAt: number }>();
  #pool: WarmPool | null = null;
  /** Pending top-up ({@link refillSoon}) and when it was first asked for (ms since the epoch). */
  #refillTimer: NodeJS.Timeout | null = null;
  #refillAskedAt = 0;
  /** When a create last came or ended (ms since the epoch): refills wait for quiet after it. */
  #lastCreateAt = 0;

  constructor(o: {
    factory: InstanceFactory;
    files: StateFiles;
    log: Logger;
    busy: () => boolean;
    closing: () => boolean;
  }) {
    this.#factory = o.factory;
    this.#files = o.files;
    this.#log = o.log;
    this.#busy = o.busy;
    this.#closing = o.closing;
  }

  /** The pool (made after the node's sandboxes, since it boots through here). */
  get pool(): WarmPool | null {
    return this.#pool;
  }

  attach(pool: WarmPool): void {
    this.#pool = pool;
  }

  /**
   * Makes one warm slot of `template` (a refill at the start gate), with its guest connection open
   * and its state directory made (a slot without its directory is still claimed: its claim makes
   * one).
   */
  async boot(template: string, shape: InstanceShape): Promise<InstanceInfo> {
    const { inst } = await this.#factory.make(template, shape, 'refill');
    const guest = new GuestClient(inst.guest);
    await Promise.all([
      guest.health().catch(() => {}),
      this.#files
        .makeSlotDir(inst)
        .catch((err: unknown) => this.#log.warn({ err }, 'could not make a warm slot its state directory')),
    ]);
    this.#guests.set(inst.instanceId, { guest, checkedAt: Date.now() });
    return inst;
  }

  /** Claims a ready slot of `template` and `shape` from the pool, or null. */
  claim(template: string, shape: InstanceShape): InstanceInfo | null {
    return this.#pool?.claim(template, shape) ?? null;
  }

  /** The warm slot's guest client, now owned by the caller (undefined for other instances). */
  takeGuest(inst: InstanceInfo): GuestClient | undefined {
    const slot = this.#guests.get(inst.instanceId);
    this.#guests.delete(inst.instanceId);
    return slot?.guest;
  }

  /** Destroys an instance (a slot's or any other), frees its network and its slot's directory. Idempotent. */
  async discard(inst: InstanceInfo): Promise<void> {
    await this.takeGuest(inst)?.close();
    await this.#factory.destroy(inst);
    await rm(this.#files.slotDir(inst), { recursive: true, force: true });
  }

  /** Closes every slot's guest connection (the instances stay). */
  async closeGuests(): Promise<void> {
    const slots = [...this.#guests.values()];
    this.#guests.clear();
    await Promise.allSettled(slots.map((s) => s.guest.close()));
  }

  /**
   * Health-checks the ready warm slots whose guest last answered {@link WARM_SLOT_CHECK_MS} ago or
   * more (keeping their connections open for the claim), longest-unchecked first, one at a time,
   * stopping when a create comes in; replaces the slots whose guest does not answer: a claim no
   * longer asks the guest before it answers, so a dead slot must leave the pool here.
   * @returns the instance ids checked, in order (tests).
   */
  async check(now = Date.now()): Promise<string[]> {
    const due = [...this.#guests]
      .filter(([, slot]) => now - slot.checkedAt >= WARM_SLOT_CHECK_MS)
      .sort(([, a], [, b]) => a.checkedAt - b.checkedAt);
    const checked: string[] = [];
    for (const [instanceId, slot] of due) {
      if (this.#busy()) break; // a create goes first; the rest wait a pass
      if (!this.#guests.has(instanceId)) continue; // claimed meanwhile
      checked.push(instanceId);
      if (
        await slot.guest.health().then(
          () => true,
          () => false,
        )
      ) {
        slot.checkedAt = Date.now();
        continue;
      }
      const inst = this.#pool?.evict(instanceId);
      if (!inst) continue; // claimed meanwhile: the claim owns it now
      this.#log.warn({ [F.instanceId]: instanceId }, 'warm slot stopped answering; replacing it');
      await this.discard(inst).catch((err: unknown) =>
        this.#log.warn({ err, [F.instanceId]: instanceId }, 'discarding a dead warm slot failed'),
      );
      this.#pool?.refill();
    }
    return checked;
  }

  /** A create came or ended: a pending top-up waits for quiet again ({@link refillSoon}). */
  createSeen(): void {
    this.#lastCreateAt = Date.now();
    if (this.#refillTimer) this.refillSoon();
  }

  /** A create ended: the pool is topped up at the next quiet moment. */
  createEnded(): void {
    this.#lastCreateAt = Date.now();
    this.refillSoon();
  }

  /**
   * Tops the warm pool up once no create has come or ended for a quiet time, or a bound after the
   * first call that asked, whichever is first (each create pushes the quiet moment out, never past
   * that bound; {@link refillDelay}). With no create lately, at once. The pool's `schedule`.
   */
  refillSoon(): void {
    const pool = this.#pool;
    if (!pool) return;
    const now = Date.now();
    if (this.#refillTimer) clearTimeout(this.#refillTimer);
    else this.#refillAskedAt = now;
    this.#refillTimer = setTimeout(
      () => {
        this.#refillTimer = null;
        if (!this.#closing()) untraced(() => pool.refill());
      },
      refillDelay({ askedAtMs: this.#refillAskedAt, lastCreateMs: this.#lastCreateAt, nowMs: now }),
    );
    this.#refillTimer.unref();
  }
}
