/**
 * What every `space bench` command hands back and how it is shown: a Markdown table on stdout, a
 * JSON document (raw samples + what it ran on) with `--json`, an SVG plot of the distributions
 * rendered headlessly by vega-lite → vega (no browser, no canvas), and `--save` writing all three
 * under `benchmarks/results/<command>-<timestamp>/`.
 */
import { execFileSync } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import { cpus, release } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { type Static, Type } from '@sinclair/typebox';
import { fmt, summarise } from './stats.ts';

/** Schema tag of the JSON document; bump when its shape changes. */
export const BENCH_SCHEMA = 'space-bench/1';

/** Where results go by default: `benchmarks/results/` of this checkout (git-ignored). */
export const DEFAULT_RESULTS_DIR = fileURLToPath(new URL('./results/', import.meta.url));

/** What a run measured on: software, hardware and the stack's shape. */
export const RunInfoSchema = Type.Object({
  /** `git rev-parse HEAD` of this checkout when the run started, or `unknown`. */
  commit: Type.String(),
  /** True when tracked files differed from that commit (the code run is not exactly the commit). */
  dirty: Type.Boolean(),
  node: Type.String(),
  /** CPU model of the host running the benchmark (the first core's `model name`). */
  cpuModel: Type.String(),
  /** Logical cores of that host. */
  cores: Type.Integer(),
  kernel: Type.String(),
  /** ISO 8601 start of the run. */
  date: Type.String(),
  /** API URL measured; null for a command that needs no stack (`cost --density`). */
  target: Type.Union([Type.String(), Type.Null()]),
  /** Drivers of the target's alive nodes (`gvisor`, `qemu`, …). */
  drivers: Type.Array(Type.String()),
  /** Warm instances per template the stack keeps (SPACE_WARM_POOL_SIZE), when known. */
  poolSize: Type.Union([Type.Integer(), Type.Null()]),
  /** True when the benchmark started the local stack itself (and stopped it after). */
  stackStartedByBench: Type.Boolean(),
});
/** See {@link RunInfoSchema}. */
export type RunInfo = Static<typeof RunInfoSchema>;

/** The JSON document of every command (`--json`, and `result.json` with `--save`). */
export const BenchDocumentSchema = Type.Object({
  schema: Type.Literal(BENCH_SCHEMA),
  command: Type.String(),
  run: RunInfoSchema,
  /** The command's parameters as used (after defaults). */
  params: Type.Record(Type.String(), Type.Unknown()),
  /** Raw samples, by figure; units in the figure's name or the command's docs (ms, MiB, USD). */
  samples: Type.Unknown(),
  /** The figures the table shows, computed from `samples`. */
  summary: Type.Unknown(),
  /** Every assumption the figures rest on, printed with the table too. */
  assumptions: Type.Array(Type.String()),
});
/** See {@link BenchDocumentSchema}. */
export type BenchDocument = Static<typeof BenchDocumentSchema>;

/** What a command produced, before it is printed or saved. */
export interface BenchOutput {
  doc: BenchDocument;
  /** Markdown (a title line, the table, then notes). */
  markdown: string;
  /** The plot, a standalone SVG document. */
  svg: string;
}

/** `git rev-parse HEAD` of this checkout (`unknown` outside git), and whether tracked files differ from it. */
export function gitCommit(): { commit: string; dirty: boolean } {
  const git = (args: string[]) =>
    execFileSync('git', args, {
      cwd: fileURLToPath(new URL('.', import.meta.url)),
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'ignore'],
    }).trim();
  try {
    return {
      commit: git(['rev-parse', 'HEAD']),
      dirty: git(['status', '--porcelain', '--untracked-files=no']) !== '',
    };
  } catch {
    return { commit: 'unknown', dirty: false };
  }
}

/** This host's facts plus what the caller knows of the target (and the commit, read at the run's start). */
export function runInfo(t: {
  git?: { commit: string; dirty: boolean };
  target: string | null;
  drivers: string[];
  poolSize: number | null;
  stackStartedByBench: boolean;
  date?: Date;
}): RunInfo {
  return {
    ...(t.git ?? gitCommit()),
    node: process.version,
    cpuModel: cpus()[0]?.model.trim() ?? 'unknown',
    cores: cpus().length,
    kernel: release(),
    date: (t.date ?? new Date()).toISOString(),
    target: t.target,
    drivers: t.drivers,
    poolSize: t.poolSize,
    stackStartedByBench: t.stackStartedByBench,
  };
}

/** One line saying what the run was measured on (printed under every table). Pure. */
export function runLine(r: RunInfo): string {
  return (
    `measured ${r.date} on ${r.cores}× ${r.cpuModel}, Linux ${r.kernel}, Node ${r.node}, commit ${r.commit.slice(0, 12)}${r.dirty ? ' (with uncommitted changes)' : ''}` +
    (r.target
      ? `; target ${r.target}, driver ${r.drivers.join('+') || 'unknown'}, warm pool ${r.poolSize ?? 'unknown'}` +
        (r.stackStartedByBench ? ' (stack started by the benchmark)' : '')
      : '')
  );
}

/** A GitHub-flavoured Markdown table; cells' `|` escaped. `right` marks right-aligned columns. Pure. */
export function markdownTable(header: string[], rows: string[][], right: boolean[] = []): string {
  const esc = (s: string) => s.replace(/\|/g, '\\|');
  const line = (cells: string[]) => `| ${cells.map(esc).join(' | ')} |`;
  const rule = `|${header.map((_, i) => (right[i] ? ' ---: ' : ' --- ')).join('|')}|`;
  return [line(header), rule, ...rows.map(line)].join('\n');
}

