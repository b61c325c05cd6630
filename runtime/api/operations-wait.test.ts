/** The long-poll of GET /v1/operations/:id?waitMs= against a real Redis: its 60 s cap and its wake-up. */
import { Redis } from 'ioredis';
import { afterAll, afterEach, beforeEach, describe, expect, inject, it, vi } from 'vitest';
import { MAX_WAIT_MS, OperationStore, OperationWaiter } from './operations.ts';

const redis = new Redis(inject('redisUrl'), { db: 4 });
const sub = new Redis(inject('redisUrl'), { db: 4 });
const store = new OperationStore(redis);
const waiter = new OperationWaiter(sub, store);
afterAll(async () => {
  await waiter.close();
  redis.disconnect();
});
beforeEach(async () => {
  await redis.flushdb();
});
afterEach(() => {
  vi.useRealTimers();
});

describe('operation long-poll', () => {
  it('the cap is 60 s: a wait asked for 10 minutes answers the still-running operation at 60 s, not before', async () => {
    expect(MAX_WAIT_MS).toBe(60_000);
    const op = await store.enqueue('sandbox.create', 'sbx_x', {}, 'default');
    await waiter.wait(op.id, 0); // subscribed before the clock is faked
    vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout', 'Date'] });
    let answer: unknown;
    const p = waiter.wait(op.id, 10 * 60_000).then((r) => {
      answer = r;
    });
    await vi.advanceTimersByTimeAsync(MAX_WAIT_MS - 1000);
    expect(answer).toBeUndefined();
    await vi.advanceTimersByTimeAsync(2000);
    await p;
    expect(answer).toMatchObject({ id: op.id, state: 'pending' });
  });

  it('a change of state wakes a waiter at once', async () => {
    const op = await store.enqueue('sandbox.create', 'sbx_y', {}, 'default');
    const p = waiter.wait(op.id, MAX_WAIT_MS);
    await new Promise((r) => setTimeout(r, 50));
    const run = await store.start(op.id, 'test-worker');
    await store.finish(op.id, run!, 'succeeded');
    expect(await p).toMatchObject({ id: op.id, state: 'succeeded' });
  });
});
