/**
 * Summary statistics every `space bench` command prints: percentiles by the nearest-rank method,
 * and the min / p50 / p90 / p99 / max summary of one figure. Pure.
 */

/**
 * The `p`-th percentile of `xs` by the **nearest-rank** method (no interpolation): sort ascending,
 * take the value at 1-based rank `ceil(p / 100 × n)` (rank 1 for p = 0). Every result is a value that
 * was measured, and at least p % of the samples are ≤ it.
 *
 * Examples with the ten samples 1..10: p50 = 5, p90 = 9 (not the max), p99 = 10, p100 = 10.
 * With fewer than 100 samples p99 is the max — which the table says by printing `n`.
 *
 * @param xs samples in any unit (ms, MiB, …); NaN values are ignored.
 * @param p percentile in [0, 100].
 * @returns the percentile in the unit of `xs`; NaN when `xs` holds no number.
 * @throws RangeError when `p` is outside [0, 100].
 */
export function percentile(xs: readonly number[], p: number): number {
  if (!(p >= 0 && p <= 100)) throw new RangeError(`percentile ${p} is outside [0, 100]`);
  const s = xs.filter((x) => !Number.isNaN(x)).sort((a, b) => a - b);
  if (!s.length) return Number.NaN;
  const rank = Math.max(1, Math.ceil((p / 100) * s.length));
  return s[rank - 1]!;
}

/** One figure's summary, in the unit of its samples. */
export interface Summary {
  /** Samples counted (NaN samples left out). */
  n: number;
  min: number;
  p50: number;
  p90: number;
  p99: number;
  max: number;
  mean: number;
}

/** Nearest-rank summary of `xs` (see {@link percentile}); every field NaN (and n 0) when empty. Pure. */
export function summarise(xs: readonly number[]): Summary {
  const s = xs.filter((x) => !Number.isNaN(x));
  return {
    n: s.length,
    min: percentile(s, 0),
    p50: percentile(s, 50),
    p90: percentile(s, 90),
    p99: percentile(s, 99),
    max: percentile(s, 100),
    mean: s.length ? s.reduce((a, b) => a + b, 0) / s.length : Number.NaN,
  };
}

/** `x` with `digits` decimals, or `-` for NaN (an empty figure). Pure. */
export function fmt(x: number, digits = 0): string {
  return Number.isFinite(x) ? x.toFixed(digits) : '-';
}
