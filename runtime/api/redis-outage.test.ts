/**
 * Redis away → 503 `CONTROL_PLANE_UNAVAILABLE` with `Retry-After`, never 500 `INTERNAL` (issue 14
 * item 5). A real API process-in-test against its own real redis-server, which the test stops.
 */
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis, ReplyError } from 'ioredis';
import { request } from 'undici';
import { afterAll, describe, expect, it } from 'vitest';
import { startRedisServer } from '../../test/redis-server.ts';
import { SpaceError } from '../core/errors.ts';
import { CONTROL_PLANE_RETRY_AFTER_SEC, isRedisUnavailable } from '../core/redis-errors.ts';
import { writeNewKeyPair } from '../core/tokens.ts';
import { loadApiConfig } from './config.ts';
import { startApi } from './service.ts';

const dir = mkdtempSync(join(tmpdir(), 'space-redis-outage-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** What a client of a stopped Redis gets from ioredis, with the options the services use. */
async function outageErrors(url: string): Promise<unknown[]> {
  const errors: unknown[] = [];
  const queued = new Redis(url, { maxRetriesPerRequest: 1, lazyConnect: true });
  queued.on('error', () => {});
  await queued.get('k').catch((e: unknown) => errors.push(e));
  queued.disconnect();
  const offline = new Redis(url, { enableOfflineQueue: false, lazyConnect: true, retryStrategy: () => null });
  offline.on('error', () => {});
  await offline.connect().catch((e: unknown) => errors.push(e));
  await offline.get('k').catch((e: unknown) => errors.push(e));
  offline.disconnect();
  return errors;
}

describe('redis outage', () => {
  it('recognises what ioredis throws for an unreachable server, and nothing else', async () => {
    const server = await startRedisServer();
    const live = new Redis(server.url);
    await live.set('str', 'x');
    // a wrong command against a live server is not an outage
    const wrong = await live.lpush('str', 'y').catch((e: unknown) => e);
    expect(wrong).toBeInstanceOf(ReplyError);
    expect(isRedisUnavailable(wrong)).toBe(false);
    live.disconnect();
    await server.stop();
    const errors = await outageErrors(server.url);
    expect(errors.length).toBe(3);
    for (const e of errors) expect(isRedisUnavailable(e), String(e)).toBe(true);
    // found through an INTERNAL wrapper's cause, but a coded error keeps its code
    const wrapped = new SpaceError('INTERNAL', 'x', undefined, { cause: errors[0] });
    expect(isRedisUnavailable(wrapped)).toBe(true);
    expect(isRedisUnavailable(new SpaceError('NODE_UNAVAILABLE', 'x', undefined, { cause: errors[0] }))).toBe(
      false,
    );
    expect(isRedisUnavailable(new Error('boom'))).toBe(false);
    expect(isRedisUnavailable('Connection is closed.')).toBe(false);
    expect(isRedisUnavailable(new ReplyError('LOADING Redis is loading the dataset in memory'))).toBe(true);
  });

  it('control-plane-unavailable: API routes answer 503 with Retry-After while Redis is stopped', {
    timeout: 30_000,
  }, async () => {
    const server = await startRedisServer();
    await writeNewKeyPair(join(dir, 'signing.pem'), join(dir, 'verify.pem'));
    const api = await startApi(
      loadApiConfig({
        SPACE_API_HOST: '127.0.0.1',
        SPACE_API_PORT: '0',
        SPACE_REDIS_URL: server.url,
        SPACE_SIGNING_KEY_FILE: join(dir, 'signing.pem'),
        SPACE_LOG_LEVEL: 'silent',
      }),
      { bootstrapKeyFile: join(dir, 'api-key') },
    );
    const key = readFileSync(join(dir, 'api-key'), 'utf8').trim();
    const call = async (method: string, path: string, headers: Record<string, string>, body?: unknown) => {
      const res = await request(`${api.url}${path}`, {
        method: method as 'GET',
        headers: { ...headers, ...(body ? { 'content-type': 'application/json' } : {}) },
        body: body ? JSON.stringify(body) : undefined,
      });
      return { status: res.statusCode, retryAfter: res.headers['retry-after'], body: await res.body.json() };
    };
    const v1 = { authorization: `Bearer ${key}` };
    try {
      expect((await call('GET', '/v1/sandboxes', v1)).status).toBe(200);
      await server.stop();
      const seen = [
        await call('GET', '/v1/sandboxes', v1),
        await call('GET', '/v1/operations/op_aaaaaaaaaaaa', v1),
        await call('POST', '/v1/sandboxes', v1, { template: 'base' }),
      ];
      for (const res of seen) {
        expect(res).toMatchObject({
          status: 503,
          retryAfter: String(CONTROL_PLANE_RETRY_AFTER_SEC),
          body: { error: { code: 'CONTROL_PLANE_UNAVAILABLE' } },
        });
      }
      // the E2B routes: their own error shape, the same status and header
      const e2b = await call('GET', '/sandboxes', { 'x-api-key': key });
      expect(e2b).toMatchObject({ status: 503, retryAfter: String(CONTROL_PLANE_RETRY_AFTER_SEC) });
    } finally {
      await api.close();
      await server.stop();
    }
  });
});
