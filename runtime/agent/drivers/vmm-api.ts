/**
 * The HTTP/1.1-over-a-Unix-socket client of the API-driven VMMs (Firecracker, Cloud Hypervisor;
 * vmm-common.ts drives them with it): one request, one call that turns a refusal into the
 * driver's error with the VMM's own fault message, and the wait for the API socket to answer.
 */
import { existsSync } from 'node:fs';
import { request } from 'node:http';
import { SpaceError } from '../../core/errors.ts';
/** Answer of one API call. */
export interface ApiAnswer {
  status: number;
  /** Raw body text ('' for 204). */
  text: string;
}

/**
 * One HTTP/1.1 request to a VMM's API over its Unix socket (`Host: localhost`, JSON body when given).
 * @throws Error on connection failure or after `timeoutMs` (callers wrap it).
 */
export function apiRequest(
  socketPath: string,
  method: string,
  path: string,
  body?: unknown,
  timeoutMs = 10_000,
): Promise<ApiAnswer> {
  const payload = body === undefined ? undefined : JSON.stringify(body);
  return new Promise((resolve, reject) => {
    const req = request(
      {
        socketPath,
        method,
        path,
        host: 'localhost',
        timeout: timeoutMs,
        agent: false,
        headers: {
          Accept: 'application/json',
          ...(payload === undefined
            ? {}
            : { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(payload) }),
        },
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, text: Buffer.concat(chunks).toString() }));
        res.on('error', reject);
      },
    );
    req.on('timeout', () => req.destroy(new Error(`timeout after ${timeoutMs} ms`)));
    req.on('error', reject);
    req.end(payload);
  });
}

/**
 * The VMM's own words from an error body: Firecracker's `{"fault_message": …}` (its spec, definitions
 * `Error`), else the text itself (Cloud Hypervisor answers errors as plain text), ≤ 500 chars. Pure.
 */
export function faultMessage(text: string): string {
  try {
    const j = JSON.parse(text) as { fault_message?: unknown };
    if (typeof j?.fault_message === 'string') return j.fault_message;
  } catch {}
  return text.trim().slice(0, 500);
}

/**
 * An API call that must succeed with a 2xx. `vmm` names the VMM in errors.
 * @returns the parsed JSON body (undefined for an empty body).
 * @throws SpaceError DRIVER_FAILED `<vmm> <METHOD> <path>: HTTP <status> <fault message>` (or the
 *   connection error).
 */
export async function apiCall<T = unknown>(
  vmm: string,
  socketPath: string,
  method: string,
  path: string,
  body?: unknown,
  timeoutMs?: number,
): Promise<T> {
  let a: ApiAnswer;
  try {
    a = await apiRequest(socketPath, method, path, body, timeoutMs);
  } catch (err) {
    throw new SpaceError(
      'DRIVER_FAILED',
      `${vmm} ${method} ${path}: ${(err as Error).message}`,
      { socket: socketPath },
      { cause: err },
    );
  }
  if (a.status < 200 || a.status > 299) {
    throw new SpaceError(
      'DRIVER_FAILED',
      `${vmm} ${method} ${path}: HTTP ${a.status} ${faultMessage(a.text)}`.trim(),
      { socket: socketPath, status: a.status },
    );
  }
  return (a.text ? JSON.parse(a.text) : undefined) as T;
}

/**
 * Polls until `socketPath` accepts an HTTP request (any status), `alive()` says the process died, or
 * `timeoutMs` passes. @throws Error naming which.
 */
export async function waitForApiSocket(
  socketPath: string,
  probePath: string,
  timeoutMs: number,
  alive: () => Promise<boolean>,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let last = 'no socket';
  while (Date.now() < deadline) {
    if (existsSync(socketPath)) {
      const ok = await apiRequest(socketPath, 'GET', probePath, undefined, 1000).then(
        () => true,
        (e: Error) => {
          last = e.message;
          return false;
        },
      );
      if (ok) return;
    }
    if (!(await alive())) throw new Error(`the VMM exited before its API socket ${socketPath} answered`);
    await new Promise((r) => setTimeout(r, 10));
  }
  throw new Error(`the VMM's API socket ${socketPath} did not answer within ${timeoutMs} ms (${last})`);
}
