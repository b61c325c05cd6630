/**
 * HTTP clients of the CLI (undici): the control-plane API (API key) and a sandbox's data plane
 * (session token). Every failure becomes a CliError with the server's stable code, or
 * `UNREACHABLE` / `BAD_RESPONSE` when there is no SPACE answer at all.
 */
import type { Readable } from 'node:stream';
import type { Static } from '@sinclair/typebox';
import { type Dispatcher, request } from 'undici';
import type {
  SandboxUsageSchema,
  StreamGrant as StreamGrantSchema,
  UsageFigures as UsageFiguresSchema,
  UsageReportSchema,
} from '../core/api-schemas.ts';
import type { Operation, Sandbox } from '../core/types.ts';
import type { Endpoint } from './local.ts';
import { CliError } from './output.ts';

export type Method = 'GET' | 'POST' | 'PUT' | 'DELETE';

export interface CallOptions {
  /** JSON body (objects) or a raw stream/buffer (sent as application/octet-stream). */
  body?: unknown;
  query?: Record<string, string | number | boolean | undefined>;
  headers?: Record<string, string>;
  signal?: AbortSignal;
  /** undici body timeout, ms (default 5 min; long-polls need more than their wait). */
  bodyTimeoutMs?: number;
}

/** A coded error from a non-2xx answer (`{ error: { code, message, details? } }`). */
export async function errorFromResponse(
  statusCode: number,
  body: Dispatcher.ResponseData['body'],
): Promise<CliError> {
  const text = await body.text().catch(() => '');
  try {
    const e = (JSON.parse(text) as { error?: { code?: unknown; message?: unknown; details?: unknown } })
      .error;
    if (e && typeof e.code === 'string' && typeof e.message === 'string') {
      return new CliError(e.code, e.message, {
        details:
          e.details && typeof e.details === 'object' ? (e.details as Record<string, unknown>) : undefined,
      });
    }
  } catch {
    // not JSON: fall through
  }
  return new CliError('BAD_RESPONSE', `HTTP ${statusCode}${text ? `: ${text.slice(0, 200)}` : ''}`, {
    details: { status: statusCode },
  });
}

/** A network-level failure (refused, reset, DNS) as a CliError. */
export function networkError(url: string, err: unknown, hint?: string): CliError {
  if (err instanceof CliError) return err;
  const e = err as { code?: string; message?: string; name?: string; cause?: { code?: string } };
  if (e?.name === 'AbortError') return new CliError('ABORTED', 'request aborted', { cause: err });
  const code = e?.code ?? e?.cause?.code ?? e?.name ?? 'ERROR';
  const origin = safeOrigin(url);
  return new CliError(
    'UNREACHABLE',
    `cannot reach ${origin}: ${code}${e?.message ? ` (${e.message})` : ''}`,
    {
      details: { url: origin, cause: code },
      hint,
      cause: err,
    },
  );
}

function safeOrigin(url: string): string {
  try {
    const u = new URL(url);
    return `${u.origin}${u.pathname}`;
  } catch {
    return url;
  }
}

function isRawBody(b: unknown): b is Buffer | Readable {
  return (
    Buffer.isBuffer(b) || (typeof b === 'object' && b !== null && typeof (b as Readable).pipe === 'function')
  );
}

/** One HTTP call; returns the raw undici response when 2xx, throws a CliError otherwise. */
export async function call(
  method: Method,
  url: string,
  token: string,
  opts: CallOptions & { hint?: string } = {},
): Promise<Dispatcher.ResponseData> {
  const u = new URL(url);
  for (const [k, v] of Object.entries(opts.query ?? {}))
    if (v !== undefined) u.searchParams.set(k, String(v));
  const headers: Record<string, string> = { authorization: `Bearer ${token}`, ...(opts.headers ?? {}) };
  let body: string | Buffer | Readable | undefined;
  if (opts.body !== undefined) {
    if (isRawBody(opts.body)) {
      body = opts.body;
      headers['content-type'] ??= 'application/octet-stream';
    } else {
      body = JSON.stringify(opts.body);
      headers['content-type'] = 'application/json';
    }
  }
  let res: Dispatcher.ResponseData;
  try {
    res = await request(u, {
      method,
      headers,
      body,
      signal: opts.signal,
      bodyTimeout: opts.bodyTimeoutMs ?? 300_000,
    });
  } catch (err) {
    throw networkError(u.toString(), err, opts.hint);
  }
  if (res.statusCode >= 200 && res.statusCode < 300) return res;
  throw await errorFromResponse(res.statusCode, res.body);
}

