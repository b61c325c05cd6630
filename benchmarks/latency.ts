/**
 * `space bench latency`: sandbox creation latency as a client sees it, under concurrency, beside
 * the driver's floor measured in the same run.
 *
 * For each concurrency C of the sweep (default 1, 8, 32), N creates (default N = 32) in waves of C
 * simultaneous POST /v1/sandboxes, in two phases:
 * - `warm`: the default shape (the warm pool's); before each wave the benchmark waits until the
 *   node holds no sandbox (the earlier waves' deletes are done) and the pool is as full as at the
 *   start, so the wave is what a full pool on a settled node does with C at once — no earlier
 *   sample's teardown or refill runs under it (back to back, C = 1 measured those: p50 33 ms
 *   against 16 ms settled, same session). A wave's sandboxes are deleted once all of the wave is
 *   timed, so no delete of the wave runs beside its creates still in flight either;
 * - `cold`: a shape the pool does not hold (`--cold-memory`, default 640 MiB), so the node must make
 *   every instance (snapshot restore or boot, whichever it does).
 * Each create is timed from its POST to `ready` (its operation succeeded). By default the POST asks
 * the API to answer once the create has ended (`POST /v1/sandboxes?waitMs=`: one request, as the
 * CLI and a client that wants a running sandbox make it); with `poll`, the POST answers at once
 * (`accepted`) and the client long-polls the operation (a second request). Each sandbox then runs
 * `echo ready`, timed from that command's POST to its first stdout event (`first output`). By
 * default a wave's commands are posted together once the whole wave is ready, so `ready` measures
 * creation under C concurrent creates and nothing else of the benchmark's (a command is a process
 * spawn in the guest: under gVisor's ptrace platform, 17 of them beside a wave's last creates
 * delayed those by ~0.5 s). With `overlap`, each sandbox runs its command as soon as it is ready,
 * beside the wave's later creates: the mixed load of C agents that each create and run at once.
 * Every sample is then **classified by what the API says the create did** — the sandbox's
 * `createdFrom` (`warm` claim, `snapshot` restore, `boot`) — never by the phase: a warm-phase create
 * that found the pool empty counts as the snapshot or boot it was. Creates the API refused (e.g.
 * capacity) are counted as errors, not timed.
 */
import { ApiStatusError, type BenchClient } from './api.ts';
import { type FloorResult, measureFloor } from './floor.ts';
import type { ProgressFactory } from './progress.ts';
import {
  BENCH_SCHEMA,
  type BenchDocument,
  type BenchOutput,
  composeMarkdown,
  distributionSpec,
  markdownTable,
  type PlotPoint,
  type RunInfo,
  renderSvg,
} from './report.ts';
import { type BudgetRow, budgetTable } from './spans.ts';
import type { BenchTarget } from './stack.ts';
import { fmt, type Summary, summarise } from './stats.ts';

/** How the node made a sandbox's instance, as the API reports it (`createdFrom`). */
export type CreateSource = 'warm' | 'snapshot' | 'boot';
/** Every source, in table order. */
export const CREATE_SOURCES: readonly CreateSource[] = ['warm', 'snapshot', 'boot'];
/** Which shape the create asked for (see the module doc); not a classification. */
export type LatencyPhase = 'warm' | 'cold';

/**
 * One create, as measured, in ms; NaN when not reached. `acceptedMs` and `readyMs` count from the
 * create's POST (`acceptedMs` is NaN unless the run polled: {@link CreateMode}), `firstOutputMs`
 * from its command's POST.
 */
export interface CreateSample {
  concurrency: number;
  phase: LatencyPhase;
  /** Wave number within the phase (0-based). */
  wave: number;
  /** What the API says the create did; null when it failed before telling. */
  source: CreateSource | null;
  acceptedMs: number;
  readyMs: number;
  firstOutputMs: number;
  /** The failure (HTTP status and body, or the operation's error), when the create failed. */
  error?: string;
  /** The POST was refused before anything was made (no room: 503 with `Retry-After`). */
  refused?: boolean;
}

/**
 * How a create is waited for: `wait` — one `POST /v1/sandboxes?waitMs=` answered once the create
 * has ended; `poll` — the POST answers at once (timed as `accepted`), then the operation is
 * long-polled (`GET /v1/operations/:id?waitMs=`).
 */
export type CreateMode = 'wait' | 'poll';

/** Longest a create's POST waits in `wait` mode, ms (the API's cap on `waitMs`). */
const CREATE_WAIT_MS = 60_000;

/** The three timed figures of a create. */
export const LATENCY_METRICS = [
  ['acceptedMs', 'accepted'],
  ['readyMs', 'ready'],
  ['firstOutputMs', 'first output'],
] as const;

