/**
 * A team's open-streams count against a real Redis (its clock is the leases' clock): a burst admits
 * exactly the quota, a closed stream frees its place at once, a stream whose agent died (never
 * renewed, never removed) stops counting after one lease, an open one is renewed past its lease,
 * teams do not share a count, 0 is unlimited.
 */
import { Redis } from 'ioredis';
import pino from 'pino';
import { afterAll, beforeEach, describe, expect, inject, it } from 'vitest';
import { SpaceError } from '../../core/errors.ts';
import { keys } from '../../core/redis-keys.ts';
import { TeamStreams } from './team-streams.ts';

const redis = new Redis(inject('redisUrl'), { db: 7 });
const log = pino({ level: 'silent' });
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
afterAll(() => redis.disconnect());
beforeEach(async () => {
  await redis.flushdb();
});

const refusal = (p: Promise<unknown>) =>
  p.then(
    () => null,
    (e: unknown) => (e instanceof SpaceError ? { code: e.code, status: e.status, details: e.details } : e),
  );

describe('team streams', () => {
  it('a concurrent burst admits exactly the quota; the rest get RATE_LIMITED with the limit', async () => {
    const streams = new TeamStreams({ redis, log });
    const tries = await Promise.allSettled(Array.from({ length: 20 }, () => streams.open('t1', 5)));
    const ok = tries.filter((t) => t.status === 'fulfilled');
    expect(ok).toHaveLength(5);
    expect(await redis.zcard(keys.teamStreams('t1'))).toBe(5);
    expect(await refusal(streams.open('t1', 5))).toEqual({
      code: 'RATE_LIMITED',
      status: 429,
      details: { team: 't1', quota: 'streams', limit: 5, current: 5 },
    });
    // another team's count is its own
    await streams.open('t2', 5);
    expect(await redis.zcard(keys.teamStreams('t2'))).toBe(1);
    for (const t of ok) (t as PromiseFulfilledResult<() => void>).value();
  });

  it('a closed stream frees its place at once; closing twice frees one place', async () => {
    const streams = new TeamStreams({ redis, log });
    const a = await streams.open('t1', 2);
    await streams.open('t1', 2);
    a();
    a();
    await sleep(50);
    expect(await redis.zcard(keys.teamStreams('t1'))).toBe(1);
    await streams.open('t1', 2);
    expect((await refusal(streams.open('t1', 2))) as { code: string }).toMatchObject({
      code: 'RATE_LIMITED',
    });
  });

  it('a dead agent’s stream stops counting after one lease; a live one is renewed past it', async () => {
    const live = new TeamStreams({ redis, log, leaseMs: 300 });
    const close = await live.open('t1', 2);
    // the dead agent: admitted, then never renewed nor removed (its process is gone)
    await redis.zadd(keys.teamStreams('t1'), (await redisNowMs()) + 300, 'dead-agent-stream');
    expect((await refusal(live.open('t1', 2))) as { code: string }).toMatchObject({ code: 'RATE_LIMITED' });
    await sleep(700);
    // two leases later: the live stream is still counted (renewed), the dead one is not
    expect(await redis.zscore(keys.teamStreams('t1'), 'dead-agent-stream')).not.toBeNull(); // pruned on admit only
    const next = await live.open('t1', 2);
    expect(await redis.zscore(keys.teamStreams('t1'), 'dead-agent-stream')).toBeNull();
    expect(await redis.zcard(keys.teamStreams('t1'))).toBe(2);
    close();
    next();
    await sleep(50);
    expect(await redis.exists(keys.teamStreams('t1'))).toBe(0);
  });

  it('0 is unlimited', async () => {
    const streams = new TeamStreams({ redis, log });
    for (let i = 0; i < 30; i++) await streams.open('t1', 0);
    expect(await redis.zcard(keys.teamStreams('t1'))).toBe(30);
  });
});

async function redisNowMs(): Promise<number> {
  const [s, us] = await redis.time();
  return Number(s) * 1000 + Math.floor(Number(us) / 1000);
}
