/**
 * The node's start gate: how many instances (cold boots and snapshot restores) start at once, and
 * who goes first. A start is hundreds of ms of CPU (network setup, a runsc or VMM start, the guest's
 * Node); on a small node, N of them at once each take N times as long, so starts beyond the limit
 * queue instead of thrashing.
 *
 * Two kinds of start share the gate:
 * - `create`: a create (or a resume from hibernation) that found no warm slot — a client waits on it;
 * - `refill`: the warm pool replacing slots — nobody waits on it.
 * A free place always goes to a waiting create first; refills take at most `refillLimit` places
 * and only while no create waits, so topping up the pool never delays a request, however large
 * the pool's target is.
 */
export type StartKind = 'create' | 'refill';

/** Figures of a {@link StartGate} (metrics, tests). */
export interface StartGateStats {
  /** Starts running, by kind. */
  running: Record<StartKind, number>;
  /** Starts waiting for a place, by kind. */
  waiting: Record<StartKind, number>;
}

export class StartGate {
  readonly limit: number;
  readonly refillLimit: number;
  readonly #running: Record<StartKind, number> = { create: 0, refill: 0 };
  readonly #waiting: Record<StartKind, (() => void)[]> = { create: [], refill: [] };

  /**
   * @param limit starts at once, of both kinds (≥ 1).
   * @param refillLimit refills at once (1 ≤ refillLimit ≤ limit).
   * @throws RangeError for limits outside those bounds.
   */
  constructor(limit: number, refillLimit = 1) {
    if (!Number.isInteger(limit) || limit < 1) throw new RangeError(`start limit must be ≥ 1, got ${limit}`);
    if (!Number.isInteger(refillLimit) || refillLimit < 1 || refillLimit > limit) {
      throw new RangeError(`refill limit must be within 1..${limit}, got ${refillLimit}`);
    }
    this.limit = limit;
    this.refillLimit = refillLimit;
  }

  /** Runs `fn` once the gate gives `kind` a place; the place is given back when `fn` settles. */
  async run<T>(kind: StartKind, fn: () => Promise<T>): Promise<T> {
    if (this.#mayStart(kind)) this.#running[kind] += 1;
    else await new Promise<void>((go) => this.#waiting[kind].push(go)); // #next counts its place
    try {
      return await fn();
    } finally {
      this.#running[kind] -= 1;
      this.#next();
    }
  }

  /** Current figures. */
  stats(): StartGateStats {
    return {
      running: { ...this.#running },
      waiting: { create: this.#waiting.create.length, refill: this.#waiting.refill.length },
    };
  }

  #total(): number {
    return this.#running.create + this.#running.refill;
  }

  /** Whether a new start of `kind` may begin now, ahead of nobody who should go first. */
  #mayStart(kind: StartKind): boolean {
    if (this.#total() >= this.limit) return false;
    if (kind === 'create') return this.#waiting.create.length === 0;
    return (
      this.#waiting.create.length === 0 &&
      this.#waiting.refill.length === 0 &&
      this.#running.refill < this.refillLimit
    );
  }

  /** Hands freed places out: waiting creates first, then refills within their own limit. */
  #next(): void {
    while (this.#total() < this.limit) {
      const create = this.#waiting.create.shift();
      if (create) {
        this.#running.create += 1;
        create();
        continue;
      }
      if (this.#running.refill >= this.refillLimit) return;
      const refill = this.#waiting.refill.shift();
      if (!refill) return;
      this.#running.refill += 1;
      refill();
    }
  }
}
