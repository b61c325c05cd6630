/**
 * Tracing: OpenTelemetry spans for the hops of create and exec (API request, Redis scripts, the
 * operation worker, the agent's claim or boot, network setup, guest init, egress registration,
 * stream open), so the latency budget can be seen rather than guessed.
 *
 * Spans are exported only when configured, by OpenTelemetry's own variables
 * (`OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`: OTLP over HTTP, per the
 * OpenTelemetry specification's exporter environment variables) and/or by `SPACE_TRACE_FILE` (one
 * finished span per line as JSON, see {@link TraceFileSpan}: what the benchmarks summarise).
 * Unconfigured, the OpenTelemetry API's no-op tracer is used and a span costs a function call.
 *
 * Context crosses processes in W3C `traceparent` headers ({@link injectTraceHeaders},
 * {@link traceContextFrom}); an operation carries its request's `traceparent` in its arguments, so
 * the worker's spans join the trace of the request that queued it.
 */
import { type FileHandle, open } from 'node:fs/promises';
import {
  type Attributes,
  type Context,
  context,
  propagation,
  ROOT_CONTEXT,
  type Span,
  SpanStatusCode,
  TraceFlags,
  trace,
} from '@opentelemetry/api';
import { type ExportResult, ExportResultCode } from '@opentelemetry/core';
import { OTLPTraceExporter } from '@opentelemetry/exporter-trace-otlp-http';
import { resourceFromAttributes } from '@opentelemetry/resources';
import {
  BatchSpanProcessor,
  type ReadableSpan,
  type SpanExporter,
  type SpanProcessor,
} from '@opentelemetry/sdk-trace-base';
import { NodeTracerProvider } from '@opentelemetry/sdk-trace-node';

/** The tracer every SPACE component uses (no-op until {@link startTracing} registers a provider). */
export const tracer = trace.getTracer('space');

/** How often finished spans are appended to `SPACE_TRACE_FILE`, ms. */
export const TRACE_FILE_FLUSH_MS = 100;

/** One line of a `SPACE_TRACE_FILE`. Times in ms since the Unix epoch; duration in ms. */
export interface TraceFileSpan {
  name: string;
  /** `service.name` of the process that made the span (`space-api`, `space-agent`, …). */
  service: string;
  traceId: string;
  spanId: string;
  /** Parent span id; absent for a trace's root. */
  parentId?: string;
  startMs: number;
  durationMs: number;
  /** `ok`, or `error` with the exception's message in `error`. */
  status: 'ok' | 'error';
  error?: string;
  attributes: Attributes;
}

const hrMs = (t: [number, number]) => t[0] * 1000 + t[1] / 1e6;

/**
 * Writes finished spans to a file as JSON lines ({@link TraceFileSpan}); appends, never truncates.
 * The file is opened once (O_APPEND) and held until shutdown: opening it per batch cost the API
 * ~0.3 s of its event loop over one 32-way latency wave (CPU profile of the API).
 */
class TraceFileExporter implements SpanExporter {
  readonly path: string;
  readonly service: string;
  #file: Promise<FileHandle> | null = null;
  /** Batches are written in order, one at a time. */
  #writing: Promise<unknown> = Promise.resolve();
  constructor(path: string, service: string) {
    this.path = path;
    this.service = service;
  }

  export(spans: ReadableSpan[], done: (r: ExportResult) => void): void {
    try {
      const lines = spans.map((s) => {
        const line: TraceFileSpan = {
          name: s.name,
          service: this.service,
          traceId: s.spanContext().traceId,
          spanId: s.spanContext().spanId,
          parentId: s.parentSpanContext?.spanId,
          startMs: hrMs(s.startTime),
          durationMs: hrMs(s.duration),
          status: s.status.code === SpanStatusCode.ERROR ? 'error' : 'ok',
          ...(s.status.message ? { error: s.status.message } : {}),
          attributes: s.attributes,
        };
        return `${JSON.stringify(line)}\n`;
      });
      const text = lines.join('');
      if (!this.#file) {
        this.#file = open(this.path, 'a');
        // seen by the write below, perhaps only after an earlier write: never an unhandled rejection
        this.#file.catch(() => {});
      }
      const file = this.#file;
      this.#writing = this.#writing.then(async () => {
        try {
          await (await file).appendFile(text);
          done({ code: ExportResultCode.SUCCESS });
        } catch (err) {
          // a file that could not be opened is tried again with the next batch
          if (this.#file === file) this.#file = null;
          done({ code: ExportResultCode.FAILED, error: err as Error });
        }
      });
    } catch (err) {
      done({ code: ExportResultCode.FAILED, error: err as Error });
    }
  }

  async shutdown(): Promise<void> {
    await this.#writing;
    const file = this.#file;
    this.#file = null;
    await file?.then((f) => f.close()).catch(() => {});
  }
}

/** A registered tracer provider; `shutdown` flushes what is still buffered. */
export interface Tracing {
  /** Where spans go: `otlp`, `file:<path>`. */
  exporters: string[];
  shutdown(): Promise<void>;
}

/**
 * Registers a tracer provider for this process when tracing is configured (see the module's
 * docstring); returns null, registering nothing, when it is not. Call once per process, first.
 * @param service `service.name` of the spans (e.g. `space-api`).
 */
