/**
 * Operations against a real Redis: an operation ends once (F3), a run that was reclaimed cannot
 * overwrite the newer run's outcome, and a worker that is still running an operation keeps it —
 * another worker takes it over only once the owner stopped renewing its claim.
 */
import { Redis } from 'ioredis';
import pino from 'pino';
import { afterAll, beforeEach, describe, expect, inject, it } from 'vitest';
import { SpaceError } from '../core/errors.ts';
import { keys, OPERATION_GROUP } from '../core/redis-keys.ts';
import type { OperationKind } from '../core/types.ts';
import { type OperationHandler, OperationStore, OperationWorker } from './operations.ts';

const url = inject('redisUrl');
const redis = new Redis(url, { db: 6 });
const store = new OperationStore(redis);
const log = pino({ level: 'silent' });
afterAll(() => redis.disconnect());
beforeEach(async () => {
  await redis.flushdb();
});

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function worker(handler: OperationHandler, reclaimIdleMs: number): OperationWorker {
  const handlers = new Proxy({} as Record<OperationKind, OperationHandler>, { get: () => handler });
  return new OperationWorker({
    connection: new Redis(url, { db: 6 }),
    store,
    handlers,
    log,
    concurrency: 4,
    reclaimIdleMs,
  });
}

describe('operations end once', () => {
  it('f3-finished-never-changes: a finished operation keeps its first outcome', async () => {
    const op = await store.enqueue('sandbox.delete', 'sbx_aaaaaaaaaaaa', {}, 'default');
    const started = await store.start(op.id, 'w1');
    // the run's token, with the operation as the run sees it (running, its owner's)
    expect(started?.run).toBe(1);
    expect(started?.op).toMatchObject({
      id: op.id,
      kind: 'sandbox.delete',
      state: 'running',
      team: 'default',
    });
    const run = started?.run;
    expect(await store.finish(op.id, run!, 'succeeded')).toBe(true);
    expect(await store.finish(op.id, run!, 'failed', new SpaceError('NODE_UNAVAILABLE', 'late'))).toBe(false);
    expect(await store.start(op.id, 'w2')).toBeNull();
    expect(await store.get(op.id)).toMatchObject({ state: 'succeeded', error: null });
  });

  it('a run starts with its target sandbox as it is then, read in the same step', async () => {
    await redis.hset(keys.sandbox('sbx_aaaaaaaaaaae'), { id: 'sbx_aaaaaaaaaaae', state: 'creating' });
    const op = await store.enqueue('sandbox.create', 'sbx_aaaaaaaaaaae', {}, 'default');
    expect((await store.start(op.id, 'w1'))?.target).toEqual({ id: 'sbx_aaaaaaaaaaae', state: 'creating' });
    const gone = await store.enqueue('sandbox.delete', 'sbx_aaaaaaaaaaaf', {}, 'default');
    expect((await store.start(gone.id, 'w1'))?.target).toEqual({});
  });

  it('a finished run leaves nothing on the queue: its entry is acknowledged with the finish', async () => {
    const seen: Record<string, string>[] = [];
    const w = worker(async (_op, target) => {
      seen.push(target);
    }, 30_000);
    await w.start();
    await redis.hset(keys.sandbox('sbx_aaaaaaaaaaag'), { id: 'sbx_aaaaaaaaaaag', state: 'running' });
    const op = await store.enqueue('sandbox.delete', 'sbx_aaaaaaaaaaag', {}, 'default');
    for (let i = 0; i < 100 && (await store.get(op.id))?.state !== 'succeeded'; i++) await sleep(20);
    await w.stop();
    expect(seen).toEqual([{ id: 'sbx_aaaaaaaaaaag', state: 'running' }]);
    expect(await redis.xlen(keys.operationQueue())).toBe(0);
    expect((await redis.xpending(keys.operationQueue(), OPERATION_GROUP))[0]).toBe(0);
  });

  it('f3-fenced-run: a run that was taken over cannot decide the outcome', async () => {
    const op = await store.enqueue('sandbox.delete', 'sbx_aaaaaaaaaaab', {}, 'default');
    const first = (await store.start(op.id, 'w1'))?.run;
    const second = (await store.start(op.id, 'w2'))?.run;
    expect(second).toBe(first! + 1);
    expect(await store.finish(op.id, first!, 'failed', new SpaceError('NODE_UNAVAILABLE', 'timed out'))).toBe(
      false,
    );
    expect((await store.get(op.id))?.state).toBe('running');
    expect(await store.finish(op.id, second!, 'succeeded')).toBe(true);
    expect((await store.get(op.id))?.state).toBe('succeeded');
  });

  it('f3-no-reclaim-while-owner-works: a slow run is not run again by another worker', async () => {
    let runs = 0;
    let release: () => void = () => {};
    const gate = new Promise<void>((r) => (release = r));
    const slow: OperationHandler = async () => {
      runs += 1;
      await gate;
    };
    // idle time far below how long the handler takes: without lease renewal the entry is reclaimed
    const a = worker(slow, 300);
    await a.start();
    const op = await store.enqueue('sandbox.delete', 'sbx_aaaaaaaaaaac', {}, 'default');
    for (let i = 0; i < 100 && runs === 0; i++) await sleep(20);
    expect(runs).toBe(1);
    const b = worker(slow, 300);
    await b.start();
    await sleep(1500); // five reclaim periods
    expect(runs).toBe(1);
    release();
    await a.stop();
    await b.stop();
    expect((await store.get(op.id))?.state).toBe('succeeded');
  });

  it('reclaims the operation of a worker that died holding it', async () => {
    await redis.xgroup('CREATE', keys.operationQueue(), OPERATION_GROUP, '0', 'MKSTREAM');
    const op = await store.enqueue('sandbox.delete', 'sbx_aaaaaaaaaaad', {}, 'default');
    // a worker that read the entry, started a run and died: nobody renews its claim
    await redis.xreadgroup(
      'GROUP',
      OPERATION_GROUP,
      'dead',
      'COUNT',
      1,
      'STREAMS',
      keys.operationQueue(),
      '>',
    );
    await store.start(op.id, 'dead');
    let runs = 0;
    const b = worker(async () => {
      runs += 1;
    }, 300);
    await b.start();
    for (let i = 0; i < 100 && (await store.get(op.id))?.state !== 'succeeded'; i++) await sleep(50);
    await b.stop();
    expect(runs).toBe(1);
    expect(await store.get(op.id)).toMatchObject({ state: 'succeeded' });
  });
});
