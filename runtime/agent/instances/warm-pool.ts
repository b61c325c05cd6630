/**
 * Warm pool: per template, instances made ahead of demand (network, default-deny egress, an
 * answering guest), so a create becomes a claim. The count of ready slots is published in the
 * node's heartbeat, where the API's placement script prefers nodes that have one, and the memory
 * the slots hold (their measured footprint: they run nothing) is counted against the node's
 * capacity there. A placement that counted on a slot
 * another create took meanwhile simply makes an instance here (a snapshot restore when it can).
 *
 * Size: from the creates seen lately and the node's free memory (pool-sizing.ts), between
 * SPACE_WARM_POOL_SIZE and SPACE_WARM_POOL_MAX. Refills start once the creates that set them off
 * are done and no other came for a moment (the agent's refill pacing, `refillDelay` in
 * instances/warm-slots.ts), at most `parallel` at a time, and at the start gate they yield to every waiting
 * create (start-gate.ts), so topping up never competes with a request. While the pool is
 * {@link WarmPool.stocked stocked}, the next slot after one is made, and a {@link tick}'s top-up,
 * wait for that quiet moment too (`schedule`); a pool running low refills back to back. A periodic
 * {@link tick} re-sizes: it tops up, and discards slots beyond the target once demand has passed.
 */
import type { Logger } from 'pino';
import { F } from '../../core/log-fields.ts';
import type { InstanceInfo } from '../drivers/driver.ts';
import { DemandMeter, RecentDurations, warmTarget } from './pool-sizing.ts';

/** Shape every warm instance of a pool has. */
export interface WarmShape {
  vcpus: number;
  memoryMiB: number;
}

/** Options of a {@link WarmPool}. */
export interface WarmPoolOptions {
  templates: readonly string[];
  /** Slots always kept per template (SPACE_WARM_POOL_SIZE). */
  min: number;
  /** Most slots per template (SPACE_WARM_POOL_MAX, ≥ min). */
  max: number;
  shape: WarmShape;
  /** Refills in flight at once, all templates together (≥ 1). */
  parallel: number;
  /** Largest fraction of the node's memory demand may fill with slots (0–1). */
  share: number;
  /** The node's memory capacity, MiB. */
  capacityMiB: number;
  /** Memory the node's sandboxes reserve now, MiB (slots not included). */
  reservedMiB: () => number;
  /**
   * Host memory one instance holds now, bytes (the driver's `stats()`); sampled by {@link tick} on
   * a few ready slots. Without it (or before a sample) a slot counts at its shape's memory.
   */
  footprint?: (inst: InstanceInfo) => Promise<number>;
  /** Window over which creates are counted, ms (default 60 000). */
  demandWindowMs?: number;
  /**
   * Asks the owner for a top-up at a moment it picks (the agent: once no create came for a while).
   * Used instead of topping up at once while the pool is {@link WarmPool.stocked stocked}; without
   * it, top-ups always start at once.
   */
  schedule?: () => void;
  boot: (template: string) => Promise<InstanceInfo>;
  discard: (inst: InstanceInfo) => Promise<void>;
  log: Logger;
}

/**
 * A pool holding at least this fraction of its target ready is stocked (see
 * {@link WarmPool.stocked}); below it, refills run back to back.
 */
export const STOCKED_FRACTION = 0.5;

export class WarmPool {
  readonly #ready = new Map<string, InstanceInfo[]>();
  readonly #filling = new Map<string, number>();
  readonly #o: WarmPoolOptions;
  readonly #demand: DemandMeter;
  readonly #refillTimes = new RecentDurations(10, 1000);
  readonly templates: readonly string[];
  readonly shape: WarmShape;
  /** Largest footprint of the last sample of ready slots, MiB; null before one. */
  #footprintMiB: number | null = null;
  #stopped = false;
  #timer: NodeJS.Timeout | null = null;
  readonly #pending = new Set<Promise<void>>();

