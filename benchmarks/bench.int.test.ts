/**
 * `space bench` end to end on a tiny N: one real local stack (`space up` as a process, warm pool 1),
 * then every command as its own `space bench … --save` process against it. Each must print a
 * Markdown table, write a JSON document that fits the schema (with what it ran on) and an SVG that
 * parses. Benchmarks are not timed tests: no figure is asserted beyond being measured.
 */
import { execFile } from 'node:child_process';
import { mkdtemp, readdir, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { SPACE, type SpaceUp, startSpaceUp } from '../test/space-up.ts';
import type { CreateSample } from './latency.ts';
import { isSvg, validateDocument } from './output-checks.ts';
import type { BenchDocument } from './report.ts';

const run = promisify(execFile);

describe('space bench on a tiny N against a real local stack', () => {
  let home: string;
  let results: string;
  let up: SpaceUp;
  let env: NodeJS.ProcessEnv;

  beforeAll(async () => {
    home = await mkdtemp(join(tmpdir(), 'space-bench-'));
    results = join(home, 'results');
    const pool = `10.${100 + Math.floor(Math.random() * 100)}.0.0/16`;
    env = { ...process.env, SPACE_HOME: home, SPACE_NETWORK_POOL: pool };
    up = await startSpaceUp(env, inject('redisUrl'), ['--warm', '1']);
  });

  afterAll(async () => {
    await up?.stop(); // the agent destroys its sandboxes
    await rm(home, { recursive: true, force: true });
  });

  /** Runs `space bench <args> --save`; returns its stdout and the JSON document and SVG it saved. */
  async function bench(
    command: string,
    args: string[],
  ): Promise<{ stdout: string; doc: BenchDocument; svg: string }> {
    const dir = join(results, command);
    const { stdout } = await run(
      process.execPath,
      [SPACE, 'bench', command, ...args, '--save', '--results-dir', dir],
      { env, maxBuffer: 16 * 1024 * 1024 },
    );
    const [folder] = await readdir(dir);
    expect(folder).toMatch(new RegExp(`^${command}-\\d{4}-\\d{2}-\\d{2}T`));
    const doc = JSON.parse(await readFile(join(dir, folder!, 'result.json'), 'utf8')) as BenchDocument;
    const svg = await readFile(join(dir, folder!, 'plot.svg'), 'utf8');
    // well-formed output: a Markdown table on stdout (and the same in table.md), schema, SVG
    expect(stdout).toMatch(/^\| .+ \|\n\|( -+:? \|)+\n\| /m);
    expect(await readFile(join(dir, folder!, 'table.md'), 'utf8')).toBe(stdout);
    expect(validateDocument(doc), JSON.stringify(validateDocument.errors)).toBe(true);
    expect(doc.command).toBe(command);
    if (command !== 'cost')
      expect(doc.run).toMatchObject({ drivers: ['gvisor'], stackStartedByBench: false });
    expect(doc.run.commit).toMatch(/^[0-9a-f]{40}$/);
    expect(isSvg(svg)).toBe(true);
    return { stdout, doc, svg };
  }

  it('latency: every create classified, the floor measured in the same run', async () => {
    const { doc, stdout } = await bench('latency', ['--n', '2', '--concurrency', '1,2', '--floor-runs', '1']);
    const { creates, floor } = doc.samples as { creates: CreateSample[]; floor: { samples?: number[] } };
    expect(creates).toHaveLength(2 * 2 * 2); // N × concurrencies × phases
    for (const s of creates.filter((c) => c.error === undefined)) {
      expect(['warm', 'snapshot', 'boot']).toContain(s.source);
      expect(s.acceptedMs).toBeNull(); // NaN in JSON: one POST ?waitMs= per create, no separate answer
      expect(s.readyMs).toBeGreaterThan(0);
      expect(s.firstOutputMs).toBeGreaterThan(0); // from the command's own POST
    }
    expect(doc.params).toMatchObject({ overlap: false, createMode: 'wait' });
    expect(floor.samples).toHaveLength(1);
    expect(stdout).toMatch(/\| - \| floor \| gvisor \| 1 \|/);
  });

  it('exec: round trips, a stream of exactly the bytes asked for, the bare runsc exec floor in the same run', async () => {
    const { doc, stdout } = await bench('exec', ['--n', '2', '--streams', '1', '--stream-mib', '1']);
    const s = doc.samples as {
      roundTripMs: number[];
      stream: { bytes: number; ms: number }[];
      floorMs: number[];
    };
    expect(s.roundTripMs).toHaveLength(2);
    expect(s.stream).toEqual([{ bytes: 1_048_576, ms: expect.any(Number) }]);
    expect(s.floorMs).toHaveLength(2);
    for (const ms of s.floorMs) expect(ms).toBeGreaterThan(0);
    expect(stdout).toMatch(/\| floor-runsc-exec-2x \| ms \| 2 \|/);
    expect(stdout).toMatch(/Round trip p50 ÷ floor p50: \d+\.\d×/);
  });

  it('pause-resume: every figure sampled', async () => {
    const { doc } = await bench('pause-resume', ['--n', '1', '--no-floor']);
    expect(Object.keys(doc.samples as object).sort()).toEqual(
      [
        'op-noop',
        'pause-frozen',
        'pause-hibernated',
        'resume-frozen',
        'resume-hibernated',
        'traffic-frozen',
        'traffic-hibernated',
        'traffic-running',
      ].sort(),
    );
  });

  it('density: host memory and processes read from the sandbox’s cgroup, beside a bare floor container’s', async () => {
    const { doc, stdout } = await bench('density', ['--n', '1', '--settle', '0', '--reads', '1']);
    type Sample = { source: string; usageMiB: number; processes: number; driver: string; floor?: boolean };
    const samples = doc.samples as Sample[];
    const s = samples.find((x) => !x.floor);
    const f = samples.find((x) => x.floor);
    expect(s!.source).toMatch(/^cgroup v[12]$/);
    expect(s!.usageMiB).toBeGreaterThan(0);
    expect(s!.processes).toBeGreaterThan(0);
    // the floor: same driver, same cgroup reading, no guest daemon (so less memory than the sandbox)
    expect(f).toMatchObject({ driver: `${s!.driver} floor`, source: s!.source });
    expect(f!.usageMiB).toBeGreaterThan(0);
    expect(f!.usageMiB).toBeLessThan(s!.usageMiB);
    expect(stdout).toMatch(/p50 ÷ floor/);
    // nothing of the floor is left: its cgroups (one per container) and processes are gone
    for (const dir of ['/sys/fs/cgroup/memory/space', '/sys/fs/cgroup/space'])
      expect(
        (await readdir(dir).catch(() => [] as string[])).filter((d) => d.startsWith('floor-idle-')),
      ).toEqual([]);
    const { stdout: ps } = await promisify(execFile)('ps', ['-eo', 'args']);
    expect(ps).not.toContain('floor-idle-');
  });

  it('throughput: creates counted over the window', async () => {
    const { doc } = await bench('throughput', ['--concurrency', '2', '--duration', '3']);
    const summary = doc.summary as { createsPerSecond: number; perSecond: number[] };
    expect(summary.perSecond).toHaveLength(3);
    expect(summary.createsPerSecond).toBeGreaterThan(0);
  });

  it('cost: every option priced with its assumptions printed', async () => {
    const { doc, stdout } = await bench('cost', ['--density', '60']);
    expect(stdout).toContain('SPACE self-hosted');
    expect(stdout).toContain('Assumptions:');
    expect(doc.assumptions.some((a) => a.includes('https://api.linode.com/v4/linode/types'))).toBe(true);
  });
});
