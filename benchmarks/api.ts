/**
 * The HTTP side every API benchmark shares: JSON calls with the API key, waiting for an operation,
 * and timing an SSE command stream. Uses undici and eventsource-parser, as clients would.
 */
import { randomBytes } from 'node:crypto';
import { createParser } from 'eventsource-parser';
import { request } from 'undici';

/**
 * An API answer with HTTP status ≥ 400 (`status`); the message carries the body. `code` is the
 * error envelope's code (null when the body had none); `retryAfterSec` the `Retry-After` header's
 * seconds (null when absent): a refusal the API gave before acting, to be asked again then (no room
 * for a create: 503 NODE_CAPACITY_EXHAUSTED).
 */
export class ApiStatusError extends Error {
  readonly status: number;
  readonly code: string | null;
  readonly retryAfterSec: number | null;
  constructor(
    status: number,
    message: string,
    code: string | null = null,
    retryAfterSec: number | null = null,
  ) {
    super(message);
    this.name = 'ApiStatusError';
    this.status = status;
    this.code = code;
    this.retryAfterSec = retryAfterSec;
  }
}

/** The error of an API answer ≥ 400: refusals with `Retry-After` say so first. Pure. */
export function apiStatusError(
  method: string,
  path: string,
  status: number,
  text: string,
  retryAfter: string | string[] | undefined,
): ApiStatusError {
  let code: string | null = null;
  try {
    code = (JSON.parse(text) as { error?: { code?: string } }).error?.code ?? null;
  } catch {
    code = null;
  }
  const after = typeof retryAfter === 'string' && /^\d+$/.test(retryAfter) ? Number(retryAfter) : null;
  const what =
    after === null
      ? `${status} ${text}`
      : `refused at once, ${status} ${code ?? ''} (Retry-After ${after} s): ${text}`;
  return new ApiStatusError(status, `${method} ${path}: ${what}`, code, after);
}

/**
 * A new W3C Trace Context `traceparent` (version 00, random trace and parent ids) with the sampled
 * flag set: the requests that carry it are recorded as one trace by a stack that traces.
 */
export function sampledTraceparent(): string {
  return `00-${randomBytes(16).toString('hex')}-${randomBytes(8).toString('hex')}-01`;
}

/** A benchmark's view of one SPACE endpoint. */
export interface BenchClient {
  /** Calls the API (with extra `headers`); throws with the status and body on HTTP ≥ 400. */
  api<T>(method: string, path: string, body?: unknown, headers?: Record<string, string>): Promise<T>;
  /**
   * Waits (at most `timeoutMs`, default 180 000) until an alive node has `template` ready — a stack
   * that was just started registers its node a few seconds after its API answers. What waiting
   * cannot fix ends the wait at once: the API refusing the key (401/403), or an API that has not
   * answered at all for `unreachableMs` (default 15 000).
   * @throws Error naming what is missing (the key, the API, or a ready node).
   */
  waitReady(template: string, timeoutMs?: number, unreachableMs?: number): Promise<void>;
  /** Long-polls operation `id` until it succeeded; throws when it failed or did not finish. */
  waitOp(id: string): Promise<void>;
  /**
   * Reads an SSE command stream (sent with extra `headers`) to its end; returns ms from `t0` (a
   * `performance.now()` value) to its first stdout event and to its exit event (NaN when absent),
   * and the stdout bytes it carried (decoded from the events' base64).
   */
  streamTimes(
    url: string,
    token: string,
    t0: number,
    headers?: Record<string, string>,
  ): Promise<{ first: number; exit: number; stdoutBytes: number }>;
  /**
   * Runs `echo <word>` in sandbox `id`; returns ms from the command's POST to its first stdout
   * event (NaN when there was none). The POST and the stream carry one sampled `traceparent`
   * ({@link sampledTraceparent}), so a tracing stack records the command's hops as one trace.
   * Throws as {@link BenchClient.api} does.
   */
  firstOutput(id: string, word?: string): Promise<number>;
}

