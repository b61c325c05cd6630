/**
 * `space bench <command>` (also `npm run bench -- <command>`): the benchmark suite of
 * `benchmarks/` — latency, exec, pause-resume, density, throughput, cost — against the local stack
 * (started the way `space up` does when none runs) or `--target URL --api-key K`.
 *
 * Every command prints a Markdown table on stdout (`--json`: the JSON document with raw samples and
 * what it ran on), shows a progress bar on stderr when that is a terminal, writes its plot (SVG) to
 * `benchmarks/results/<command>-<timestamp>/plot.svg`, and with `--save` the table and JSON beside
 * it. The benchmark code is loaded only when a bench command runs.
 */
import type { Command } from 'commander';
import type { BenchOutput } from '../../benchmarks/report.ts';
import type { BenchContext } from '../../benchmarks/suite.ts';
import { globals } from './context.ts';
import {
  collectKeyValue,
  note,
  parseNonNegativeInt,
  parsePositiveInt,
  parsePositiveNumber,
  printJson,
  println,
  usageError,
} from './output.ts';
import { DEFAULT_CACHE_DIR } from './template.ts';

type Suite = typeof import('../../benchmarks/suite.ts');
/** The options a suite command takes (declared once, in benchmarks/suite.ts). */
type Options<K extends 'latency' | 'exec' | 'pauseResume' | 'density' | 'throughput' | 'cost'> = Parameters<
  Suite[K]
>[1];

/** Options every bench command takes. */
interface CommonOptions {
  target?: string;
  pool?: number;
  save?: boolean;
  resultsDir?: string;
  plot: boolean;
  /** latency only: keep the started stack's spans here. */
  traceFile?: string;
}

/** `1,8,32` → [1, 8, 32] (positive integers). Pure. */
export function parseIntList(what: string) {
  return (value: string): number[] => {
    const xs = value.split(',').map((v) => v.trim());
    if (!xs.length || xs.some((v) => !/^[0-9]+$/.test(v) || Number(v) < 1)) {
      throw usageError(`${what} takes a comma list of positive integers, got "${value}"`);
    }
    return xs.map(Number);
  };
}

/** Adds the options every bench command takes (see {@link CommonOptions}) to `cmd`. */
function common(cmd: Command, poolDefault: string): Command {
  return cmd
    .option('--target <url>', 'API URL of a remote stack (default: the local stack, started if none runs)')
    .option(
      '--pool <n>',
      `warm pool of a local stack the benchmark starts itself (default ${poolDefault}); a running stack keeps its own`,
      parseNonNegativeInt('--pool'),
    )
    .option(
      '--save',
      'also write table.md and result.json beside the plot (benchmarks/results/<command>-<time>/)',
    )
    .option('--results-dir <dir>', 'where results go (default benchmarks/results)')
    .option('--no-plot', 'write no plot');
}

/**
 * Runs one bench command: opens the target (unless `needsStack` is false), measures, prints and
 * writes. The target a benchmark started is stopped whatever happens.
 */
async function runBench(
  cmd: Command,
  o: CommonOptions,
  needsStack: boolean,
  /** Warm pool for a stack the benchmark starts (undefined: the agent's default). */
  defaultPool: number | undefined,
  measure: (suite: Suite, ctx: BenchContext) => Promise<BenchOutput>,
): Promise<void> {
  const suite = await import('../../benchmarks/suite.ts');
  const g = globals(cmd);
  const out = await suite.runWithContext(
    {
      json: g.json === true,
      target: o.target ?? g.apiUrl,
      apiKey: g.apiKey,
      pool: o.pool ?? defaultPool,
      needsStack,
      cacheDir: process.env['SPACE_CACHE_DIR'] ?? DEFAULT_CACHE_DIR,
      note,
      ...(o.traceFile ? { traceFile: o.traceFile } : {}),
    },
    (ctx) => measure(suite, ctx),
  );
  if (g.json) printJson(out.doc);
  else println(out.markdown);
  const written = suite.writeOutput(out, { save: o.save === true, plot: o.plot, dir: o.resultsDir });
  for (const f of written) note(`space bench: wrote ${f}`);
}

