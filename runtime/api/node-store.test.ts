/** NodeStore.whileAlive against a real Redis: a call ends with its node, and never waits on the poll. */
import { Redis } from 'ioredis';
import { afterAll, beforeEach, describe, expect, inject, it } from 'vitest';
import { keys } from '../core/redis-keys.ts';
import { ALIVE_POLL_MS, NodeStore } from './node-store.ts';

const redis = new Redis(inject('redisUrl'), { db: 11 });
const nodes = new NodeStore(redis);
afterAll(() => redis.disconnect());
beforeEach(async () => {
  await redis.flushdb();
});

describe('NodeStore.whileAlive', () => {
  it('returns as soon as the call settles, not at the next liveness poll', async () => {
    await redis.set(keys.nodeAlive('n1'), '1');
    const t = performance.now();
    expect(await nodes.whileAlive('n1', async () => 'done')).toBe('done');
    await expect(
      nodes.whileAlive('n1', async () => {
        throw new Error('refused');
      }),
    ).rejects.toThrow('refused');
    // both calls together: far below one poll interval (each used to take a whole one)
    expect(performance.now() - t).toBeLessThan(ALIVE_POLL_MS / 2);
  });

  it('aborts the call with NODE_UNAVAILABLE when the node stops heartbeating', async () => {
    await redis.set(keys.nodeAlive('n2'), '1');
    setTimeout(() => void redis.del(keys.nodeAlive('n2')), 100);
    const call = nodes.whileAlive(
      'n2',
      (signal) =>
        new Promise((_, reject) => signal.addEventListener('abort', () => reject(new Error('aborted')))),
    );
    await expect(call).rejects.toMatchObject({ code: 'NODE_UNAVAILABLE' });
  });
});
