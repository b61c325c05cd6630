/**
 * HTTP clients of the CLI (undici): the control-plane API (API key) and a sandbox's data plane
 * (session token). Every failure becomes a CliError with the server's stable code, or
 * `UNREACHABLE` / `BAD_RESPONSE` when there is no SPACE answer at all.
 */
import type { Readable } from 'node:stream';
import { type Dispatcher, request } from 'undici';
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

/** The public API, authenticated with an API key. */
export class ApiClient {
  readonly apiUrl: string;
  readonly #key: string;
  readonly #hint: string;

  constructor(endpoint: Pick<Endpoint, 'apiUrl' | 'apiKey'>) {
    this.apiUrl = endpoint.apiUrl.replace(/\/+$/, '');
    this.#key = endpoint.apiKey;
    this.#hint = `is the API running at ${this.apiUrl}? (start the local stack with \`space up\`, or pass --api-url)`;
  }

  async json<T>(method: Method, path: string, opts: CallOptions = {}): Promise<T> {
    const res = await call(method, this.apiUrl + path, this.#key, { ...opts, hint: this.#hint });
    return readJson<T>(res);
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

/** Public shapes the CLI reads (see runtime/api/schemas.ts). */
export interface Operation {
  id: string;
  kind: string;
  target: string;
  state: 'pending' | 'running' | 'succeeded' | 'failed';
  error: { code: string; message: string } | null;
  createdAt: string;
  updatedAt: string;
}

export interface Sandbox {
  id: string;
  template: string;
  state: string;
  vcpus: number;
  memoryMiB: number;
  timeoutSec: number;
  autoPauseSec?: number;
  pause?: { mode: string; reason: string; pausedAt: string; timeLeftSec: number } | null;
  metadata: Record<string, string>;
  nodeId: string | null;
  fromWarmPool: boolean;
  createdFrom?: 'warm' | 'snapshot' | 'boot' | null;
  sessionId: string;
  createdAt: string;
  updatedAt: string;
  expiresAt: string;
  endedAt: string | null;
  killReason: string | null;
  endMessage: string | null;
}

/** Seconds, vCPU-seconds and GiB-seconds per activity state (API JSON). */
export interface UsageFigures {
  seconds: Record<'active' | 'idle' | 'paused', number>;
  vcpuSeconds: Record<'active' | 'idle' | 'paused', number>;
  gibSeconds: Record<'active' | 'idle' | 'paused', number>;
}

/** `GET /v1/sandboxes/:id/usage`. */
export interface SandboxUsage extends UsageFigures {
  sandboxId: string;
  template: string;
  startedAt: string | null;
  endedAt: string | null;
  state: 'active' | 'idle' | 'paused' | null;
}

/** `GET /v1/usage`. */
export interface UsageReport {
  from: string;
  to: string;
  groupBy: string;
  resolutionSec: number;
  groups: ({ key: string } & UsageFigures)[];
  total: UsageFigures;
}

export interface StreamGrant {
  url: string;
  token: string;
  expiresAt: string;
}

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