/**
 * The successful samples of `source` at `concurrency` — the only ones a figure of that class may
 * count (a warm figure counts warm claims only, whatever phase they ran in). Pure.
 */
export function samplesOf(
  all: readonly CreateSample[],
  source: CreateSource,
  concurrency: number,
): CreateSample[] {
  return all.filter((s) => s.error === undefined && s.source === source && s.concurrency === concurrency);
}

/** One row of the latency summary: a concurrency, a class, a metric. */
export interface LatencyRow {
  concurrency: number;
  source: CreateSource;
  metric: (typeof LATENCY_METRICS)[number][1];
  summary: Summary;
  /** p50 of this figure ÷ p50 of the floor (NaN without a floor, and for `accepted`). */
  p50OverFloor: number;
}

/** Summary rows (every concurrency × class that has samples × metric). Pure. */
export function latencyRows(all: readonly CreateSample[], floorP50: number): LatencyRow[] {
  const rows: LatencyRow[] = [];
  for (const c of [...new Set(all.map((s) => s.concurrency))].sort((a, b) => a - b)) {
    for (const source of CREATE_SOURCES) {
      const xs = samplesOf(all, source, c);
      if (!xs.length) continue;
      for (const [key, metric] of LATENCY_METRICS) {
        const summary = summarise(xs.map((s) => s[key]));
        if (summary.n === 0) continue; // not measured in this run (accepted, when it did not poll)
        // accepted is the API's answer alone: no floor to compare it with
        const p50OverFloor = key === 'acceptedMs' ? Number.NaN : summary.p50 / floorP50;
        rows.push({ concurrency: c, source, metric, summary, p50OverFloor });
      }
    }
  }
  return rows;
}

/** Failed creates per concurrency and phase (counted, never timed; `refused`: of them, refused at POST). Pure. */
export function errorCounts(
  all: readonly CreateSample[],
): { concurrency: number; phase: LatencyPhase; errors: number; refused: number; first: string }[] {
  const out = new Map<
    string,
    { concurrency: number; phase: LatencyPhase; errors: number; refused: number; first: string }
  >();
  for (const s of all) {
    if (s.error === undefined) continue;
    const k = `${s.concurrency}/${s.phase}`;
    const e = out.get(k) ?? {
      concurrency: s.concurrency,
      phase: s.phase,
      errors: 0,
      refused: 0,
      first: s.error,
    };
    e.errors++;
    if (s.refused) e.refused++;
    out.set(k, e);
  }
  return [...out.values()];
}

/** Markdown rows of {@link latencyRows} (ms, one decimal for the ratio). Pure. */
export function latencyTableRows(rows: readonly LatencyRow[]): string[][] {
  return rows.map((r) => [
    String(r.concurrency),
    r.source,
    r.metric,
    String(r.summary.n),
    fmt(r.summary.p50),
    fmt(r.summary.p90),
    fmt(r.summary.p99),
    fmt(r.summary.max),
    Number.isFinite(r.p50OverFloor) ? `${r.p50OverFloor.toFixed(1)}×` : '-',
  ]);
}

/** Options of {@link measureCreates}. */
export interface CreateRunOptions {
  client: BenchClient;
  concurrency: number;
  n: number;
  phase: LatencyPhase;
  /** Extra create body (the cold phase's shape). */
  body: Record<string, unknown>;
  /**
   * Post each sandbox's command as soon as it is ready, beside the wave's later creates (default:
   * once the whole wave is ready; see the module doc).
   */
  overlap?: boolean;
  /** How each create is waited for (default `wait`). */
  mode?: CreateMode;
  /**
   * Untimed waves of `concurrency` run first (default 0): the stack's first burst at a
   * concurrency is slower than later ones (cold code paths, new connections), and a warm-up
   * measures the steady state instead.
   */
  warmupWaves?: number;
  /** Before each wave (warm phase: wait for the pool). */
  beforeWave?: (size: number) => Promise<void>;
  progress: ProgressFactory;
}

/**
 * Times one create to ready (see the module doc). Never throws: a failure becomes the sample's
 * `error`. Returns the sample and the sandbox's id (null when the POST failed), which the caller
 * deletes; `firstOutputMs` and `source` are left for {@link timeFirstOutput}.
 */
