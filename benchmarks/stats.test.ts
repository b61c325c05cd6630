import { describe, expect, it } from 'vitest';
import { percentile, summarise } from './stats.ts';

describe('percentile (nearest rank)', () => {
  const ten = [10, 1, 9, 2, 8, 3, 7, 4, 6, 5]; // 1..10, unsorted on purpose

  it('p90 of 10 samples is the 9th value, not the max', () => {
    // rank = ceil(0.90 × 10) = 9 → the 9th smallest = 9
    expect(percentile(ten, 90)).toBe(9);
    expect(percentile(ten, 90)).not.toBe(Math.max(...ten));
  });

  it('p50, p99, p0 and p100 of 1..10', () => {
    // p50: ceil(5) = rank 5 → 5; p99: ceil(9.9) = rank 10 → 10; p0 → rank 1; p100 → rank 10
    expect([percentile(ten, 50), percentile(ten, 99), percentile(ten, 0), percentile(ten, 100)]).toEqual([
      5, 10, 1, 10,
    ]);
  });

  it('p99 of 200 samples is not the max', () => {
    const xs = Array.from({ length: 200 }, (_, i) => i + 1);
    // rank = ceil(0.99 × 200) = 198
    expect(percentile(xs, 99)).toBe(198);
  });

  it('returns a measured value, never an interpolation', () => {
    // 4 samples: p90 rank = ceil(3.6) = 4 → 40; linear interpolation would give 37
    expect(percentile([10, 20, 30, 40], 90)).toBe(40);
    expect(percentile([10, 20, 30, 40], 50)).toBe(20); // rank ceil(2) = 2
  });

  it('ignores NaN and is NaN when empty; rejects p outside [0, 100]', () => {
    expect(percentile([Number.NaN, 3, 1], 50)).toBe(1);
    expect(percentile([], 50)).toBeNaN();
    expect(() => percentile([1], 101)).toThrow(RangeError);
    expect(() => percentile([1], -1)).toThrow(RangeError);
  });

  it('summarise gives n, min, p50, p90, p99, max and mean', () => {
    expect(summarise([4, 1, 3, 2])).toEqual({ n: 4, min: 1, p50: 2, p90: 4, p99: 4, max: 4, mean: 2.5 });
    expect(summarise([]).n).toBe(0);
  });
});
