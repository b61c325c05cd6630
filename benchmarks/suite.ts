/**
 * The benchmark suite behind `space bench <command>`: one function per command taking the run's
 * context (target, progress bars, notes) and its options, returning the table, JSON document and
 * plot ({@link BenchOutput}). runtime/cli/bench.ts parses the options and prints; this module
 * measures. See each command's module for what it measures and how.
 */
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { agentSettings } from '../runtime/agent/config.ts';
import { apiSettings } from '../runtime/api/config.ts';
import type { DensityFloor } from './density.ts';
import { type ProgressFactory, progressFactory } from './progress.ts';
import {
  type BenchOutput,
  DEFAULT_RESULTS_DIR,
  gitCommit,
  type RunInfo,
  runInfo,
  saveOutput,
  savePlot,
} from './report.ts';
import { type BenchTarget, openTarget } from './stack.ts';

/** What a command gets to measure with. */
export interface BenchContext {
  /** The stack (null for a command that needs none, e.g. `cost --density`). */
  target: BenchTarget | null;
  progress: ProgressFactory;
  /** A line on stderr (not in --json output). */
  note: (line: string) => void;
  /** Template cache of the local agent (`SPACE_CACHE_DIR`). */
  cacheDir: string;
  /** What the run measured on, with the drivers the command saw (default: the target's). */
  runInfo: (drivers?: string[]) => Promise<RunInfo>;
}

/** How to set up a {@link BenchContext}. */
export interface ContextOptions {
  json: boolean;
  target?: string;
  apiKey?: string;
  /** Warm pool of a stack the benchmark starts; undefined: SPACE_WARM_POOL_SIZE, else the agent's default. */
  pool: number | undefined;
  needsStack: boolean;
  cacheDir: string;
  note: (line: string) => void;
  /** Where a stack the benchmark starts writes its spans, kept after the run (default: a temporary file, removed). */
  traceFile?: string;
}

/** Opens the target (when needed), runs `measure`, and closes a stack the benchmark started. */
export async function runWithContext(
  o: ContextOptions,
  measure: (ctx: BenchContext) => Promise<BenchOutput>,
): Promise<BenchOutput> {
  const date = new Date();
  const git = gitCommit();
  const target = o.needsStack
    ? await openTarget({
        target: o.target,
        apiKey: o.apiKey,
        pool: o.pool ?? agentPoolSize(),
        log: (l) => o.note(`space bench: ${l}`),
        ...(o.traceFile ? { traceFile: o.traceFile } : {}),
      })
    : null;
  try {
    return await measure({
      target,
      progress: progressFactory(o.json),
      note: (l) => o.note(`space bench: ${l}`),
      cacheDir: o.cacheDir,
      runInfo: async (drivers) =>
        runInfo({
          git,
          date,
          target: target?.apiUrl ?? null,
          drivers:
            drivers ??
            (target ? [...new Set((await target.nodes()).filter((n) => n.alive).map((n) => n.driver))] : []),
          poolSize: target?.poolSize ?? null,
          stackStartedByBench: target?.stackStartedByBench ?? false,
        }),
    });
  } finally {
    if (target?.stackStartedByBench) o.note('space bench: stopping the stack it started…');
    await target?.close();
  }
}

/** Writes the plot (unless `plot` is false) and, with `save`, the table and JSON; returns the paths. */
export function writeOutput(out: BenchOutput, o: { save: boolean; plot: boolean; dir?: string }): string[] {
  const dir = o.dir ?? DEFAULT_RESULTS_DIR;
  if (o.save) {
    const folder = saveOutput(out, dir);
    return ['table.md', 'result.json', 'plot.svg'].map((f) => `${folder}/${f}`);
  }
  return o.plot ? [savePlot(out, dir)] : [];
}

