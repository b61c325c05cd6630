import { describe, expect, it } from 'vitest';
import { type DensitySample, densityOutput, densitySummary } from './density.ts';
import { runInfo } from './report.ts';

const sample = (usageMiB: number, o: Partial<DensitySample> = {}): DensitySample => ({
  sandboxId: 'sbx_x',
  instanceId: 'i-x',
  driver: 'gvisor',
  source: 'cgroup v1',
  usageMiB,
  workingSetMiB: usageMiB - 1,
  processes: 5,
  ...o,
});
const floor = (usageMiB: number): DensitySample =>
  sample(usageMiB, { sandboxId: '-', driver: 'gvisor floor', processes: 2, floor: true });

const run = runInfo({ target: 'http://x', drivers: ['gvisor'], poolSize: 2, stackStartedByBench: false });
const params = { n: 3, settleSec: 0, reads: 1 };

describe('density figures beside the floor', () => {
  it('the floor is summarised on its own, never mixed into the sandboxes', () => {
    const summary = densitySummary([sample(30), sample(32), sample(34), floor(16), floor(18)]);
    expect(summary.map((s) => [s.driver, s.sandboxes, s.usageMiB.p50])).toEqual([
      ['gvisor', 3, 32],
      ['gvisor floor', 2, 16],
    ]);
  });

  it('each sandbox figure is given as a multiple of the floor’s (hand-worked)', async () => {
    // usage p50 32 over floor 16 → 2.0×; working set 31 over 15 → 2.1×; processes 5 over 2 → 2.5×
    const out = await densityOutput([sample(30), sample(32), sample(34), floor(16), floor(16)], params, run);
    const row = (driver: string, figure: string) =>
      out.markdown
        .split('\n')
        .find((l) => l.startsWith(`| ${driver} |`) && l.includes(figure))!
        .split('|')
        .map((c) => c.trim());
    expect(row('gvisor', 'host memory (usage)').at(-2)).toBe('2.0×');
    expect(row('gvisor', 'working set').at(-2)).toBe('2.1×');
    expect(row('gvisor', 'host processes').at(-2)).toBe('2.5×');
    expect(row('gvisor floor', 'host memory (usage)').at(-2)).toBe('1.0×');
    expect(out.markdown).toContain('3 idle sandboxes');
    expect(out.doc.assumptions.some((a) => a.startsWith('Floor'))).toBe(true);
  });

  it('without a floor the ratio is “-” and the assumptions say none was measured', async () => {
    const out = await densityOutput([sample(30)], params, run);
    const usage = out.markdown.split('\n').find((l) => l.includes('host memory (usage)'))!;
    expect(
      usage
        .split('|')
        .map((c) => c.trim())
        .at(-2),
    ).toBe('-');
    expect(out.doc.assumptions).toContain('No floor measured (--no-floor, or a driver without one).');
  });
});