export async function timeCreate(
  client: BenchClient,
  body: Record<string, unknown>,
  meta: Pick<CreateSample, 'concurrency' | 'phase' | 'wave'>,
  mode: CreateMode = 'wait',
): Promise<{ sample: CreateSample; id: string | null }> {
  const s: CreateSample = {
    ...meta,
    source: null,
    acceptedMs: Number.NaN,
    readyMs: Number.NaN,
    firstOutputMs: Number.NaN,
  };
  let id: string | undefined;
  const t0 = performance.now();
  try {
    const res = await client.api<{
      sandbox: { id: string };
      operation: { id: string; state: string };
    }>('POST', mode === 'wait' ? `/v1/sandboxes?waitMs=${CREATE_WAIT_MS}` : '/v1/sandboxes', {
      template: 'base',
      timeoutSec: 300,
      ...body,
    });
    id = res.sandbox.id;
    if (mode === 'poll') s.acceptedMs = performance.now() - t0;
    // polling, or not succeeded within the POST's wait: waitOp waits out the rest, or throws the failure
    if (res.operation.state !== 'succeeded') await client.waitOp(res.operation.id);
    s.readyMs = performance.now() - t0;
  } catch (err) {
    s.error = (err as Error).message.slice(0, 300);
    if (id === undefined && err instanceof ApiStatusError && err.retryAfterSec !== null) s.refused = true;
  }
  return { sample: s, id: id ?? null };
}

/**
 * Runs `echo ready` in the ready sandbox `id` and sets `s.firstOutputMs` (from the command's POST to
 * its first stdout event), then `s.source` from what the API says the create did. Does nothing to a
 * sample that already failed; never throws (a failure becomes `s.error`).
 */
export async function timeFirstOutput(
  client: BenchClient,
  s: CreateSample,
  id: string | null,
): Promise<void> {
  if (s.error !== undefined || id === null) return;
  try {
    s.firstOutputMs = await client.firstOutput(id, 'ready');
    const rec = await client.api<{ createdFrom: CreateSource | null; fromWarmPool: boolean }>(
      'GET',
      `/v1/sandboxes/${id}`,
    );
    // older APIs had only fromWarmPool: then a non-warm create is a boot (no snapshots then)
    s.source = rec.createdFrom ?? (rec.fromWarmPool ? 'warm' : 'boot');
  } catch (err) {
    s.error = (err as Error).message.slice(0, 300);
  }
}

/** N creates in waves of `concurrency` (see the module doc). */
export async function measureCreates(o: CreateRunOptions): Promise<CreateSample[]> {
  const out: CreateSample[] = [];
  const bar = o.progress.phase(`latency c=${o.concurrency} ${o.phase}`, o.n);
  try {
    // warm-up waves (negative numbers) run exactly as the timed ones, and are then dropped
    for (let wave = -(o.warmupWaves ?? 0), done = 0; done < o.n; wave++) {
      const timed = wave >= 0;
      const size = timed ? Math.min(o.concurrency, o.n - done) : o.concurrency;
      await o.beforeWave?.(size);
      const meta = { concurrency: o.concurrency, phase: o.phase, wave };
      const one = () =>
        timeCreate(o.client, o.body, meta, o.mode).then((r) => {
          if (timed) bar.tick();
          return r;
        });
      const batch = await Promise.all(
        Array.from({ length: size }, () =>
          one().then(async (r) => {
            if (o.overlap) await timeFirstOutput(o.client, r.sample, r.id);
            return r;
          }),
        ),
      );
      // the wave is ready: its commands go together, none beside a create still in flight
      if (!o.overlap) await Promise.all(batch.map((r) => timeFirstOutput(o.client, r.sample, r.id)));
      if (timed) out.push(...batch.map((r) => r.sample));
      // the wave's sandboxes go once all of it is timed (untimed): a delete (the runtime's kill and
      // teardown) run beside the creates still in flight would be measured as their latency
      await Promise.all(
        batch.map((r) => (r.id ? o.client.api('DELETE', `/v1/sandboxes/${r.id}`).catch(() => {}) : null)),
      );
      if (timed) done += size;
    }
  } finally {
    bar.stop();
  }
  return out;
}

/**
 * Waits until no alive node holds a sandbox (the deletes of earlier samples are done), polling
 * every `pollMs` (default 100), at most `timeoutMs` (default 60 000); then returns either way.
 */
export async function waitForNoSandboxes(
  t: Pick<BenchTarget, 'nodes'>,
  o: { timeoutMs?: number; pollMs?: number } = {},
): Promise<void> {
  const until = Date.now() + (o.timeoutMs ?? 60_000);
  while (Date.now() < until) {
    const held = (await t.nodes()).filter((n) => n.alive).reduce((a, n) => a + n.sandboxes, 0);
    if (held === 0) return;
    await new Promise((r) => setTimeout(r, o.pollMs ?? 100));
  }
}