/** Registers `space bench` and its commands (latency, exec, pause-resume, density, throughput, cost). */
export function registerBench(program: Command): void {
  const bench = program
    .command('bench')
    .description(
      'benchmarks: creation latency, exec, pause/resume, density, throughput, cost per active hour',
    )
    .addHelpText(
      'after',
      `
Against the local stack (started with \`space up\`'s defaults on free ports when none runs; needs root)
or a remote one: --target URL with the global --api-key K.
Every command prints a Markdown table (--json: raw samples and what it ran on) and writes an SVG plot
under benchmarks/results/<command>-<time>/ (--save adds table.md and result.json there).

Examples:
  space bench latency                          # sweep C = 1, 8, 32, N = 32 each, with the driver floor
  space bench latency --n 8 --concurrency 1,4 --save
  space bench cost --density 60 --auto-pause 60
  space --json bench density --n 4 > density.json
  npm run bench -- throughput --duration 20`,
    );

  common(
    bench
      .command('latency')
      .description(
        'create latency (accepted / ready / first output), warm and cold, under concurrency, beside the driver floor',
      ),
    'the largest concurrency',
  )
    .option('--n <count>', 'creates per concurrency and phase', parsePositiveInt('--n'), 32)
    .option('--concurrency <list>', 'comma list of concurrencies', parseIntList('--concurrency'), [1, 8, 32])
    .option(
      '--phases <list>',
      'warm, cold or both',
      (v: string) => {
        const xs = v.split(',');
        if (!xs.length || xs.some((x) => x !== 'warm' && x !== 'cold'))
          throw usageError('--phases takes warm, cold or warm,cold');
        return xs as ('warm' | 'cold')[];
      },
      ['warm', 'cold'] as ('warm' | 'cold')[],
    )
    .option(
      '--cold-memory <MiB>',
      'memory of the cold phase’s shape (one the pool does not hold)',
      parsePositiveInt('--cold-memory'),
      640,
    )
    .option('--floor-runs <count>', 'samples of the driver floor', parsePositiveInt('--floor-runs'), 10)
    .option('--no-floor', 'skip the driver floor')
    .option(
      '--overlap',
      'run each sandbox’s command as soon as it is ready, beside the wave’s later creates (default: once the whole wave is ready)',
    )
    .option(
      '--warmup <waves>',
      'untimed waves at each concurrency and phase before the timed ones (the steady state rather than the first burst)',
      parseNonNegativeInt('--warmup'),
      0,
    )
    .option(
      '--poll',
      'answer each create’s POST at once (timed as accepted) and long-poll its operation: two requests (default: one POST ?waitMs= that answers once the sandbox runs)',
    )
    .option(
      '--trace-file <path>',
      'keep the spans of the stack the benchmark starts in <path> (JSON lines; replaced), to look at single creates',
    )
    .action(async (o: CommonOptions & Options<'latency'>, cmd: Command) => {
      await runBench(cmd, o, true, Math.max(...o.concurrency), (suite, ctx) => suite.latency(ctx, o));
    });

  common(
    bench.command('exec').description('command round trip and stdout stream throughput on one sandbox'),
    'the agent’s',
  )
    .option('--n <count>', 'round trips', parsePositiveInt('--n'), 30)
    .option('--streams <count>', 'stream runs', parsePositiveInt('--streams'), 5)
    .option('--stream-mib <MiB>', 'stdout per stream run', parsePositiveInt('--stream-mib'), 16)
    .option('--no-floor', 'skip the driver floor (remote targets, or no root)')
    .action(async (o: CommonOptions & Options<'exec'>, cmd: Command) => {
      await runBench(cmd, o, true, undefined, (suite, ctx) => suite.exec(ctx, o));
    });

  common(
    bench
      .command('pause-resume')
      .description('pause, resume and resume-on-traffic latency, beside the gVisor driver’s own'),
    'the agent’s',
  )
    .option('--n <count>', 'samples per figure', parsePositiveInt('--n'), 5)
    .option('--no-floor', 'skip the driver floor (remote targets, or no root)')
    .action(async (o: CommonOptions & Options<'pauseResume'>, cmd: Command) => {
      await runBench(cmd, o, true, undefined, (suite, ctx) => suite.pauseResume(ctx, o));
    });

  common(
    bench
      .command('density')
      .description('host memory and processes per idle sandbox, per driver (on the stack’s host)'),
    'the agent’s',
  )
    .option('--n <count>', 'idle sandboxes', parsePositiveInt('--n'), 8)
    .option('--settle <s>', 'seconds to wait before reading', parseNonNegativeInt('--settle'), 10)
    .option(
      '--reads <count>',
      'reads per sandbox, one second apart (median kept)',
      parsePositiveInt('--reads'),
      3,
    )
    .option('--no-floor', 'skip the driver floor (bare idle instances beside the sandboxes)')
    .action(async (o: CommonOptions & Options<'density'>, cmd: Command) => {
      await runBench(cmd, o, true, undefined, (suite, ctx) => suite.density(ctx, o));
    });

  common(
    bench
      .command('throughput')
      .description('creates per second sustained over a fixed duration, bounded concurrency'),
    'the concurrency',
  )
    .option('--concurrency <n>', 'workers creating in parallel', parsePositiveInt('--concurrency'), 8)
    .option('--duration <s>', 'window, seconds (≤ 600)', parsePositiveInt('--duration'), 30)
    .option('--max-creates <n>', 'stop after this many creates', parsePositiveInt('--max-creates'), 2000)
    .action(async (o: CommonOptions & Options<'throughput'>, cmd: Command) => {
      if (o.duration > 600) throw usageError('--duration is at most 600 s');
      await runBench(cmd, o, true, o.concurrency, (suite, ctx) => suite.throughput(ctx, o));
    });

  common(
    bench
      .command('cost')
      .description(
        'USD per active hour per cloud and instance type: SPACE self-hosted vs wall-clock and per-session billing',
      ),
    'the agent’s',
  )
    .option(
      '--trace <name=file>',
      'session trace CSV (repeatable; default: benchmarks/traces/agent.csv and busy.csv)',
      collectKeyValue('--trace'),
    )
    .option(
      '--density <MiB>',
      'host memory per idle sandbox (default: measured now with `density`)',
      parsePositiveNumber('--density'),
    )
    .option('--density-n <count>', 'idle sandboxes of that measurement', parsePositiveInt('--density-n'), 4)
    .option('--vcpus <n>', 'sandbox vCPUs priced', parsePositiveNumber('--vcpus'), 1)
    .option(
      '--memory-gib <GiB>',
      'sandbox memory priced (hosted options bill it)',
      parsePositiveNumber('--memory-gib'),
      0.5,
    )
    .option(
      '--reserve-mib <MiB>',
      'host memory kept for the OS and SPACE’s services',
      parseNonNegativeInt('--reserve-mib'),
      1024,
    )
    .option(
      '--auto-pause <s>',
      'idle seconds before SPACE pauses a sandbox (0: never; default the API’s)',
      parseNonNegativeInt('--auto-pause'),
    )
    .option(
      '--utilisation <0-1>',
      'average fill of the hosts (1: fully packed)',
      parsePositiveNumber('--utilisation'),
      1,
    )
    .option('--cloud <list>', 'only these clouds (linode, coreweave, crusoe)')
    .action(async (o: CommonOptions & Options<'cost'>, cmd: Command) => {
      if (o.utilisation > 1) throw usageError('--utilisation is a share in (0, 1]');
      await runBench(cmd, o, o.density === undefined, undefined, (suite, ctx) => suite.cost(ctx, o));
    });
}