/** The warm pool a local agent keeps: SPACE_WARM_POOL_SIZE, else the agent config's default. */
export function agentPoolSize(env: NodeJS.ProcessEnv = process.env): number {
  const v = Number(env['SPACE_WARM_POOL_SIZE']);
  return Number.isInteger(v) &&
    v >= 0 &&
    env['SPACE_WARM_POOL_SIZE'] !== '' &&
    env['SPACE_WARM_POOL_SIZE'] !== undefined
    ? v
    : (agentSettings.warmPoolSize.default as number);
}

/** `latency` (see latency.ts). */
export async function latency(
  ctx: BenchContext,
  o: {
    n: number;
    concurrency: number[];
    phases: ('warm' | 'cold')[];
    coldMemory: number;
    floorRuns: number;
    floor: boolean;
    overlap?: boolean;
    poll?: boolean;
    warmup?: number;
  },
): Promise<BenchOutput> {
  const { runLatency, latencyOutput } = await import('./latency.ts');
  const r = await runLatency(
    ctx.target!,
    {
      n: o.n,
      concurrency: o.concurrency,
      phases: o.phases,
      coldMemoryMiB: o.coldMemory,
      floorRuns: o.floorRuns,
      overlap: o.overlap ?? false,
      createMode: o.poll ? 'poll' : 'wait',
      warmupWaves: o.warmup ?? 0,
    },
    { progress: ctx.progress, cacheDir: ctx.cacheDir, floor: o.floor, note: ctx.note },
  );
  const { readSpans, settledTraceFile, spanBudget } = await import('./spans.ts');
  const traceFile = ctx.target!.traceFile;
  if (traceFile) await settledTraceFile(traceFile);
  const budget = traceFile && existsSync(traceFile) ? spanBudget(readSpans(traceFile)) : null;
  return latencyOutput({ ...r, budget }, await ctx.runInfo(r.drivers));
}

/** `exec` (see exec.ts). */
export async function exec(
  ctx: BenchContext,
  o: { n: number; streams: number; streamMib: number; floor: boolean },
): Promise<BenchOutput> {
  const { measureExec, execOutput, execFloor } = await import('./exec.ts');
  const params = { n: o.n, streams: o.streams, streamMiB: o.streamMib };
  const s = await measureExec(ctx.target!.client, { ...params, progress: ctx.progress });
  const drivers = [...new Set((await ctx.target!.nodes()).filter((n) => n.alive).map((n) => n.driver))];
  let floor = false;
  if (o.floor) {
    const why = !ctx.target!.local
      ? 'the stack is not on this host'
      : process.getuid?.() !== 0
        ? 'needs root on the stack’s host'
        : drivers.length !== 1 || drivers[0] !== 'gvisor'
          ? `no exec floor for ${drivers.join(', ') || 'no driver'} yet (gVisor only)`
          : null;
    if (why) ctx.note(`exec: driver floor skipped: ${why}`);
    else {
      const bar = ctx.progress.phase('driver floor (bare runsc exec)', o.n);
      s.floorMs = await execFloor(o.n, ctx.cacheDir, () => bar.tick());
      bar.stop();
      floor = true;
    }
  }
  return execOutput(s, { ...params, floor }, await ctx.runInfo());
}

/** `pause-resume` (see pause-resume.ts); the driver floor only on a local stack. */
export async function pauseResume(ctx: BenchContext, o: { n: number; floor: boolean }): Promise<BenchOutput> {
  const pr = await import('./pause-resume.ts');
  const samples = await pr.measurePauseResume(ctx.target!.client, { n: o.n, progress: ctx.progress });
  const floor = o.floor && ctx.target!.local;
  if (o.floor && !floor) ctx.note('driver floor skipped: the stack is not on this host');
  if (floor) {
    const bar = ctx.progress.phase('driver floor (gVisor)', 1);
    Object.assign(samples, await pr.pauseResumeFloor(o.n, ctx.cacheDir));
    bar.tick();
    bar.stop();
  }
  return pr.pauseResumeOutput(samples, { n: o.n, floor }, await ctx.runInfo());
}