/** Reads a 2xx body as JSON (an empty body is `undefined`). */
export async function readJson<T>(res: Dispatcher.ResponseData): Promise<T> {
  const text = await res.body.text();
  if (!text) return undefined as T;
  try {
    return JSON.parse(text) as T;
  } catch {
    throw new CliError('BAD_RESPONSE', `expected JSON, got: ${text.slice(0, 200)}`);
  }
}

/**
 * Retryable refusals the API answers before it acted on the request (runtime/core/errors.ts): the
 * same request may pass later, and sending it again does nothing twice, whatever its method.
 */
const REFUSED_BEFORE_ACTING: ReadonlySet<string> = new Set([
  'TEMPLATE_NOT_READY',
  'NODE_CAPACITY_EXHAUSTED',
  'RATE_LIMITED',
  'SANDBOX_BUSY',
]);

/**
 * Retryable answers a request that is safe to repeat (GET, PUT, DELETE, or a call the caller marks
 * `repeatable`, such as a create) also waits out: the API may have been cut off from a node or
 * from Redis midway, which repeating a `POST` could act on twice.
 */
const WAITABLE_WHEN_REPEATABLE: ReadonlySet<string> = new Set([
  ...REFUSED_BEFORE_ACTING,
  'NODE_UNAVAILABLE',
  'CONTROL_PLANE_UNAVAILABLE',
  // `space up --ha`: the front had no member ready, or the member died with the request; the
  // change was made on the primary but no replica acknowledged it. Either may have acted.
  'UPSTREAM_UNAVAILABLE',
  'WRITE_NOT_REPLICATED',
]);

/** How the API client waits out retryable refusals. */
export interface RetryPolicy {
  /** How long a call may go on retrying a retryable refusal, ms (0: never retries). */
  forMs: number;
  /** Told before each wait: the refusal, the wait before the next attempt and the time left, ms. */
  onWait(err: CliError, waitMs: number, leftMs: number): void;
}

/** The first wait after a retryable refusal, ms; each next one doubles, up to {@link RETRY_MAX_WAIT_MS}. */
export const RETRY_FIRST_WAIT_MS = 500;
/** The longest wait between two attempts, ms. */
export const RETRY_MAX_WAIT_MS = 5_000;

/**
 * True when `err` is a refusal worth asking again for a call of `method` (`repeatable`: the caller
 * knows repeating it acts at most once). Pure.
 */
export function waitable(err: unknown, method: Method, repeatable = false): err is CliError {
  if (!(err instanceof CliError)) return false;
  const safe = repeatable || method !== 'POST';
  return (safe ? WAITABLE_WHEN_REPEATABLE : REFUSED_BEFORE_ACTING).has(err.code);
}

/** The public API, authenticated with an API key. */
export class ApiClient {
  readonly apiUrl: string;
  readonly #key: string;
  readonly #hint: string;
  readonly #retry: RetryPolicy | undefined;

  /** `retry`: how retryable refusals are waited out (none: every refusal fails at once). */
  constructor(endpoint: Pick<Endpoint, 'apiUrl' | 'apiKey'>, retry?: RetryPolicy) {
    this.apiUrl = endpoint.apiUrl.replace(/\/+$/, '');
    this.#key = endpoint.apiKey;
    this.#hint = `is the API running at ${this.apiUrl}? (start the local stack with \`space up\`, or pass --api-url)`;
    this.#retry = retry;
  }

