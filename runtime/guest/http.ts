/** Small node:http helpers: JSON bodies and the core error body. */

import type { IncomingMessage, ServerResponse } from 'node:http';
import { SpaceError } from '../core/errors.ts';
import { errorFields, type Logger } from './log.ts';

/** Largest JSON request body the guest parses (file uploads are streamed and have no cap). */
export const MAX_JSON_BODY_BYTES = 16 * 1024 * 1024;

export function sendJson(res: ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, {
    'content-type': 'application/json; charset=utf-8',
    'content-length': Buffer.byteLength(text),
  });
  res.end(text);
}

export function sendNoContent(res: ServerResponse): void {
  res.writeHead(204);
  res.end();
}

/**
 * Sends `err` as the core error body. SpaceErrors keep their code and status; anything else is
 * logged and becomes INTERNAL. When the response already started, the connection is cut instead.
 */
export function sendError(res: ServerResponse, err: unknown, log: Logger): void {
  const spaceErr =
    err instanceof SpaceError ? err : new SpaceError('INTERNAL', 'internal error in the guest daemon');
  if (!(err instanceof SpaceError)) log('error', 'request failed', errorFields(err));
  if (res.headersSent) {
    res.destroy();
    return;
  }
  sendJson(res, spaceErr.status, spaceErr.toBody());
}

/** Reads and parses a JSON body (empty body → `{}`). */
export async function readJson(req: IncomingMessage): Promise<unknown> {
  const chunks: Buffer[] = [];
  let size = 0;
  let tooLarge = false;
  for await (const chunk of req) {
    const buf = chunk as Buffer;
    size += buf.length;
    if (size > MAX_JSON_BODY_BYTES) tooLarge = true;
    else chunks.push(buf);
  }
  if (tooLarge)
    throw new SpaceError('BODY_TOO_LARGE', `json body is larger than ${MAX_JSON_BODY_BYTES} bytes`);
  const text = Buffer.concat(chunks).toString('utf8').trim();
  if (text === '') return {};
  try {
    return JSON.parse(text) as unknown;
  } catch {
    throw new SpaceError('BAD_REQUEST', 'request body is not valid json');
  }
}

/** True for a plain JSON object. */
export function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/** Validates a `Record<string, string>` (env maps): no NUL bytes, no `=` in names. */
export function parseEnv(value: unknown, field: string): Record<string, string> {
  if (value === undefined) return {};
  if (!isObject(value)) throw new SpaceError('BAD_REQUEST', `${field} must be an object of strings`);
  const env: Record<string, string> = {};
  for (const [k, v] of Object.entries(value)) {
    if (typeof v !== 'string') throw new SpaceError('BAD_REQUEST', `${field}.${k} must be a string`);
    if (k === '' || k.includes('=') || k.includes('\0') || v.includes('\0')) {
      throw new SpaceError('BAD_REQUEST', `${field} has an invalid variable ${JSON.stringify(k)}`);
    }
    env[k] = v;
  }
  return env;
}
