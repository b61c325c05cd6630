import { describe, expect, it } from 'vitest';
import { isSvg, validateDocument } from './output-checks.ts';
import { distributionSpec, markdownTable, renderSvg, runInfo } from './report.ts';

describe('report', () => {
  it('markdown tables have a header rule with right-aligned columns and escaped pipes', () => {
    expect(markdownTable(['a', 'b'], [['1', 'x|y']], [false, true])).toBe(
      '| a | b |\n| --- | ---: |\n| 1 | x\\|y |',
    );
  });

  it('renders a faceted distribution plot to well-formed SVG, offline', async () => {
    const svg = await renderSvg(
      distributionSpec(
        't',
        'ms',
        [1, 2, 3, 50].flatMap((v) => [
          { series: 'warm ready', value: v, panel: 'concurrency 1' },
          { series: 'floor', value: v * 2, panel: 'concurrency 8' },
        ]),
        true,
      ),
    );
    expect(isSvg(svg)).toBe(true);
    expect(isSvg('<svg><g></svg>')).toBe(false);
    expect(svg).toContain('warm ready');
  });

  it('run info names commit, CPU, cores, driver, pool and date, and fits the schema', () => {
    const run = runInfo({ target: 'http://x', drivers: ['gvisor'], poolSize: 2, stackStartedByBench: false });
    expect(run.cores).toBeGreaterThan(0);
    expect(run.cpuModel).not.toBe('');
    expect(Date.parse(run.date)).not.toBeNaN();
    const doc = {
      schema: 'space-bench/1',
      command: 'x',
      run,
      params: {},
      samples: [],
      summary: {},
      assumptions: [],
    };
    expect(validateDocument(doc)).toBe(true);
    expect(validateDocument({ ...doc, run: { ...run, cores: 'two' } })).toBe(false);
  });
});