/**
 * Waits until `warm()` reports at least `want` ready instances, or until a pool that holds some
 * has not grown for `stableMs` (a pool smaller than `want` — held back by memory — is then as full
 * as it gets), at most `timeoutMs`. An empty pool is never taken as full before the timeout: on a
 * loaded node one snapshot restore can take longer than `stableMs`, and a run that started its warm
 * phase on an empty pool measured restores, not claims (seen: 10 of 32 sequential "warm" creates).
 * @returns the last count seen.
 */
export async function waitForPool(
  warm: () => Promise<number>,
  want: number,
  o: { stableMs?: number; timeoutMs?: number; pollMs?: number } = {},
): Promise<number> {
  const stableMs = o.stableMs ?? 20_000;
  const deadline = Date.now() + (o.timeoutMs ?? 180_000);
  let last = -1;
  let since = Date.now();
  for (;;) {
    const n = await warm();
    if (n >= want) return n;
    if (Date.now() > deadline) return n;
    if (n !== last) {
      last = n;
      since = Date.now();
    } else if (n > 0 && Date.now() - since >= stableMs) return n;
    await new Promise((r) => setTimeout(r, o.pollMs ?? 100));
  }
}

/** The floor's p50 (NaN when skipped). Pure. */
export function floorP50(f: FloorResult | null): number {
  return f && 'samples' in f ? summarise(f.samples).p50 : Number.NaN;
}

/** Parameters of a latency run (as printed in the JSON). */
export interface LatencyParams {
  n: number;
  concurrency: number[];
  phases: LatencyPhase[];
  /** MiB of the cold phase's shape. */
  coldMemoryMiB: number;
  floorRuns: number;
  /** Whether each command ran beside the wave's later creates ({@link CreateRunOptions.overlap}). */
  overlap: boolean;
  /** How each create was waited for ({@link CreateMode}). */
  createMode: CreateMode;
  /** Untimed waves before the timed ones, per concurrency and phase ({@link CreateRunOptions.warmupWaves}). */
  warmupWaves: number;
  /** Ready warm instances the pool held when the run started. */
  poolSeen: number;
}

/** Runs the whole latency benchmark: floor first, then every concurrency × phase. */
export async function runLatency(
  t: BenchTarget,
  p: Omit<LatencyParams, 'poolSeen'>,
  o: { progress: ProgressFactory; cacheDir: string; floor: boolean; note: (line: string) => void },
): Promise<{ params: LatencyParams; samples: CreateSample[]; floor: FloorResult | null; drivers: string[] }> {
  const drivers = [...new Set((await t.nodes()).filter((n) => n.alive).map((n) => n.driver))];
  o.note(`waiting for the warm pool to fill (${t.poolSize ?? 'size unknown'})…`);
  const poolSeen = await waitForPool(() => t.warm('base'), t.poolSize ?? Number.POSITIVE_INFINITY, {
    timeoutMs: 600_000,
  });
  let floor: FloorResult | null = null;
  if (o.floor) {
    const driver = drivers[0] ?? 'unknown';
    if (!t.local) floor = { driver, skipped: 'the stack is not on this host (--target)' };
    else {
      const bar = o.progress.phase(`floor (${driver})`, p.floorRuns);
      try {
        floor = await measureFloor(driver, p.floorRuns, { cacheDir: o.cacheDir, onSample: () => bar.tick() });
      } finally {
        bar.stop();
      }
    }
  }
  const samples: CreateSample[] = [];
  for (const c of p.concurrency) {
    for (const phase of p.phases) {
      samples.push(
        ...(await measureCreates({
          client: t.client,
          concurrency: c,
          n: p.n,
          phase,
          overlap: p.overlap,
          mode: p.createMode,
          warmupWaves: p.warmupWaves,
          body: phase === 'cold' ? { memoryMiB: p.coldMemoryMiB } : {},
          beforeWave:
            phase === 'warm'
              ? async () => {
                  await waitForNoSandboxes(t, { timeoutMs: 120_000 });
                  await waitForPool(() => t.warm('base'), poolSeen, { timeoutMs: 120_000 });
                }
              : undefined,
          progress: o.progress,
        })),
      );
    }
  }
  return { params: { ...p, poolSeen }, samples, floor, drivers };
}

