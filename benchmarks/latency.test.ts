import { describe, expect, it } from 'vitest';
import { type CreateSample, errorCounts, latencyRows, samplesOf, waitForPool } from './latency.ts';

function sample(p: Partial<CreateSample>): CreateSample {
  return {
    concurrency: 1,
    phase: 'warm',
    wave: 0,
    source: 'warm',
    acceptedMs: 1,
    readyMs: 10,
    firstOutputMs: 20,
    ...p,
  };
}

describe('latency classification', () => {
  // a warm-phase wave that outran the pool: two claims, then a boot and a snapshot restore;
  // the cold phase: boots, plus one create the API refused
  const all: CreateSample[] = [
    sample({ readyMs: 12 }),
    sample({ readyMs: 14 }),
    sample({ source: 'boot', readyMs: 900 }),
    sample({ source: 'snapshot', readyMs: 300 }),
    sample({ phase: 'cold', source: 'boot', readyMs: 800 }),
    sample({ phase: 'cold', source: 'boot', readyMs: 1000 }),
    sample({ phase: 'cold', source: null, readyMs: Number.NaN, error: 'POST /v1/sandboxes: 503 capacity' }),
    sample({ concurrency: 8, readyMs: 50 }),
  ];

  it('warm figures count only warm claims, whatever phase they ran in', () => {
    expect(samplesOf(all, 'warm', 1).map((s) => s.readyMs)).toEqual([12, 14]);
  });

  it('cold (boot) figures count only boots — the warm phase’s boot included, no claim, no failure', () => {
    expect(samplesOf(all, 'boot', 1).map((s) => s.readyMs)).toEqual([900, 800, 1000]);
    expect(samplesOf(all, 'snapshot', 1).map((s) => s.readyMs)).toEqual([300]);
  });

  it('rows are per concurrency and class, with the ratio to the floor on ready and first output', () => {
    const rows = latencyRows(all, 100);
    const warmReady = rows.find((r) => r.concurrency === 1 && r.source === 'warm' && r.metric === 'ready')!;
    expect(warmReady.summary).toMatchObject({ n: 2, p50: 12, max: 14 });
    expect(warmReady.p50OverFloor).toBeCloseTo(0.12);
    const bootReady = rows.find((r) => r.concurrency === 1 && r.source === 'boot' && r.metric === 'ready')!;
    expect(bootReady.summary).toMatchObject({ n: 3, p50: 900, max: 1000 });
    expect(rows.find((r) => r.metric === 'accepted')!.p50OverFloor).toBeNaN();
    expect(rows.filter((r) => r.concurrency === 8).map((r) => r.source)).toEqual(['warm', 'warm', 'warm']);
  });

  it('failures are counted per phase, never timed', () => {
    expect(errorCounts(all)).toEqual([
      { concurrency: 1, phase: 'cold', errors: 1, first: 'POST /v1/sandboxes: 503 capacity' },
    ]);
  });

  it('waitForPool returns at the wanted count, or when the pool stops growing', async () => {
    let n = 0;
    expect(await waitForPool(async () => ++n, 3, { pollMs: 1 })).toBe(3);
    expect(await waitForPool(async () => 2, 5, { stableMs: 20, pollMs: 5 })).toBe(2);
    // an empty pool is still filling, however long it stays empty: only the timeout ends the wait
    const t0 = Date.now();
    expect(await waitForPool(async () => 0, 5, { stableMs: 20, timeoutMs: 150, pollMs: 5 })).toBe(0);
    expect(Date.now() - t0).toBeGreaterThanOrEqual(150);
  });
});
