/**
 * The latency budget of a benchmark run: the OpenTelemetry spans the stack wrote to its
 * `SPACE_TRACE_FILE` (see runtime/core/tracing.ts), grouped per hop and per kind of create (the
 * `space.instance.source` the agent put on its create span: warm claim, snapshot restore, boot) or
 * per command ({@link EXEC_TRACE}: the benchmark's command and its stream in one trace), so a
 * latency table comes with where the time went. Pure apart from reading the file.
 */
import { readFileSync, statSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { TRACE_FILE_FLUSH_MS, type TraceFileSpan } from '../runtime/core/tracing.ts';
import { markdownTable } from './report.ts';
import { fmt, percentile } from './stats.ts';

/** The kind given to a command's trace (one holding `agent.commands.start` and no create). */
export const EXEC_TRACE = 'exec';

/** One hop's durations (ms) over the traces of one kind. */
export interface BudgetRow {
  /** Kind of trace the span belongs to: a create's (`warm`, `snapshot`, `boot`) or {@link EXEC_TRACE}. */
  source: string;
  /** Span name (e.g. `agent.guest.init`). */
  span: string;
  n: number;
  p50Ms: number;
  p90Ms: number;
}

/**
 * Waits until trace file `path` has not grown for three of the services' flush periods
 * ({@link TRACE_FILE_FLUSH_MS}), at most `maxMs` (ms): spans are appended in batches, after the
 * requests they describe answered.
 */
export async function settledTraceFile(path: string, maxMs = 5000): Promise<void> {
  const size = () => {
    try {
      return statSync(path).size;
    } catch {
      return -1;
    }
  };
  const until = Date.now() + maxMs;
  let last = size();
  let stableSince = Date.now();
  while (Date.now() < until && Date.now() - stableSince < 3 * TRACE_FILE_FLUSH_MS) {
    await sleep(TRACE_FILE_FLUSH_MS / 2);
    const now = size();
    if (now !== last) {
      last = now;
      stableSince = Date.now();
    }
  }
}

/** Reads a trace file (JSON lines); lines that do not parse are skipped. */
export function readSpans(path: string): TraceFileSpan[] {
  const out: TraceFileSpan[] = [];
  for (const line of readFileSync(path, 'utf8').split('\n')) {
    if (!line.trim()) continue;
    try {
      out.push(JSON.parse(line) as TraceFileSpan);
    } catch {
      // a line cut by a process that stopped mid-write
    }
  }
  return out;
}

/**
 * Groups the spans of every create trace (a trace holding an `agent.sandboxes.create` span with a
 * `space.instance.source`) by kind and span name, and those of every command trace (one holding
 * `agent.commands.start`, and no create) as {@link EXEC_TRACE}; spans of other traces (warm-pool
 * refills, deletes) are left out. Rows are sorted by kind, then by p50 descending.
 */
export function spanBudget(spans: readonly TraceFileSpan[]): BudgetRow[] {
  const sourceOf = new Map<string, string>();
  for (const s of spans) {
    const src = s.attributes['space.instance.source'];
    if (s.name === 'agent.sandboxes.create' && typeof src === 'string') sourceOf.set(s.traceId, src);
  }
  for (const s of spans) {
    if (s.name === 'agent.commands.start' && !sourceOf.has(s.traceId)) sourceOf.set(s.traceId, EXEC_TRACE);
  }
  const groups = new Map<string, { source: string; span: string; ms: number[] }>();
  for (const s of spans) {
    const source = sourceOf.get(s.traceId);
    if (!source) continue;
    const key = `${source}\u0000${s.name}`;
    const g = groups.get(key) ?? { source, span: s.name, ms: [] };
    g.ms.push(s.durationMs);
    groups.set(key, g);
  }
  return [...groups.values()]
    .map((g) => ({
      source: g.source,
      span: g.span,
      n: g.ms.length,
      p50Ms: percentile(g.ms, 50),
      p90Ms: percentile(g.ms, 90),
    }))
    .sort((a, b) => a.source.localeCompare(b.source) || b.p50Ms - a.p50Ms);
}

/** The budget as a Markdown table (ms with one decimal). */
export function budgetTable(rows: readonly BudgetRow[]): string {
  return markdownTable(
    ['trace', 'span', 'n', 'p50 ms', 'p90 ms'],
    rows.map((r) => [r.source, r.span, String(r.n), fmt(r.p50Ms, 1), fmt(r.p90Ms, 1)]),
    [false, false, true, true, true],
  );
}
