/** The long-poll of GET /v1/operations/:id?waitMs= against a real Redis: its 60 s cap and its wake-up. */
import { Redis } from 'ioredis';
import { afterAll, afterEach, beforeEach, describe, expect, inject, it, vi } from 'vitest';
import { SpaceError } from '../core/errors.ts';
import { MAX_WAIT_MS, OperationStore, OperationWaiter, publishedRecord } from './operations.ts';

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
    const run = (await store.start(op.id, 'test-worker'))?.run;
    await store.finish(op.id, run!, 'succeeded');
    expect(await p).toMatchObject({ id: op.id, state: 'succeeded' });
  });

  it('a finish publishes the finished record, which the waiter answers with as Redis holds it', async () => {
    const op = await store.enqueue('sandbox.create', 'sbx_z', { a: '1' }, 'default');
    const run = (await store.start(op.id, 'test-worker'))?.run;
    const listener = new Redis(inject('redisUrl'), { db: 4 });
    const channel = `space:v1:operation:${op.id}:events`;
    await listener.subscribe(channel);
    const message = new Promise<string>((resolve) =>
      listener.once('message', (_c: string, m: string) => resolve(m)),
    );
    const p = waiter.wait(op.id, MAX_WAIT_MS);
    await new Promise((r) => setTimeout(r, 50));
    await store.finish(op.id, run!, 'failed', new SpaceError('NODE_UNAVAILABLE', 'node n1 did not answer'));
    const published = publishedRecord(await message);
    const stored = await store.get(op.id);
    expect(published).toEqual(stored);
    expect(published).toMatchObject({ state: 'failed' });
    expect(await p).toEqual(stored);
    listener.disconnect();
  });

  it('a finish published before the wait began is not missed: the waiter answers from what it was sent', async () => {
    await waiter.subscribed();
    const op = await store.enqueue('sandbox.create', 'sbx_early', {}, 'default');
    const read = await store.get(op.id); // the caller's read, after the subscription: pending
    const run = (await store.start(op.id, 'test-worker'))?.run;
    await store.finish(op.id, run!, 'succeeded');
    await new Promise((r) => setTimeout(r, 100)); // the message reached this process, no listener yet
    const answer = await Promise.race([
      waiter.wait(op.id, MAX_WAIT_MS, read!),
      new Promise((r) => setTimeout(() => r('still waiting after 5 s'), 5000)),
    ]);
    expect(answer).toMatchObject({ id: op.id, state: 'succeeded' });
  });

  it("a waiter handed its caller's read does not read the operation again", async () => {
    const counted = new OperationStore(redis);
    let reads = 0;
    const get = counted.get.bind(counted);
    counted.get = async (id: string) => {
      reads += 1;
      return get(id);
    };
    const sub2 = new Redis(inject('redisUrl'), { db: 4 });
    const w = new OperationWaiter(sub2, counted);
    try {
      await w.subscribed();
      const op = await store.enqueue('sandbox.create', 'sbx_known', {}, 'default');
      const read = await store.get(op.id);
      const p = w.wait(op.id, MAX_WAIT_MS, read!);
      await new Promise((r) => setTimeout(r, 50));
      const run = (await store.start(op.id, 'test-worker'))?.run;
      await store.finish(op.id, run!, 'succeeded');
      expect(await p).toMatchObject({ id: op.id, state: 'succeeded' });
      expect(reads).toBe(0);
    } finally {
      await w.close();
    }
  });

  it('other messages on the channel are not taken for a finished record', () => {
    for (const m of [
      'running',
      'succeeded',
      '[',
      '["id"]',
      '[1,2]',
      '{"state":"succeeded"}',
      '["id","op_1","state","running"]',
    ]) {
      expect(publishedRecord(m)).toBeNull();
    }
  });
});