/** A vega-lite spec (kept loose: vega-lite validates it when compiling). */
export type VegaLiteSpec = Record<string, unknown>;

/**
 * Renders a vega-lite spec to a standalone SVG string, headlessly (vega's `renderer: 'none'` view
 * with `toSVG`; text widths are estimated, no canvas needed). Loads vega on first use only.
 * @throws Error when vega-lite rejects the spec.
 */
export async function renderSvg(spec: VegaLiteSpec): Promise<string> {
  const [vega, vl] = await Promise.all([import('vega'), import('vega-lite')]);
  // vega-lite's notes on layout choices go to a silent logger, not to the user's stderr
  const compiled = vl.compile(
    {
      $schema: 'https://vega.github.io/schema/vega-lite/v6.json',
      background: 'white',
      ...spec,
    } as Parameters<typeof vl.compile>[0],
    { logger: vega.logger(vega.None) },
  );
  const view = new vega.View(vega.parse(compiled.spec), { renderer: 'none' });
  try {
    return await view.toSVG();
  } finally {
    view.finalize();
  }
}

/** One sample of a distribution plot: the series it belongs to (a row of the plot) and its value. */
export interface PlotPoint {
  series: string;
  value: number;
  /** Optional facet (one panel per distinct value), e.g. `concurrency 8`. */
  panel?: string;
  /** Order of the panel (ascending; default: the panels' names in text order), e.g. 8. */
  panelOrder?: number;
}

/**
 * A distribution plot: per series, every sample as a tick over a box (quartiles, whiskers to min and
 * max); panels stacked vertically when `panel` is set. Pure (returns the spec).
 */
export function distributionSpec(
  title: string,
  unit: string,
  points: PlotPoint[],
  log = false,
): VegaLiteSpec {
  const layer = {
    layer: [
      {
        mark: { type: 'boxplot', extent: 'min-max', opacity: 0.35 },
        encoding: {
          x: { field: 'value', type: 'quantitative', title: unit, scale: log ? { type: 'log' } : {} },
          y: { field: 'series', type: 'nominal', title: null },
        },
      },
      {
        mark: { type: 'tick', opacity: 0.7, thickness: 1.5 },
        encoding: {
          x: { field: 'value', type: 'quantitative' },
          y: { field: 'series', type: 'nominal' },
          color: { field: 'series', type: 'nominal', legend: null },
        },
      },
    ],
  };
  const values = points.filter((p) => Number.isFinite(p.value) && (!log || p.value > 0));
  if (points.some((p) => p.panel !== undefined)) {
    return {
      title,
      data: { values },
      facet: {
        row: {
          field: 'panel',
          type: 'nominal',
          title: null,
          ...(points.some((p) => p.panelOrder !== undefined)
            ? { sort: { field: 'panelOrder', op: 'min' } }
            : {}),
        },
      },
      spec: { width: 560, ...layer },
      resolve: { scale: { y: 'independent' } },
    };
  }
  return { title, data: { values }, width: 560, ...layer };
}

/** Writes `out` under `<dir>/<command>-<timestamp>/` (table.md, result.json, plot.svg); returns the folder. */
export function saveOutput(out: BenchOutput, dir = DEFAULT_RESULTS_DIR): string {
  const folder = join(dir, `${out.doc.command}-${out.doc.run.date.replace(/[:.]/g, '-')}`);
  mkdirSync(folder, { recursive: true });
  writeFileSync(join(folder, 'table.md'), `${out.markdown}\n`);
  writeFileSync(join(folder, 'result.json'), `${JSON.stringify(out.doc, null, 2)}\n`);
  writeFileSync(join(folder, 'plot.svg'), out.svg);
  return folder;
}

/** Writes only the plot to `<dir>/<command>-<timestamp>/plot.svg`; returns its path. */
export function savePlot(out: BenchOutput, dir = DEFAULT_RESULTS_DIR): string {
  const folder = join(dir, `${out.doc.command}-${out.doc.run.date.replace(/[:.]/g, '-')}`);
  mkdirSync(folder, { recursive: true });
  const file = join(folder, 'plot.svg');
  writeFileSync(file, out.svg);
  return file;
}

/** The Markdown a command prints: title, table, assumptions (as a list), and the run line. Pure. */
export function composeMarkdown(
  title: string,
  table: string,
  doc: BenchDocument,
  notes: string[] = [],
): string {
  const parts = [`## ${title}`, '', table, ''];
  for (const n of notes) parts.push(n);
  if (notes.length) parts.push('');
  if (doc.assumptions.length) {
    parts.push('Assumptions:');
    for (const a of doc.assumptions) parts.push(`- ${a}`);
    parts.push('');
  }
  parts.push(`_${runLine(doc.run)}_`);
  return parts.join('\n');
}

/** One figure of a {@link figureTable}: its samples and unit. */
export interface Figure {
  name: string;
  unit: string;
  samples: readonly number[];
  /** Decimals printed (default 1). */
  digits?: number;
}

/** A Markdown table of figures with n, p50, p90, p99, max, min (nearest-rank; see stats.ts). Pure. */
export function figureTable(figs: readonly Figure[]): string {
  return markdownTable(
    ['figure', 'unit', 'n', 'p50', 'p90', 'p99', 'max', 'min'],
    figs.map((f) => {
      const s = summarise(f.samples);
      const d = f.digits ?? 1;
      return [
        f.name,
        f.unit,
        String(s.n),
        fmt(s.p50, d),
        fmt(s.p90, d),
        fmt(s.p99, d),
        fmt(s.max, d),
        fmt(s.min, d),
      ];
    }),
    [false, false, true, true, true, true, true, true],
  );
}
