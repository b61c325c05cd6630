/**
 * A worker whose steps the store refuses (a primary without its replica answers NOREPLICAS under
 * min-replicas-to-write, as just after a Sentinel failover) tells the API's StoreOutage, so nodes
 * that could not heartbeat meanwhile are presumed alive, and runs the operation once writes are
 * taken again: it ends once, succeeded. Real redis-server of its own (its settings change).
 */
import { Redis } from 'ioredis';
import pino from 'pino';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { type RedisServer, startRedisServer } from '../../test/redis-server.ts';
import type { OperationKind } from '../core/types.ts';
import { type OperationHandler, OperationStore, OperationWorker } from './operations.ts';

let server: RedisServer;
beforeAll(async () => {
  server = await startRedisServer();
});
afterAll(async () => {
  await server?.stop();
});

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

it('counts refused writes as a store outage and ends the operation once the store takes writes', async () => {
  const redis = new Redis(server.url);
  const store = new OperationStore(redis);
  let outages = 0;
  let runs = 0;
  // the first run's write meets a primary that has lost its replica (writes refused from then on)
  const handler: OperationHandler = async () => {
    runs += 1;
    if (runs === 1) {
      await redis.config('SET', 'min-replicas-to-write', '1');
      await redis.set('handler-write', '1');
    }
  };
  const worker = new OperationWorker({
    connection: new Redis(server.url),
    store,
    handlers: new Proxy({} as Record<OperationKind, OperationHandler>, { get: () => handler }),
    log: pino({ level: 'silent' }),
    concurrency: 2,
    onStoreOutage: () => {
      outages += 1;
    },
  });
  try {
    await worker.start();
    const op = await store.enqueue('sandbox.delete', 'sbx_aaaaaaaaaaaa', {}, 'default');
    // the refused handler write and the refused restart of the run are both outages
    for (let i = 0; i < 40 && outages < 2; i++) await sleep(100);
    expect(outages).toBeGreaterThanOrEqual(2);
    expect((await store.get(op.id))?.state).toBe('running');
    await redis.config('SET', 'min-replicas-to-write', '0');
    let state = '';
    for (let i = 0; i < 60 && state !== 'succeeded'; i++) {
      await sleep(100);
      state = (await store.get(op.id))?.state ?? '';
    }
    expect(state).toBe('succeeded');
    // the interrupted run, then the one that ended it
    expect(runs).toBe(2);
  } finally {
    await redis.config('SET', 'min-replicas-to-write', '0').catch(() => {});
    await worker.stop();
    redis.disconnect();
  }
}, 20_000);
