/**
 * `space bench throughput`: creates per second sustained over a fixed duration. C workers (default
 * 8) each loop create → wait until ready → delete, for `--duration` seconds (default 30; bounded by
 * `--max-creates`, default 2000). A create counts when its operation succeeded inside the window;
 * creates per second = counted creates ÷ window seconds. Deletes are awaited by the worker (the
 * steady state of sandboxes coming and going) and not timed. Each sample keeps its source
 * (`createdFrom`), so the table tells how many the warm pool served.
 */
import type { BenchClient } from './api.ts';
import { CREATE_SOURCES, type CreateSource } from './latency.ts';
import type { ProgressFactory } from './progress.ts';
import {
  BENCH_SCHEMA,
  type BenchDocument,
  type BenchOutput,
  composeMarkdown,
  markdownTable,
  type RunInfo,
  renderSvg,
} from './report.ts';
import { fmt, summarise } from './stats.ts';

/** One create of the throughput run. */
export interface ThroughputSample {
  /** ms from the window's start to the POST. */
  startMs: number;
  /** ms from the window's start to the operation's success; NaN when it failed. */
  readyAtMs: number;
  /** readyAtMs − startMs. */
  latencyMs: number;
  source: CreateSource | null;
  error?: string;
}

/** Creates per second of counted samples in a window of `windowMs`. Pure. */
export function createsPerSecond(samples: readonly ThroughputSample[], windowMs: number): number {
  const counted = samples.filter((s) => s.error === undefined && s.readyAtMs <= windowMs);
  return counted.length / (windowMs / 1000);
}

/** Counted creates per whole second of the window (index = second). Pure. */
export function perSecond(samples: readonly ThroughputSample[], windowMs: number): number[] {
  const out = new Array<number>(Math.ceil(windowMs / 1000)).fill(0);
  for (const s of samples) {
    if (s.error !== undefined || !(s.readyAtMs <= windowMs)) continue;
    const i = Math.min(out.length - 1, Math.floor(s.readyAtMs / 1000));
    out[i] = out[i]! + 1;
  }
  return out;
}

/** Runs the throughput benchmark. */
export async function measureThroughput(
  client: BenchClient,
  o: { concurrency: number; durationSec: number; maxCreates: number; progress: ProgressFactory },
): Promise<{ windowMs: number; samples: ThroughputSample[] }> {
  const windowMs = o.durationSec * 1000;
  const samples: ThroughputSample[] = [];
  const bar = o.progress.phase(`throughput c=${o.concurrency}`, o.durationSec);
  const t0 = performance.now();
  const timer = setInterval(() => bar.tick(), 1000);
  let started = 0;
  const worker = async () => {
    while (performance.now() - t0 < windowMs && started < o.maxCreates) {
      started++;
      const s: ThroughputSample = {
        startMs: performance.now() - t0,
        readyAtMs: Number.NaN,
        latencyMs: Number.NaN,
        source: null,
      };
      let id: string | undefined;
      try {
        const res = await client.api<{ sandbox: { id: string }; operation: { id: string } }>(
          'POST',
          '/v1/sandboxes',
          { template: 'base', timeoutSec: 300 },
        );
        id = res.sandbox.id;
        await client.waitOp(res.operation.id);
        s.readyAtMs = performance.now() - t0;
        s.latencyMs = s.readyAtMs - s.startMs;
        const rec = await client.api<{ createdFrom: CreateSource | null }>('GET', `/v1/sandboxes/${id}`);
        s.source = rec.createdFrom;
      } catch (err) {
        s.error = (err as Error).message.slice(0, 300);
        // a refused create (capacity) returns at once: back off a little instead of spinning
        await new Promise((r) => setTimeout(r, 100));
      } finally {
        if (id) await client.api('DELETE', `/v1/sandboxes/${id}`).catch(() => {});
      }
      samples.push(s);
    }
  };
  try {
    await Promise.all(Array.from({ length: o.concurrency }, worker));
  } finally {
    clearInterval(timer);
    bar.stop();
  }
  return { windowMs, samples };
}

/** The table, JSON document and plot of a throughput run. */
export async function throughputOutput(
  r: { windowMs: number; samples: ThroughputSample[] },
  params: { concurrency: number; durationSec: number; maxCreates: number },
  run: RunInfo,
): Promise<BenchOutput> {
  const ok = r.samples.filter((s) => s.error === undefined && s.readyAtMs <= r.windowMs);
  const failed = r.samples.filter((s) => s.error !== undefined);
  const rate = createsPerSecond(r.samples, r.windowMs);
  const timeline = perSecond(r.samples, r.windowMs);
  const bySource = Object.fromEntries(
    CREATE_SOURCES.map((src) => [src, ok.filter((s) => s.source === src).length]),
  );
  const lat = summarise(ok.map((s) => s.latencyMs));
  const perSec = summarise(timeline);
  const table = markdownTable(
    [
      'C',
      'window s',
      'creates',
      'creates/s',
      'per-second p50',
      'per-second min',
      'ready p50 ms',
      'ready p99 ms',
      'warm / snapshot / boot',
      'failed',
    ],
    [
      [
        String(params.concurrency),
        fmt(r.windowMs / 1000),
        String(ok.length),
        fmt(rate, 1),
        fmt(perSec.p50),
        fmt(perSec.min),
        fmt(lat.p50),
        fmt(lat.p99),
        CREATE_SOURCES.map((s) => bySource[s]).join(' / '),
        String(failed.length),
      ],
    ],
    [true, true, true, true, true, true, true, true, false, true],
  );
  const doc: BenchDocument = {
    schema: BENCH_SCHEMA,
    command: 'throughput',
    run,
    params,
    samples: r.samples,
    summary: { createsPerSecond: rate, perSecond: timeline, readyMs: lat, bySource, failed: failed.length },
    assumptions: [
      `${params.concurrency} workers, each create → ready → delete in a loop; a create counts when ready inside the ${params.durationSec} s window.`,
      'Deletes are awaited by the worker and not timed; failed creates back off 100 ms and are counted, not timed.',
    ],
  };
  const notes = failed.length ? [`First failure: ${failed[0]!.error}`] : [];
  const spec = {
    title: `Creates per second (C=${params.concurrency})`,
    data: { values: timeline.map((n, second) => ({ second, creates: n })) },
    mark: 'bar',
    width: 560,
    encoding: {
      x: { field: 'second', type: 'ordinal', title: 's into the window' },
      y: { field: 'creates', type: 'quantitative', title: 'creates ready in that second' },
    },
  };
  return {
    doc,
    markdown: composeMarkdown(`space bench throughput — ${params.durationSec} s`, table, doc, notes),
    svg: await renderSvg(spec),
  };
}
