/**
 * Reads a command's event stream (SSE) from the data plane with eventsource-parser, resuming a
 * dropped connection with `Last-Event-ID` so nothing is lost or repeated. The stream ends after the
 * `exit` event (always last); a connection that ends before it is resumed for as long as the
 * failures in a row last less than `retryForMs` (a router or agent restart, an upgrade roll).
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { createParser, type EventSourceMessage } from 'eventsource-parser';
import { type Dispatcher, request } from 'undici';
import { errorFromResponse, networkError } from './client.ts';
import { DEFAULT_RETRY_FOR_SEC } from './context.ts';
import { CliError } from './output.ts';

export interface SseEvent {
  event: string;
  data: string;
  id: string | undefined;
}

export interface ReadEventsOptions {
  /** Full events URL (`…/commands/:cmd/events`). */
  url: string;
  /** Session token. */
  token: string;
  /** Resume after this event id (default: from the start). */
  lastEventId?: string;
  /**
   * How long failed (re)connections in a row may go on before it gives up, ms (default the CLI's
   * `--retry-for` default); any event received starts the count again.
   */
  retryForMs?: number;
  /** First retry delay, ms, doubled each time up to 5 s (default 250). */
  retryDelayMs?: number;
  /** A connection idle this long is treated as dropped, ms (the server sends keepalives every 15 s). */
  idleTimeoutMs?: number;
  /** Called before each reconnection (for a note on stderr). */
  onReconnect?: (info: { attempt: number; lastEventId: string | undefined; reason: string }) => void;
  /**
   * Called with the first event after failed reconnections: `attempts` in that run of failures,
   * `afterMs` since its first failure.
   */
  onResumed?: (info: { attempts: number; afterMs: number }) => void;
  signal?: AbortSignal;
  dispatcher?: Dispatcher;
}

/** Codes worth a reconnection: the node was briefly unreachable or busy. */
function retryable(err: CliError): boolean {
  return [
    'UNREACHABLE',
    'RATE_LIMITED',
    'NODE_UNAVAILABLE',
    'INTERNAL',
    'BAD_RESPONSE',
    'STREAM_DROPPED',
  ].includes(err.code);
}

/**
 * Yields the stream's events in order, exactly once each, ending after `exit`.
 * @throws CliError with the server's code (TOKEN_EXPIRED, COMMAND_NOT_FOUND, …), or
 *   STREAM_DROPPED / UNREACHABLE once failed reconnections in a row have lasted `retryForMs`.
 */
export async function* readEvents(opts: ReadEventsOptions): AsyncGenerator<SseEvent> {
  const retryForMs = opts.retryForMs ?? DEFAULT_RETRY_FOR_SEC * 1000;
  let lastId = opts.lastEventId;
  let failures = 0;
  /** When the current run of failures began (epoch ms). */
  let failingSince = 0;
  for (;;) {
    const queue: SseEvent[] = [];
    const parser = createParser({
      onEvent: (m: EventSourceMessage) => queue.push({ event: m.event ?? 'message', data: m.data, id: m.id }),
    });
    let failure: CliError;
    try {
      const res = await request(opts.url, {
        method: 'GET',
        headers: {
          authorization: `Bearer ${opts.token}`,
          accept: 'text/event-stream',
          ...(lastId !== undefined ? { 'last-event-id': lastId } : {}),
        },
        signal: opts.signal,
        bodyTimeout: opts.idleTimeoutMs ?? 60_000,
        dispatcher: opts.dispatcher,
      });
      if (res.statusCode !== 200) throw await errorFromResponse(res.statusCode, res.body);
      const decoder = new TextDecoder();
      try {
        for await (const chunk of res.body) {
          parser.feed(decoder.decode(chunk as Buffer, { stream: true }));
          while (queue.length) {
            const ev = queue.shift()!;
            if (ev.id !== undefined) lastId = ev.id;
            if (failures > 0) opts.onResumed?.({ attempts: failures, afterMs: Date.now() - failingSince });
            failures = 0; // progress: the retry budget is for failures in a row
            yield ev;
            if (ev.event === 'exit') return;
          }
        }
      } finally {
        res.body.destroy(); // also when the consumer stops early
      }
      failure = new CliError('STREAM_DROPPED', 'the event stream ended before the command’s exit event');
    } catch (err) {
      if (opts.signal?.aborted) throw new CliError('ABORTED', 'stream aborted', { cause: err });
      failure = err instanceof CliError ? err : networkError(opts.url, err);
    }
    if (failures === 0) failingSince = Date.now();
    const failingMs = Date.now() - failingSince;
    if (!retryable(failure)) throw failure;
    if (failingMs >= retryForMs)
      throw new CliError(
        failure.code,
        `${failure.message} (gave up after ${failures + 1} attempts over ${(failingMs / 1000).toFixed(1)} s)`,
        { details: { ...(failure.details ?? {}), lastEventId: lastId ?? null } },
      );
    failures++;
    opts.onReconnect?.({ attempt: failures, lastEventId: lastId, reason: failure.message });
    await sleep(Math.min(5000, (opts.retryDelayMs ?? 250) * 2 ** (failures - 1)), undefined, {
      signal: opts.signal,
    }).catch(() => {});
    if (opts.signal?.aborted) throw new CliError('ABORTED', 'stream aborted');
  }
}

/**
 * Stderr notes for {@link readEvents} that stay short through a long outage (a router restart
 * can take minutes of attempts): one note when the stream drops, one per new reason while it is
 * away, one when it resumes (with how long it was away). Spread into `readEvents`' options.
 */
export function outageNotes(
  note: (line: string) => void,
  retryForMs: number,
): Pick<ReadEventsOptions, 'onReconnect' | 'onResumed'> {
  const reasons = new Set<string>();
  return {
    onReconnect: ({ attempt, reason }) => {
      if (attempt === 1) {
        reasons.clear();
        note(
          `space: event stream dropped (${reason}); resuming for up to ${Math.round(retryForMs / 1000)} s`,
        );
      } else if (!reasons.has(reason)) {
        note(`space: event stream still away (${reason}); resuming`);
      }
      reasons.add(reason);
    },
    onResumed: ({ attempts, afterMs }) =>
      note(`space: event stream resumed after ${(afterMs / 1000).toFixed(1)} s (${attempts} attempts)`),
  };
}

/** Bytes of a `stdout` / `stderr` event (`{"data":"<base64>"}`). */
export function outputBytes(ev: SseEvent): Buffer {
  const parsed = JSON.parse(ev.data) as { data?: unknown };
  if (typeof parsed.data !== 'string') throw new CliError('BAD_RESPONSE', `malformed ${ev.event} event`);
  return Buffer.from(parsed.data, 'base64');
}