  /**
   * One API call, its 2xx body parsed. A retryable refusal ({@link waitable}; e.g.
   * TEMPLATE_NOT_READY right after `space up` starts) is asked again after a growing wait until
   * the client's retry policy runs out; a raw (streamed) body is never sent twice.
   * @throws CliError the last refusal, or any other failure at once.
   */
  async json<T>(method: Method, path: string, opts: CallOptions & { repeatable?: boolean } = {}): Promise<T> {
    const { repeatable, ...rest } = opts;
    const deadline = Date.now() + (this.#retry?.forMs ?? 0);
    for (let attempt = 0; ; attempt++) {
      try {
        const res = await call(method, this.apiUrl + path, this.#key, { ...rest, hint: this.#hint });
        return await readJson<T>(res);
      } catch (err) {
        const wait = Math.min(RETRY_MAX_WAIT_MS, RETRY_FIRST_WAIT_MS * 2 ** attempt);
        const left = deadline - Date.now();
        if (!this.#retry || isRawBody(rest.body) || !waitable(err, method, repeatable) || wait > left)
          throw err;
        this.#retry.onWait(err, wait, left);
        await new Promise((r) => setTimeout(r, wait));
      }
    }
  }
}

/** A sandbox's data plane: `base` is `http://node/v1/sandboxes/:id`, `token` a session token. */
export class DataPlane {
  readonly base: string;
  readonly token: string;

  constructor(base: string, token: string) {
    this.base = base.replace(/\/+$/, '');
    this.token = token;
  }

  /** Raw call relative to `base` (a leading `/`), e.g. `/files`. */
  call(method: Method, path: string, opts: CallOptions = {}): Promise<Dispatcher.ResponseData> {
    return call(method, this.base + path, this.token, opts);
  }

  async json<T>(method: Method, path: string, opts: CallOptions = {}): Promise<T> {
    return readJson<T>(await this.call(method, path, opts));
  }
}

/** Public shapes the CLI reads: the API's own declarations (core/api-schemas.ts). */
export type { Operation, Sandbox };

/** Seconds, vCPU-seconds and GiB-seconds per activity state (API JSON). */
export type UsageFigures = Static<typeof UsageFiguresSchema>;

/** `GET /v1/sandboxes/:id/usage`. */
export type SandboxUsage = Static<typeof SandboxUsageSchema>;

/** `GET /v1/usage`. */
export type UsageReport = Static<typeof UsageReportSchema>;

/** A data-plane URL, a session token for it and when that expires (`POST …/tokens`). */
export type StreamGrant = Static<typeof StreamGrantSchema>;

/** Longest server-side wait of one long-poll, ms (the API caps it at 60 s). */
export const LONG_POLL_MS = 30_000;

/**
 * Long-polls an operation until it succeeds or fails (or `timeoutMs` passes: then the last state).
 * A network error between polls is retried a few times (the operation survives API restarts).
 */
export async function waitOperation(
  api: ApiClient,
  id: string,
  timeoutMs = Number.POSITIVE_INFINITY,
): Promise<Operation> {
  const deadline = Date.now() + timeoutMs;
  let failures = 0;
  for (;;) {
    const left = deadline - Date.now();
    const waitMs = Math.max(0, Math.min(LONG_POLL_MS, Number.isFinite(left) ? left : LONG_POLL_MS));
    let op: Operation;
    try {
      op = await api.json<Operation>('GET', `/v1/operations/${encodeURIComponent(id)}`, {
        query: { waitMs: Math.floor(waitMs) },
        bodyTimeoutMs: waitMs + 30_000,
      });
      failures = 0;
    } catch (err) {
      if (err instanceof CliError && err.code === 'UNREACHABLE' && failures < 5 && Date.now() < deadline) {
        failures++;
        await new Promise((r) => setTimeout(r, 500 * failures));
        continue;
      }
      throw err;
    }
    if (op.state === 'succeeded' || op.state === 'failed' || Date.now() >= deadline) return op;
  }
}

/** Throws the operation's error as a CliError when it failed. */
export function assertSucceeded(op: Operation): Operation {
  if (op.state === 'failed') {
    throw new CliError(
      op.error?.code ?? 'OPERATION_FAILED',
      op.error?.message ?? `operation ${op.id} failed`,
      {
        details: { operationId: op.id, target: op.target, kind: op.kind },
      },
    );
  }
  return op;
}