  /** @throws RangeError when max < min or parallel < 1. */
  constructor(o: WarmPoolOptions) {
    if (o.max < o.min) throw new RangeError(`warm pool max (${o.max}) is below its min (${o.min})`);
    if (o.parallel < 1) throw new RangeError(`warm pool refills in flight must be ≥ 1, got ${o.parallel}`);
    this.#o = o;
    this.templates = o.templates;
    this.shape = o.shape;
    this.#demand = new DemandMeter(o.demandWindowMs ?? 60_000);
  }

  /** Ready slots per template (published in heartbeats). */
  counts(): Record<string, number> {
    return Object.fromEntries(this.templates.map((t) => [t, this.#ready.get(t)?.length ?? 0]));
  }

  /** Slots each template's pool aims to hold now (metrics, heartbeats). */
  targets(now = Date.now()): Record<string, number> {
    return Object.fromEntries(this.templates.map((t) => [t, this.target(t, now)]));
  }

  /**
   * What the pool's slots (ready and being made) hold of the node's memory, MiB: each at the
   * largest footprint last measured (they run nothing, so they use no CPU and cannot grow until
   * claimed; the claim's own reservation covers them from then on), or at the pool's shape before
   * a measurement.
   */
  held(): { slots: number; memoryMiB: number; footprintMiB: number } {
    let slots = 0;
    for (const t of this.templates) slots += (this.#ready.get(t)?.length ?? 0) + (this.#filling.get(t) ?? 0);
    const footprintMiB = this.#footprintMiB ?? this.shape.memoryMiB;
    return { slots, memoryMiB: slots * footprintMiB, footprintMiB };
  }

  /** Instance ids held by the pool (not bound to a sandbox). */
  instanceIds(): string[] {
    return [...this.#ready.values()].flat().map((i) => i.instanceId);
  }

  /** Slots `template`'s pool aims to hold now (pool-sizing.ts). */
  target(template: string, now = Date.now()): number {
    return warmTarget({
      min: this.#o.min,
      max: this.#o.max,
      peakPerSecond: this.#demand.peakPerSecond(template, now),
      refillMs: this.#refillTimes.median(),
      capacityMiB: this.#o.capacityMiB,
      reservedMiB: this.#o.reservedMiB(),
      slotMiB: this.shape.memoryMiB,
      share: this.#o.share,
    });
  }

  /**
   * Takes a ready instance of `template` with `shape`, or null. A create of the pool's shape counts
   * as demand whether or not a slot was there. Does not refill: the caller calls {@link refill}
   * once its claim is done, so the instance that replaces the slot never competes with the claim.
   */
  claim(template: string, shape: WarmShape): InstanceInfo | null {
    if (shape.vcpus !== this.shape.vcpus || shape.memoryMiB !== this.shape.memoryMiB) return null;
    if (!this.templates.includes(template)) return null;
    this.#demand.record(template);
    return this.#ready.get(template)?.shift() ?? null;
  }

  /**
   * Takes ready instance `instanceId` out of the pool (a slot found dead), or null when the pool
   * does not hold it (claimed meanwhile). The caller discards it and may {@link refill}.
   */
  evict(instanceId: string): InstanceInfo | null {
    for (const list of this.#ready.values()) {
      const i = list.findIndex((inst) => inst.instanceId === instanceId);
      if (i >= 0) return list.splice(i, 1)[0]!;
    }
    return null;
  }

  /**
   * Whether every template's pool holds at least half its target ready ({@link STOCKED_FRACTION}):
   * the creates of a burst still find slots, so a top-up can wait for the burst to end.
   */
  stocked(now = Date.now()): boolean {
    return this.templates.every(
      (t) => (this.#ready.get(t)?.length ?? 0) >= Math.ceil(this.target(t, now) * STOCKED_FRACTION),
    );
  }

  /** Tops up now, or through the owner's `schedule` while the pool is {@link stocked}. */
  #topUp(): void {
    if (this.#o.schedule && this.stocked()) this.#o.schedule();
    else this.refill();
  }

  /** Starts making instances until every template has its target ready or being made. */
  refill(): void {
    if (this.#stopped) return;
    const now = Date.now();
    for (const t of this.templates) {
      const target = this.target(t, now);
      while (this.#inFlight() < this.#o.parallel) {
        const have = (this.#ready.get(t)?.length ?? 0) + (this.#filling.get(t) ?? 0);
        if (have >= target) break;
        this.#startOne(t);
      }
    }
  }

  /**
   * Tops every pool up, discards ready slots beyond the target (demand has passed) and measures the
   * footprint of up to 4 ready slots.
   */
  async tick(): Promise<void> {
    if (this.#stopped) return;
    this.#topUp();
    await this.#measure();
    const now = Date.now();
    const extra: InstanceInfo[] = [];
    for (const t of this.templates) {
      const list = this.#ready.get(t) ?? [];
      const over = list.length + (this.#filling.get(t) ?? 0) - this.target(t, now);
      if (over > 0) extra.push(...list.splice(0, Math.min(over, list.length)));
    }
    if (extra.length) {
      this.#o.log.info({ count: extra.length }, 'warm pool shrinks: demand has passed');
      await Promise.allSettled(extra.map((i) => this.#o.discard(i)));
    }
  }

  async #measure(): Promise<void> {
    const footprint = this.#o.footprint;
    if (!footprint) return;
    const sample = [...this.#ready.values()].flat().slice(0, 4);
    const bytes = await Promise.all(sample.map((i) => footprint(i).catch(() => null)));
    const seen = bytes.filter((b): b is number => b !== null && b > 0);
    if (seen.length) this.#footprintMiB = Math.ceil(Math.max(...seen) / 1_048_576);
  }

  /** Runs {@link tick} every `periodMs` until {@link drain}. */
  start(periodMs: number): void {
    if (this.#timer || this.#stopped) return;
    this.#timer = setInterval(() => {
      this.tick().catch((err: unknown) => this.#o.log.error({ err }, 'warm pool tick failed'));
    }, periodMs);
    this.#timer.unref();
  }

  #inFlight(): number {
    let n = 0;
    for (const v of this.#filling.values()) n += v;
    return n;
  }

  #startOne(t: string): void {
    this.#filling.set(t, (this.#filling.get(t) ?? 0) + 1);
    const t0 = performance.now();
    let made = false;
    const p = this.#o
      .boot(t)
      .then(async (inst) => {
        this.#refillTimes.record(performance.now() - t0);
        if (this.#stopped) return this.#o.discard(inst);
        const list = this.#ready.get(t) ?? [];
        list.push(inst);
        this.#ready.set(t, list);
        made = true;
        this.#o.log.debug({ [F.templateId]: t, [F.instanceId]: inst.instanceId }, 'warm slot ready');
      })
      .catch((err: unknown) => {
        this.#o.log.error({ err, [F.templateId]: t }, 'warm slot boot failed');
      })
      .finally(() => {
        this.#filling.set(t, (this.#filling.get(t) ?? 1) - 1);
        this.#pending.delete(p);
        // keep going while a target is not met (bounded by `parallel`; paced by `schedule` while
        // stocked); a failing boot waits for the next tick instead of retrying in a loop
        if (made) this.#topUp();
      });
    this.#pending.add(p);
  }

  /** Resolves once no boot is in flight (tests, shutdown). */
  async settle(): Promise<void> {
    while (this.#pending.size > 0) await Promise.allSettled([...this.#pending]);
  }

  /** Stops refilling and destroys every ready instance. */
  async drain(): Promise<void> {
    this.#stopped = true;
    if (this.#timer) clearInterval(this.#timer);
    this.#timer = null;
    await this.settle();
    const all = [...this.#ready.values()].flat();
    this.#ready.clear();
    await Promise.allSettled(all.map((i) => this.#o.discard(i)));
  }
}
