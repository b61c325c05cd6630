import { describe, expect, it } from 'vitest';
import { execOutput, floorRatio } from './exec.ts';
import { validateDocument } from './output-checks.ts';
import { runInfo } from './report.ts';

const run = runInfo({ target: 'http://x', drivers: ['gvisor'], poolSize: 2, stackStartedByBench: false });
const params = { n: 3, streams: 1, streamMiB: 1 };
// worked by hand: round-trip p50 of [12, 30, 18] is 18; floor p50 (nearest rank) of [90, 60, 120, 100] is 90
const samples = { roundTripMs: [12, 30, 18], stream: [{ bytes: 1_048_576, ms: 500 }] };

describe('exec output', () => {
  it('puts the bare runsc exec floor beside the round trip, with the ratio of their medians', async () => {
    const s = { ...samples, floorMs: [90, 60, 120, 100] };
    expect(floorRatio(s)).toBeCloseTo(0.2, 10);
    const { doc, markdown } = await execOutput(s, { ...params, floor: true }, run);
    expect(validateDocument(doc), JSON.stringify(validateDocument.errors)).toBe(true);
    expect(markdown).toContain('| floor-runsc-exec-4x | ms | 4 | 90.0 |');
    expect(markdown).toContain('Round trip p50 ÷ floor p50: 0.2×.');
    expect((doc.summary as { roundTripOverFloor: number }).roundTripOverFloor).toBeCloseTo(0.2, 10);
  });

  it('without a floor says so and prints no ratio', async () => {
    expect(floorRatio(samples)).toBeNull();
    const { doc, markdown } = await execOutput(samples, { ...params, floor: false }, run);
    expect(markdown).not.toContain('floor-runsc-exec');
    expect(markdown).not.toContain('÷ floor');
    expect(doc.assumptions.some((a) => a.startsWith('Driver floor not measured'))).toBe(true);
  });
});
