/**
 * How many warm slots a template's pool should hold: from the creates it has seen lately and from
 * the node's free memory. Pure functions and a small meter; the pool ({@link WarmPool}) applies them.
 *
 * The rule, per template (the pool has one shape; only creates of that shape count):
 * - demand = the busiest second of creates within the last `windowMs` (default 60 s), times the
 *   seconds one refill takes (at least 1): the slots that busiest second would use up before the
 *   pool could replace them;
 * - the demand part may hold at most `share` of the node's memory (default half), counted at the
 *   slot's shape — the same reservation a claimed slot then holds against the node's capacity;
 * - the pool never holds less than `min` (SPACE_WARM_POOL_SIZE) nor more than `max`
 *   (SPACE_WARM_POOL_MAX), and never more slots than the node's unreserved memory fits.
 * A burst larger than the pool is served by snapshot restores queued at the start gate
 * (start-gate.ts); the pool grows for the next one and shrinks back once the window has passed.
 */

/** Inputs of {@link warmTarget}. */
export interface WarmTargetInputs {
  /** Slots always kept (SPACE_WARM_POOL_SIZE). */
  min: number;
  /** Most slots kept (SPACE_WARM_POOL_MAX). */
  max: number;
  /** Creates in the busiest second of the window (see {@link DemandMeter.peakPerSecond}). */
  peakPerSecond: number;
  /** How long one refill takes (median of recent ones), ms. */
  refillMs: number;
  /** The node's memory capacity, MiB (SPACE_NODE_MEMORY_MIB). */
  capacityMiB: number;
  /** Memory reserved by the node's sandboxes (not counting warm slots), MiB. */
  reservedMiB: number;
  /** Memory of one slot (the pool's shape), MiB. */
  slotMiB: number;
  /** Largest fraction of `capacityMiB` demand may fill with slots (0–1). */
  share: number;
}

/** The number of slots a pool should hold. Pure; see the module comment for the rule. */
export function warmTarget(o: WarmTargetInputs): number {
  const fits = Math.floor(Math.max(0, o.capacityMiB - o.reservedMiB) / o.slotMiB);
  const byShare = Math.floor((o.capacityMiB * o.share) / o.slotMiB);
  const demand = Math.ceil(o.peakPerSecond * Math.max(1, o.refillMs / 1000));
  const want = Math.min(o.max, Math.max(o.min, Math.min(demand, byShare)));
  return Math.max(0, Math.min(want, fits));
}

/**
 * Creates seen per template within a sliding window (timestamps, ms). Bounded: at most `cap`
 * timestamps per template are kept (the newest), so a flood cannot grow it without limit.
 */
export class DemandMeter {
  readonly windowMs: number;
  readonly #cap: number;
  readonly #seen = new Map<string, number[]>();

  constructor(windowMs = 60_000, cap = 10_000) {
    this.windowMs = windowMs;
    this.#cap = cap;
  }

  /** Counts one create of `template` at `atMs`. */
  record(template: string, atMs = Date.now()): void {
    const list = this.#seen.get(template) ?? [];
    list.push(atMs);
    if (list.length > this.#cap) list.splice(0, list.length - this.#cap);
    this.#seen.set(template, list);
  }

  /** Most creates of `template` within any 1-second span of the window ending at `nowMs`. */
  peakPerSecond(template: string, nowMs = Date.now()): number {
    const list = this.#prune(template, nowMs);
    let peak = 0;
    for (let lo = 0, hi = 0; hi < list.length; hi++) {
      while (list[hi]! - list[lo]! >= 1000) lo++;
      peak = Math.max(peak, hi - lo + 1);
    }
    return peak;
  }

  #prune(template: string, nowMs: number): number[] {
    const list = (this.#seen.get(template) ?? [])
      .filter((t) => t > nowMs - this.windowMs)
      .sort((a, b) => a - b);
    if (list.length) this.#seen.set(template, list);
    else this.#seen.delete(template);
    return list;
  }
}

/** Median of the last `n` durations recorded (ms), or `fallback` before any. */
export class RecentDurations {
  readonly #n: number;
  readonly #fallback: number;
  readonly #values: number[] = [];

  constructor(n = 10, fallbackMs = 1000) {
    this.#n = n;
    this.#fallback = fallbackMs;
  }

  record(ms: number): void {
    this.#values.push(ms);
    if (this.#values.length > this.#n) this.#values.shift();
  }

  median(): number {
    if (!this.#values.length) return this.#fallback;
    const s = [...this.#values].sort((a, b) => a - b);
    const m = s.length >> 1;
    return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
  }
}
