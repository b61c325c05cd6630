/**
 * Metering's moved boundary (`reportUsage` with `agoMs`, meter.lua) on the test run's real Redis:
 * a state change reported late (a pause the node carried out 30 s before the API heard of it)
 * closes the open interval where the change happened, never before that interval began or after
 * now, so no interval is negative or overlaps another (case F9).
 */
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { keys } from './redis-keys.ts';
import { reportUsage } from './usage.ts';

let redis: Redis;
/** Sandbox ids of this run (the database is shared: nothing is flushed, only these keys removed). */
const ids: string[] = [];
const sandbox = (): string => {
  const id = `sbx-boundary-${Math.random().toString(36).slice(2, 10)}`;
  ids.push(id);
  return id;
};
beforeAll(() => {
  redis = new Redis(inject('redisUrl'), { db: 15 });
});
afterAll(async () => {
  for (const id of ids) {
    await redis.del(keys.sandbox(id), keys.usageOpen(id), keys.usageSandbox(id));
    await redis.srem(keys.usageOpenIndex(), id);
  }
  redis.disconnect();
});

/** Moves the open interval's start `ms` into the past (as if it had been opened then). */
async function openedAgo(id: string, ms: number): Promise<number> {
  const since = Number(await redis.hget(keys.usageOpen(id), 'since')) - ms;
  await redis.hset(keys.usageOpen(id), 'since', String(since));
  return since;
}

describe('reportUsage with a boundary in the past', () => {
  it('closes the interval where the change happened and opens the next from there', async () => {
    const id = sandbox();
    await redis.hset(keys.sandbox(id), { state: 'running', vcpus: '1', memoryMiB: '256' });
    await reportUsage(redis, id, 'active');
    const since = await openedAgo(id, 40_000);
    const r = await reportUsage(redis, id, 'paused', '', 30_000);
    expect(r.previous).toBe('active');
    // 40 s open, the change 30 s ago: ~10 s active (the Redis round trip aside)
    expect(r.closedMs).toBeGreaterThanOrEqual(10_000);
    expect(r.closedMs).toBeLessThan(11_000);
    const open = await redis.hgetall(keys.usageOpen(id));
    expect(open.state).toBe('paused');
    expect(Number(open.since)).toBe(since + r.closedMs);
    expect(Number(open.since)).toBe(r.at);
  });

  it('never moves the boundary before the open interval began (no negative interval)', async () => {
    const id = sandbox();
    await redis.hset(keys.sandbox(id), { state: 'running', vcpus: '1', memoryMiB: '256' });
    await reportUsage(redis, id, 'active');
    const since = await openedAgo(id, 5_000);
    const r = await reportUsage(redis, id, 'paused', '', 60_000);
    expect(r.closedMs).toBe(0);
    expect(Number(await redis.hget(keys.usageOpen(id), 'since'))).toBe(since);
    // the next report closes the paused interval from there: it counts as paused
    const next = await reportUsage(redis, id, 'idle');
    expect(next.previous).toBe('paused');
    expect(next.closedMs).toBeGreaterThanOrEqual(5_000);
  });

  it('without agoMs the boundary is now, as before', async () => {
    const id = sandbox();
    await redis.hset(keys.sandbox(id), { state: 'running', vcpus: '1', memoryMiB: '256' });
    await reportUsage(redis, id, 'active');
    await openedAgo(id, 3_000);
    const r = await reportUsage(redis, id, 'paused');
    expect(r.closedMs).toBeGreaterThanOrEqual(3_000);
    expect(r.closedMs).toBeLessThan(4_000);
  });
});
