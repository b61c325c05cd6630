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

describe('NodeStore.list and get', () => {
  it('read registration, liveness and warm slots of every node, in id order, skipping unregistered ids', async () => {
    for (const id of ['n-b', 'n-a']) {
      await redis.sadd(keys.nodeIndex(), id);
      await redis.hset(keys.node(id), {
        id,
        url: `http://${id}:8081`,
        driver: 'gvisor',
        templates: 'base,py',
      });
    }
    await redis.sadd(keys.nodeIndex(), 'n-gone'); // in the index, registration gone
    await redis.set(keys.nodeAlive('n-b'), '1');
    await redis.hset(keys.nodeWarm('n-b'), { base: '3', py: '-1' });
    const all = await nodes.list();
    expect(all.map((n) => [n.id, n.alive, n.url, n.templates, n.warm])).toEqual([
      ['n-a', false, 'http://n-a:8081', ['base', 'py'], {}],
      ['n-b', true, 'http://n-b:8081', ['base', 'py'], { base: 3, py: 0 }],
    ]);
    expect(await nodes.get('n-b')).toEqual(all[1]);
    expect(await nodes.get('n-gone')).toBeNull();
  });
});