export function startTracing(service: string, env: NodeJS.ProcessEnv = process.env): Tracing | null {
  const processors: SpanProcessor[] = [];
  const exporters: string[] = [];
  if (env.OTEL_EXPORTER_OTLP_ENDPOINT || env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) {
    processors.push(new BatchSpanProcessor(new OTLPTraceExporter()));
    exporters.push('otlp');
  }
  if (env.SPACE_TRACE_FILE) {
    // batched, written off the request path every TRACE_FILE_FLUSH_MS: one synchronous append per
    // span cost a measured create ~3 ms (the latency benchmark runs with this file on); a reader
    // waits for the file to settle (benchmarks/suite.ts)
    processors.push(
      new BatchSpanProcessor(new TraceFileExporter(env.SPACE_TRACE_FILE, service), {
        scheduledDelayMillis: TRACE_FILE_FLUSH_MS,
        maxQueueSize: 65_536,
        maxExportBatchSize: 1024,
      }),
    );
    exporters.push(`file:${env.SPACE_TRACE_FILE}`);
  }
  if (!processors.length) return null;
  const provider = new NodeTracerProvider({
    resource: resourceFromAttributes({ 'service.name': service }),
    spanProcessors: processors,
  });
  provider.register();
  return { exporters, shutdown: () => provider.shutdown() };
}

/** Where {@link spanClockMs} last tied the monotonic clock to the wall clock (ms, ms). */
let clockAnchor = { wallMs: Date.now(), perfMs: performance.now() };

/**
 * The wall-clock time (ms since the epoch, with sub-ms digits) of `perfMs`, a `performance.now()`
 * value (default: now). OpenTelemetry starts a span at `Date.now()`, whole milliseconds, so
 * sibling spans a fraction of a millisecond apart read as overlapping by up to 1 ms and a budget's
 * sub-ms gaps are unreadable; this clock counts on from one wall-clock reading with the monotonic
 * clock, and reads the wall clock again once the two have drifted more than 1 ms apart (NTP), so
 * spans of different processes still line up to the millisecond.
 */
export function spanClockMs(perfMs?: number): number {
  const now = performance.now();
  const wall = Date.now();
  // Date.now() is the wall clock floored, so a reading counted on from it stays within
  // (wall - 1, wall + 2) until the clocks drift apart
  const counted = clockAnchor.wallMs + (now - clockAnchor.perfMs);
  if (!(counted > wall - 1 && counted < wall + 2)) clockAnchor = { wallMs: wall, perfMs: now };
  return clockAnchor.wallMs + ((perfMs ?? now) - clockAnchor.perfMs);
}

/**
 * Runs `fn` inside a new span named `name` (a child of the active span, or of `parent`), ends it when
 * `fn` settles, and marks it failed (with the error's `code` as `error.code`) when `fn` throws.
 * Returns or rethrows what `fn` did.
 */
export async function inSpan<T>(
  name: string,
  attributes: Attributes,
  fn: (span: Span) => Promise<T>,
  parent?: Context,
): Promise<T> {
  const startTime = spanClockMs();
  return tracer.startActiveSpan(name, { attributes, startTime }, parent ?? context.active(), async (span) => {
    try {
      return await fn(span);
    } catch (err) {
      const e = err as { message?: string; code?: unknown };
      span.setStatus({ code: SpanStatusCode.ERROR, message: e?.message });
      if (typeof e?.code === 'string') span.setAttribute('error.code', e.code);
      throw err;
    } finally {
      span.end(spanClockMs());
    }
  });
}

/**
 * Runs `fn` inside a span named `name` only when a recorded span is active (or `parent` holds
 * one); otherwise just runs it. For steps (a Redis script) that timers and sweeps also take: those
 * start no traces of their own, and an unsampled request's steps record nothing.
 */
export async function inChildSpan<T>(
  name: string,
  attributes: Attributes,
  fn: () => Promise<T>,
  parent: Context = context.active(),
): Promise<T> {
  return sampled(parent) ? inSpan(name, attributes, fn, parent) : fn();
}

/** Whether `parent` holds a span (local or remote) of a sampled trace. */
function sampled(parent: Context): boolean {
  return ((trace.getSpanContext(parent)?.traceFlags ?? TraceFlags.NONE) & TraceFlags.SAMPLED) !== 0;
}

/**
 * Records a span for a step that already ran: from `startMs` to `endMs` (`performance.now()`
 * values, ms), a child of `parent`. Nothing is recorded outside a sampled parent, as with
 * {@link inChildSpan}. For a step that runs before its trace context is known (an operation's
 * start script returns the context the operation was queued with).
 */
export function recordSpan(
  name: string,
  attributes: Attributes,
  startMs: number,
  endMs: number,
  parent: Context,
): void {
  if (!sampled(parent)) return;
  tracer.startSpan(name, { attributes, startTime: spanClockMs(startMs) }, parent).end(spanClockMs(endMs));
}

/** Adds the active span's W3C trace headers (`traceparent`, `tracestate`) to `headers`; returns it. */
export function injectTraceHeaders<H extends Record<string, string | string[]>>(headers: H): H {
  propagation.inject(context.active(), headers);
  return headers;
}

/** The trace context carried by incoming headers (or a `{ traceparent }` record), for {@link inSpan}. */
export function traceContextFrom(carrier: Record<string, unknown>): Context {
  return propagation.extract(context.active(), carrier, {
    get: (c, k) => {
      const v = (c as Record<string, unknown>)[k];
      return typeof v === 'string' || Array.isArray(v) ? (v as string | string[]) : undefined;
    },
    keys: (c) => Object.keys(c as object),
  });
}

/** The active span's `traceparent` (to store with queued work), or undefined outside a sampled trace. */
export function currentTraceparent(): string | undefined {
  const h: Record<string, string> = {};
  propagation.inject(context.active(), h);
  return h.traceparent;
}

/**
 * Runs `fn` outside any trace: background work a request sets off (a warm-pool refill after a
 * claim) must not be counted in that request's trace.
 */
export function untraced<T>(fn: () => T): T {
  return context.with(ROOT_CONTEXT, fn);
}