/** The table, JSON document and plot of a latency run. */
export async function latencyOutput(
  r: {
    params: LatencyParams;
    samples: CreateSample[];
    floor: FloorResult | null;
    /** Where the time went, from the stack's spans (null: the stack's spans are not at hand). */
    budget?: BudgetRow[] | null;
  },
  run: RunInfo,
): Promise<BenchOutput> {
  const fp50 = floorP50(r.floor);
  const rows = latencyRows(r.samples, fp50);
  const floorSummary = r.floor && 'samples' in r.floor ? summarise(r.floor.samples) : null;
  const header = ['C', 'class', 'figure', 'n', 'p50 ms', 'p90 ms', 'p99 ms', 'max ms', 'p50 ÷ floor'];
  const body = latencyTableRows(rows);
  if (floorSummary) {
    body.push([
      '-',
      'floor',
      r.floor!.driver,
      String(floorSummary.n),
      fmt(floorSummary.p50),
      fmt(floorSummary.p90),
      fmt(floorSummary.p99),
      fmt(floorSummary.max),
      '1.0×',
    ]);
  }
  const errors = errorCounts(r.samples);
  const notes = [
    r.floor
      ? 'samples' in r.floor
        ? `Floor: ${r.floor.what}, measured in this run.`
        : `Floor not measured: ${r.floor.skipped}.`
      : 'Floor not measured (--no-floor).',
    `Classes are what the API reports per create (createdFrom): warm = pool claim, snapshot = snapshot restore, boot = cold boot. Warm phase: default shape, each wave on a settled node (no sandbox left from earlier waves, the pool back to ${r.params.poolSeen} instances); cold phase: ${r.params.coldMemoryMiB} MiB, a shape the pool does not hold.`,
    ...errors.map(
      (e) =>
        `C=${e.concurrency} ${e.phase} phase: ${e.errors} create(s) failed, not timed${e.refused ? ` (${e.refused} refused at POST with Retry-After: no room then)` : ''} (first: ${e.first})`,
    ),
  ];
  const doc: BenchDocument = {
    schema: BENCH_SCHEMA,
    command: 'latency',
    run,
    params: { ...r.params },
    samples: { creates: r.samples, floor: r.floor },
    summary: { rows, errors, floorP50Ms: Number.isFinite(fp50) ? fp50 : null, budget: r.budget ?? null },
    assumptions: [
      'Percentiles are nearest-rank (a measured value; p99 of fewer than 100 samples is the max).',
      'Times are wall clock on the benchmark client: accepted and ready from the POST /v1/sandboxes, first output from the POST of the sandbox’s command (echo); the sandboxes of a wave are deleted once the whole wave is timed, untimed.',
      r.params.warmupWaves > 0
        ? `Each concurrency and phase ran ${r.params.warmupWaves} untimed warm-up wave(s) first (--warmup): the figures are the steady state, not the stack's first burst at that concurrency.`
        : 'No warm-up (--warmup 0): the first wave at each concurrency is timed, so the figures include the stack’s first burst at it (cold code paths, new connections).',
      r.params.createMode === 'poll'
        ? 'Each create was a POST /v1/sandboxes answered at once (accepted), then a long-poll of its operation (ready): two requests (--poll).'
        : 'Each create was one POST /v1/sandboxes?waitMs= that the API answered once the create had ended (ready); accepted is not measured this way (--poll measures it, with a second request per create).',
      r.params.overlap
        ? 'Each sandbox’s command (echo) was posted as soon as it was ready, beside the wave’s later creates (--overlap).'
        : 'A wave’s commands (echo) were posted together once the whole wave was ready, so no command ran beside a create (--overlap mixes them).',
    ],
  };
  const points: PlotPoint[] = [];
  for (const s of r.samples) {
    if (s.error !== undefined || !s.source) continue;
    const panel = { panel: `concurrency ${s.concurrency}`, panelOrder: s.concurrency };
    points.push({ series: `${s.source} ready`, value: s.readyMs, ...panel });
    points.push({
      series: `${s.source} first output`,
      value: s.firstOutputMs,
      ...panel,
    });
  }
  if (r.floor && 'samples' in r.floor) {
    for (const c of r.params.concurrency) {
      for (const v of r.floor.samples) {
        points.push({ series: 'floor', value: v, panel: `concurrency ${c}`, panelOrder: c });
      }
    }
  }
  const main = markdownTable(header, body, [true, false, false, true, true, true, true, true, true]);
  const table = r.budget?.length
    ? `${main}\n\nWhere the time went: each hop's span (OpenTelemetry, from the stack's SPACE_TRACE_FILE), per kind of create and for the commands (exec: the command's POST and its stream, one trace each):\n\n${budgetTable(r.budget)}`
    : main;
  return {
    doc,
    markdown: composeMarkdown(
      `space bench latency — N=${r.params.n} per concurrency and phase`,
      table,
      doc,
      notes,
    ),
    svg: await renderSvg(distributionSpec('Create latency (ms, log scale)', 'ms from POST', points, true)),
  };
}