/** A client for the API at `apiUrl` with `apiKey`. */
export function benchClient(ep: { apiUrl: string; apiKey: string }): BenchClient {
  async function api<T>(
    method: string,
    path: string,
    body?: unknown,
    headers: Record<string, string> = {},
  ): Promise<T> {
    const res = await request(`${ep.apiUrl}${path}`, {
      method: method as 'GET',
      headers: {
        ...headers,
        authorization: `Bearer ${ep.apiKey}`,
        ...(body ? { 'content-type': 'application/json' } : {}),
      },
      body: body ? JSON.stringify(body) : undefined,
    });
    const text = await res.body.text();
    if (res.statusCode >= 400)
      throw apiStatusError(method, path, res.statusCode, text, res.headers['retry-after']);
    return (text ? JSON.parse(text) : {}) as T;
  }
  const client: BenchClient = {
    api,
    async waitReady(template, timeoutMs = 180_000, unreachableMs = 15_000) {
      const until = Date.now() + timeoutMs;
      let answeredAt = Date.now();
      for (;;) {
        const { nodes } = await api<{ nodes: { alive: boolean; templates: string[] }[] }>('GET', '/v1/nodes')
          .then((r) => {
            answeredAt = Date.now();
            return r;
          })
          .catch((err: unknown) => {
            if (err instanceof ApiStatusError && (err.status === 401 || err.status === 403)) {
              throw new Error(`the API at ${ep.apiUrl} refused the API key (${err.status}): check --api-key`);
            }
            if (!(err instanceof ApiStatusError) && Date.now() - answeredAt > unreachableMs) {
              throw new Error(
                `the API at ${ep.apiUrl} did not answer for ${unreachableMs} ms: ${(err as Error).message}`,
              );
            }
            if (err instanceof ApiStatusError) answeredAt = Date.now(); // it answered, if not yet ready
            return { nodes: [] };
          });
        if (nodes.some((n) => n.alive && n.templates.includes(template))) return;
        if (Date.now() > until)
          throw new Error(`no alive node has template "${template}" after ${timeoutMs} ms`);
        await new Promise((r) => setTimeout(r, 500));
      }
    },
    async waitOp(id) {
      for (let i = 0; i < 60; i++) {
        const op = await api<{ state: string; error: unknown }>('GET', `/v1/operations/${id}?waitMs=10000`);
        if (op.state === 'succeeded') return;
        if (op.state === 'failed') throw new Error(`operation ${id} failed: ${JSON.stringify(op.error)}`);
      }
      throw new Error(`operation ${id} did not finish`);
    },
    async streamTimes(url, token, t0, headers = {}) {
      const res = await request(url, { headers: { ...headers, authorization: `Bearer ${token}` } });
      let first = Number.NaN;
      let exit = Number.NaN;
      let stdoutBytes = 0;
      const parser = createParser({
        onEvent: (e) => {
          if (e.event === 'stdout') {
            if (Number.isNaN(first)) first = performance.now() - t0;
            stdoutBytes += Buffer.byteLength((JSON.parse(e.data) as { data: string }).data, 'base64');
          }
          if (e.event === 'exit') exit = performance.now() - t0;
        },
      });
      const dec = new TextDecoder();
      for await (const chunk of res.body) parser.feed(dec.decode(chunk as Buffer, { stream: true }));
      return { first, exit, stdoutBytes };
    },
    async firstOutput(id, word = 'ready') {
      const trace = { traceparent: sampledTraceparent() };
      const t0 = performance.now();
      const cmd = await api<{ stream: { url: string; token: string } }>(
        'POST',
        `/v1/sandboxes/${id}/commands`,
        { cmd: 'echo', args: [word] },
        trace,
      );
      return (await client.streamTimes(cmd.stream.url, cmd.stream.token, t0, trace)).first;
    },
  };
  return client;
}
