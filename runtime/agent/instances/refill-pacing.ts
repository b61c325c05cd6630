/** When the warm pool is topped up after creates: the agent waits for a quiet moment (see below). */

/**
 * The warm pool is topped up once no create has come or ended for this long (ms). A refill's first
 * steps (the network's `ip`/`nft` commands, the driver's `runsc restore`) take CPU the creates of a
 * burst need, and a slot it makes is ready only seconds later, too late for that burst (whose
 * creates that find no slot restore or boot at the start gate, ahead of refills). Longer than the
 * gaps between the creates of a burst the API delivers slowly: the first 32-way burst after a
 * start reached this agent with gaps up to ~190 ms (the API's code not yet optimised), and a refill
 * that began in such a gap (at 50 ms of quiet) held the rest of the burst up by ~1 s, its network
 * setup alone taking 4.1–4.4 s under that load (2-core VM, 2026-12-04, `npm run bench -- latency
 * --phases warm --concurrency 32 --n 96 --trace-file …`).
 */
export const REFILL_QUIET_MS = 400;
/**
 * A refill waits for quiet at most this long after it was first asked for (ms), so a steady stream
 * of creates still gets its pool topped up. Longer than a 32-way burst on a 2-core node takes
 * (~2.3 s for the first after a start, above).
 */
export const REFILL_MAX_DELAY_MS = 3000;

/**
 * How long a refill asked for at `askedAtMs` waits from `nowMs` (ms): until no create has come or
 * ended for {@link REFILL_QUIET_MS} (the last did at `lastCreateMs`), and at most until
 * {@link REFILL_MAX_DELAY_MS} after `askedAtMs`. Pure.
 */
export function refillDelay(t: { askedAtMs: number; lastCreateMs: number; nowMs: number }): number {
  return Math.max(0, Math.min(t.lastCreateMs + REFILL_QUIET_MS, t.askedAtMs + REFILL_MAX_DELAY_MS) - t.nowMs);
}