/** `density` (see density.ts). */
export async function density(
  ctx: BenchContext,
  o: { n: number; settle: number; reads: number; floor: boolean },
): Promise<BenchOutput> {
  const d = await import('./density.ts');
  const { densityFloor } = await import('./floor.ts');
  const params = { n: o.n, settleSec: o.settle, reads: o.reads };
  const drivers = [...new Set((await ctx.target!.nodes()).filter((n) => n.alive).map((n) => n.driver))];
  let floor: DensityFloor | undefined;
  if (o.floor) {
    // one floor, of the stack's driver; a mixed stack gets none (which driver would it be?)
    const f =
      drivers.length === 1
        ? densityFloor(drivers[0]!, ctx.cacheDir)
        : { skipped: 'nodes of several drivers' };
    if ('skipped' in f) ctx.note(`density: no floor: ${f.skipped}`);
    else floor = f;
  }
  const samples = await d.measureDensity(ctx.target!, { ...params, progress: ctx.progress, floor });
  const sampled = [...new Set(samples.filter((s) => !s.floor).map((s) => s.driver))];
  return d.densityOutput(samples, params, await ctx.runInfo(sampled));
}

/** `throughput` (see throughput.ts). */
export async function throughput(
  ctx: BenchContext,
  o: { concurrency: number; duration: number; maxCreates: number },
): Promise<BenchOutput> {
  const t = await import('./throughput.ts');
  const params = { concurrency: o.concurrency, durationSec: o.duration, maxCreates: o.maxCreates };
  const r = await t.measureThroughput(ctx.target!.client, { ...params, progress: ctx.progress });
  return t.throughputOutput(r, params, await ctx.runInfo());
}

/** The traces shipped in benchmarks/traces/: name → file. */
export function defaultTraces(): Record<string, string> {
  const dir = fileURLToPath(new URL('./traces/', import.meta.url));
  return { agent: `${dir}agent.csv`, busy: `${dir}busy.csv` };
}

/** The API's default idle seconds before auto-pause (SPACE_DEFAULT_AUTO_PAUSE_SEC's default). */
export function apiDefaultAutoPauseSec(): number {
  return apiSettings.defaultAutoPauseSec.default as number;
}

/** `cost` (see cost.ts): density from `--density`, else measured now on the target. */
export async function cost(
  ctx: BenchContext,
  o: {
    trace?: Record<string, string>;
    density?: number;
    densityN: number;
    vcpus: number;
    memoryGib: number;
    reserveMib: number;
    autoPause?: number;
    utilisation: number;
    cloud?: string;
  },
): Promise<BenchOutput> {
  const c = await import('./cost.ts');
  let densityMiB = o.density;
  let densitySource = 'given with --density';
  let drivers: string[] = [];
  if (densityMiB === undefined) {
    const d = await import('./density.ts');
    const samples = await d.measureDensity(ctx.target!, {
      n: o.densityN,
      settleSec: 10,
      reads: 3,
      progress: ctx.progress,
    });
    const s = d.densitySummary(samples)[0]!;
    densityMiB = s.usageMiB.p50;
    drivers = [s.driver];
    densitySource = `measured in this run: p50 cgroup usage of ${s.sandboxes} idle ${s.driver} sandboxes`;
  }
  const params = {
    traces: o.trace ?? defaultTraces(),
    densityMiB,
    densitySource,
    shape: { vcpus: o.vcpus, memoryGiB: o.memoryGib },
    reserveMiB: o.reserveMib,
    autoPauseSec: o.autoPause ?? apiDefaultAutoPauseSec(),
    utilisation: o.utilisation,
    clouds: o.cloud ? o.cloud.split(',') : null,
  };
  return c.costOutput(params, c.loadCatalogue(), await ctx.runInfo(drivers));
}
