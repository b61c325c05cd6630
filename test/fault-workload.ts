/**
 * The client side of the fault suite: what a user of SPACE would have running when a part of it
 * fails, and what that user saw. Each piece keeps going across the fault, never throws on a failed
 * call, and records what it got (HTTP statuses and error codes, operation states), so a case can
 * assert afterwards that nothing was lost and quote what clients saw:
 *
 * - {@link watchOperation}: every state an operation shows, polled through the API;
 * - {@link LineStream}: a command printing numbered lines, read over SSE and resumed with
 *   `Last-Event-ID` after every drop — afterwards no line may be missing or repeated;
 * - {@link Churn}: a create → delete loop; every operation it started must end, once;
 * - {@link ExecProbe}: a short command every 500 ms; gives the recovery time (first success after
 *   the fault).
 */
import { createParser } from 'eventsource-parser';
import { request } from 'undici';
import type { FaultStack } from './fault-stack.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** What one client call got: an HTTP status and the error code, or a transport error (`status` 0). */
export interface Seen {
  /** HTTP status; 0 when no answer came (connection refused or reset, timeout). */
  status: number;
  /** The error body's `code`, the transport error's code (`ECONNREFUSED`), or null on success. */
  code: string | null;
}

/** Calls the stack's API without ever throwing: a refused connection is `{ status: 0 }`. */
export async function tryCall<T = Record<string, unknown>>(
  s: FaultStack,
  method: string,
  path: string,
  body?: unknown,
  timeoutMs = 10_000,
): Promise<Seen & { body: T | null }> {
  try {
    const res = await request(new URL(path, s.apiUrl), {
      method: method as 'GET',
      headers: {
        authorization: `Bearer ${s.apiKey}`,
        ...(body === undefined ? {} : { 'content-type': 'application/json' }),
      },
      body: body === undefined ? undefined : JSON.stringify(body),
      headersTimeout: timeoutMs,
      bodyTimeout: timeoutMs,
    });
    const text = await res.body.text();
    let parsed: unknown = null;
    try {
      parsed = text ? JSON.parse(text) : {};
    } catch {
      parsed = null;
    }
    const code =
      res.statusCode >= 400 ? ((parsed as { error?: { code?: string } })?.error?.code ?? null) : null;
    return { status: res.statusCode, code, body: parsed as T };
  } catch (err) {
    const code = (err as { code?: string }).code ?? (err as Error).name;
    return { status: 0, code, body: null };
  }
}

/** Counts each distinct `status code` a client saw, e.g. `{ "503 CONTROL_PLANE_UNAVAILABLE": 4 }`. */
export function tally(seen: readonly Seen[]): Record<string, number> {
  const out: Record<string, number> = {};
  for (const x of seen) {
    if (x.status >= 200 && x.status < 300) continue;
    const k = `${x.status} ${x.code ?? ''}`.trim();
    out[k] = (out[k] ?? 0) + 1;
  }
  return out;
}

/** What {@link watchOperation} saw. */
export interface OperationWatch {
  /** The distinct states in the order they were shown (`pending`, `running`, `succeeded`). */
  states: string[];
  /** The final operation's error code, if it failed. */
  errorCode: string | null;
  /** When a poll first showed it ended (epoch ms), or null. */
  endedAt: number | null;
  /** Every failed poll (what a client polling the operation got during the fault). */
  refused: Seen[];
  /** Resolves when the operation ended (and then `extraMs` more of watching, to catch a flip). */
  done: Promise<void>;
  /** Stops watching. */
  stop(): void;
}

/**
 * Polls operation `opId` every 100 ms until it ended and `extraMs` (default 3 s) more, recording
 * every state shown and every failed poll. Never throws; gives up after `timeoutMs` (default 120 s).
 */
export function watchOperation(
  s: FaultStack,
  opId: string,
  opts: { extraMs?: number; timeoutMs?: number } = {},
): OperationWatch {
  const w: OperationWatch = {
    states: [],
    errorCode: null,
    endedAt: null,
    refused: [],
    done: Promise.resolve(),
    stop: () => {
      stopped = true;
    },
  };
  let stopped = false;
  w.done = (async () => {
    const until = Date.now() + (opts.timeoutMs ?? 120_000);
    while (!stopped && Date.now() < until) {
      const res = await tryCall<{ state: string; error: { code: string } | null }>(
        s,
        'GET',
        `/v1/operations/${opId}`,
        undefined,
        3000,
      );
      if (res.status === 200 && res.body) {
        if (w.states.at(-1) !== res.body.state) w.states.push(res.body.state);
        if (res.body.state === 'succeeded' || res.body.state === 'failed') {
          w.errorCode = res.body.error?.code ?? null;
          w.endedAt ??= Date.now();
          if (Date.now() - w.endedAt >= (opts.extraMs ?? 3000)) return;
        }
      } else w.refused.push(res);
      await sleep(100);
    }
  })();
  return w;
}

/** The terminal states among `states` (an operation that ended once shows exactly one). */
export function terminal(states: readonly string[]): string[] {
  return states.filter((x) => x === 'succeeded' || x === 'failed');
}
