/**
 * A minimal Crusoe REST v1 client for the dynamic provider: signed requests and waiting for
 * asynchronous operations. Credentials come from the environment at call time
 * (`CRUSOE_ACCESS_KEY_ID`, `CRUSOE_SECRET_KEY`, optional `CRUSOE_API_ENDPOINT`), never from
 * anything Pulumi serializes into the state.
 */
import { crusoeTimestamp, signRequest } from './signing.ts';

/** Default API base URL (docs/deployment.md "Crusoe"). */
export const DEFAULT_ENDPOINT = 'https://api.cloud.crusoe.ai/v1';

/** An HTTP error answer of the Crusoe API. */
export class CrusoeApiError extends Error {
  readonly status: number;
  readonly body: string;
  constructor(method: string, path: string, status: number, body: string) {
    super(`crusoe ${method} ${path}: HTTP ${status}: ${body.slice(0, 500)}`);
    this.name = 'CrusoeApiError';
    this.status = status;
    this.body = body;
  }
}

/** Credentials and endpoint, read from the environment now. */
export function credentialsFromEnv(env: NodeJS.ProcessEnv = process.env) {
  const accessKeyId = env['CRUSOE_ACCESS_KEY_ID'];
  const secretKey = env['CRUSOE_SECRET_KEY'];
  if (!accessKeyId || !secretKey)
    throw new Error(
      'crusoe: set CRUSOE_ACCESS_KEY_ID and CRUSOE_SECRET_KEY in the environment of `pulumi up`',
    );
  return {
    accessKeyId,
    secretKey,
    endpoint: (env['CRUSOE_API_ENDPOINT'] || DEFAULT_ENDPOINT).replace(/\/$/, ''),
  };
}

/** One signed request; `path` is relative to the endpoint (`/projects/…`). JSON in, JSON out. */
export async function crusoeRequest(method: string, path: string, body?: unknown): Promise<unknown> {
  const { accessKeyId, secretKey, endpoint } = credentialsFromEnv();
  const url = new URL(endpoint + path);
  const headers = signRequest({
    method,
    path: url.pathname,
    query: url.search.replace(/^\?/, ''),
    timestamp: crusoeTimestamp(new Date()),
    accessKeyId,
    secretKey,
  });
  const res = await fetch(url, {
    method,
    headers: {
      ...headers,
      accept: 'application/json',
      ...(body === undefined ? {} : { 'content-type': 'application/json' }),
    },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  });
  const text = await res.text();
  if (!res.ok) throw new CrusoeApiError(method, path, res.status, text);
  return text ? JSON.parse(text) : {};
}

/** A Crusoe asynchronous operation (swagger `Operation`). */
export interface CrusoeOperation {
  operation_id: string;
  state: 'IN_PROGRESS' | 'SUCCEEDED' | 'FAILED';
  result?: Record<string, unknown>;
  metadata?: unknown;
}

/**
 * Waits for the operation returned by a write on `collection` (`…/compute/vms/instances`) to leave
 * IN_PROGRESS (polling `collection/operations/{id}`); returns its result, throws if it FAILED.
 */
export async function awaitOperation(
  collection: string,
  answer: unknown,
  opts: { intervalMs?: number; timeoutMs?: number } = {},
): Promise<Record<string, unknown>> {
  let op = (answer as { operation?: CrusoeOperation }).operation;
  if (!op) throw new Error(`crusoe ${collection}: answer has no operation`);
  const interval = opts.intervalMs ?? Number(process.env['CRUSOE_POLL_INTERVAL_MS'] ?? 2000);
  const deadline = Date.now() + (opts.timeoutMs ?? 30 * 60_000);
  while (op.state === 'IN_PROGRESS') {
    if (Date.now() > deadline)
      throw new Error(`crusoe ${collection}: operation ${op.operation_id} timed out`);
    await new Promise((r) => setTimeout(r, interval));
    const next = (await crusoeRequest('GET', `${collection}/operations/${op.operation_id}`)) as
      | CrusoeOperation
      | { operation: CrusoeOperation };
    op = 'operation' in next ? next.operation : next;
  }
  if (op.state === 'FAILED')
    throw new Error(
      `crusoe ${collection}: operation ${op.operation_id} failed: ${JSON.stringify(op.result ?? op.metadata)}`,
    );
  return op.result ?? {};
}
