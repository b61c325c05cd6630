/**
 * Warm pool: per template, instances made ahead of demand (network, default-deny egress, an
 * answering guest), so a create becomes a claim. The count of ready slots is published in the
 * node's heartbeat, where the API's placement script prefers nodes that have one, and the memory
 * the slots hold is counted against the node's capacity there. A placement that counted on a slot
 * another create took meanwhile simply makes an instance here (a snapshot restore when it can).
 *
 * Size: from the creates seen lately and the node's free memory (pool-sizing.ts), between
 * SPACE_WARM_POOL_SIZE and SPACE_WARM_POOL_MAX. Refills start after the claim that set them off,
 * at most `parallel` at a time, and at the start gate they yield to every waiting create
 * (start-gate.ts), so topping up never competes with a request. A periodic {@link tick} re-sizes:
 * it tops up, and discards slots beyond the target once demand has passed.
 */
import type { Logger } from 'pino';
import { F } from '../core/log-fields.ts';
import type { InstanceInfo } from './drivers/driver.ts';
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
  /** Window over which creates are counted, ms (default 60 000). */
  demandWindowMs?: number;
  boot: (template: string) => Promise<InstanceInfo>;
  discard: (inst: InstanceInfo) => Promise<void>;
  log: Logger;
}

export class WarmPool {
  readonly #ready = new Map<string, InstanceInfo[]>();
  readonly #filling = new Map<string, number>();
  readonly #o: WarmPoolOptions;
  readonly #demand: DemandMeter;
  readonly #refillTimes = new RecentDurations(10, 1000);
  readonly templates: readonly string[];
  readonly shape: WarmShape;
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
   * What the pool's slots (ready and being made) hold of the node: milli-vCPUs and MiB at the
   * pool's shape, the reservation each becomes when claimed.
   */
  held(): { vcpusMilli: number; memoryMiB: number; slots: number } {
    let slots = 0;
    for (const t of this.templates) slots += (this.#ready.get(t)?.length ?? 0) + (this.#filling.get(t) ?? 0);
    return {
      slots,
      vcpusMilli: Math.round(slots * this.shape.vcpus * 1000),
      memoryMiB: slots * this.shape.memoryMiB,
    };
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

  /** Tops every pool up and discards ready slots beyond the target (demand has passed). */
  async tick(): Promise<void> {
    if (this.#stopped) return;
    this.refill();
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
        // keep going while a target is not met (bounded by `parallel`); a failing boot waits
        // for the next tick instead of retrying in a loop
        if (made) this.refill();
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
