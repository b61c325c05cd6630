import { describe, expect, it } from 'vitest';
import { DemandMeter, RecentDurations, warmTarget } from './pool-sizing.ts';

const base = {
  min: 2,
  max: 32,
  peakPerSecond: 0,
  refillMs: 400,
  capacityMiB: 19_660,
  reservedMiB: 0,
  slotMiB: 512,
  share: 0.5,
};

describe('warm pool sizing', () => {
  it('keeps the minimum with no demand', () => {
    expect(warmTarget(base)).toBe(2);
  });

  it('holds the busiest second of creates, times the seconds a refill takes (at least one)', () => {
    // 10 creates in one second, refills of 0.4 s: the 10 that second took
    expect(warmTarget({ ...base, peakPerSecond: 10 })).toBe(10);
    // 10 a second with refills of 2.5 s: 25 are gone before replacements are ready (the whole
    // node's memory may go to the pool here; at half of it, 19 slots of 512 MiB fit)
    expect(warmTarget({ ...base, peakPerSecond: 10, refillMs: 2500, share: 1 })).toBe(25);
    expect(warmTarget({ ...base, peakPerSecond: 10, refillMs: 2500 })).toBe(19);
  });

  it('caps demand at max and at its share of memory, but never below the minimum', () => {
    expect(warmTarget({ ...base, peakPerSecond: 100 })).toBe(19); // floor(19660 × 0.5 / 512)
    expect(warmTarget({ ...base, peakPerSecond: 100, share: 1, max: 20 })).toBe(20);
    expect(warmTarget({ ...base, peakPerSecond: 100, share: 0, min: 3 })).toBe(3);
  });

  it('never holds more slots than the unreserved memory fits, minimum included', () => {
    // 19660 − 18600 = 1060 MiB free: two slots of 512
    expect(warmTarget({ ...base, peakPerSecond: 10, reservedMiB: 18_600 })).toBe(2);
    expect(warmTarget({ ...base, min: 4, reservedMiB: 19_000 })).toBe(1);
    expect(warmTarget({ ...base, reservedMiB: 25_000 })).toBe(0);
  });
});

describe('demand meter', () => {
  it('finds the busiest 1-second span within the window, not per calendar second', () => {
    const m = new DemandMeter(60_000);
    // 3 creates straddling a second boundary (0.9, 1.1, 1.5 s) and 2 later
    for (const t of [900, 1100, 1500, 5000, 9000]) m.record('base', t);
    expect(m.peakPerSecond('base', 10_000)).toBe(3);
    expect(m.peakPerSecond('other', 10_000)).toBe(0);
  });

  it('forgets creates older than the window', () => {
    const m = new DemandMeter(60_000);
    for (let i = 0; i < 8; i++) m.record('base', 1000 + i);
    m.record('base', 50_000);
    expect(m.peakPerSecond('base', 55_000)).toBe(8);
    expect(m.peakPerSecond('base', 61_500)).toBe(1);
    expect(m.peakPerSecond('base', 200_000)).toBe(0);
  });

  it('keeps at most `cap` timestamps per template', () => {
    const m = new DemandMeter(60_000, 5);
    for (let i = 0; i < 50; i++) m.record('base', 1000 + i);
    expect(m.peakPerSecond('base', 2000)).toBe(5);
  });
});

describe('recent durations', () => {
  it('is the median of the last n, or the fallback before any', () => {
    const d = new RecentDurations(3, 1000);
    expect(d.median()).toBe(1000);
    for (const ms of [100, 900, 200, 300]) d.record(ms); // 100 drops out
    expect(d.median()).toBe(300);
    d.record(500);
    expect(d.median()).toBe(300); // 200, 300, 500
  });
});
