/**
 * Metering arithmetic against a real Redis (its clock is the meter's clock): overlapping commands
 * make one active interval, a stream held across a pause is billed as paused, an agent that dies
 * mid-interval loses nothing, skewed node clocks change nothing, totals add up to the metered
 * life exactly, and range queries agree with the totals.
 */
import { Redis } from 'ioredis';
import pino from 'pino';
import { afterAll, afterEach, beforeEach, describe, expect, inject, it, vi } from 'vitest';
import { queryUsage, sandboxUsage } from '../../api/usage.ts';
import { keys } from '../../core/redis-keys.ts';
import { reportUsage } from '../../core/usage.ts';
import { ActivityMeter } from './activity.ts';

const redis = new Redis(inject('redisUrl'), { db: 5 });
const log = pino({ level: 'silent' });
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
afterAll(() => redis.disconnect());
beforeEach(async () => {
  await redis.flushdb();
});
afterEach(() => {
  vi.useRealTimers();
});

/** A running sandbox record as the API writes it (the meter reads its dimensions from it). */
async function sandbox(
  id: string,
  o: { vcpus?: number; memoryMiB?: number; template?: string; apiKey?: string } = {},
) {
  await redis.hset(keys.sandbox(id), {
    id,
    state: 'running',
    vcpus: String(o.vcpus ?? 2),
    memoryMiB: String(o.memoryMiB ?? 1024),
    template: o.template ?? 'base',
    apiKey: o.apiKey ?? 'k1',
    autoPauseSec: '0',
  });
  await reportUsage(redis, id, 'idle'); // what the API reports when the create finishes
}

const within = (actual: number, expected: number, tolerance: number) =>
  expect(Math.abs(actual - expected), `${actual} ≈ ${expected} ± ${tolerance}`).toBeLessThanOrEqual(
    tolerance,
  );

describe('activity metering', () => {
  it('overlapping commands and requests make one active interval (no double counting), then grace, then idle', async () => {
    await sandbox('sbx_overlap01');
    const m = new ActivityMeter({ redis, graceMs: 100, log });
    m.track('sbx_overlap01');
    const t0 = Date.now();
    const endA = m.begin('sbx_overlap01');
    await sleep(200);
    const endB = m.begin('sbx_overlap01');
    await sleep(200);
    endA();
    endA(); // idempotent
    await sleep(200);
    endB();
    const busyFor = Date.now() - t0;
    await sleep(400);
    await m.sync();
    expect(m.state('sbx_overlap01')).toMatchObject({ desired: 'idle', reported: 'idle', busy: 0 });
    const u = await sandboxUsage(redis, 'sbx_overlap01');
    within(u.seconds.active * 1000, busyFor + 100, 80);
    expect(u.vcpuSeconds.active).toBeCloseTo(u.seconds.active * 2, 2);
    expect(u.gibSeconds.active).toBeCloseTo(u.seconds.active * 1, 2);
  });

  it('a stream held open across a pause is billed as paused, then active again on resume', async () => {
    await sandbox('sbx_pausedst1');
    const m = new ActivityMeter({ redis, graceMs: 50, log });
    m.track('sbx_pausedst1');
    const end = m.begin('sbx_pausedst1'); // a stream opens
    await sleep(150);
    await m.sync();
    // the API pauses it: paused is reported by the operation, and the node stops reporting
    m.paused('sbx_pausedst1');
    await reportUsage(redis, 'sbx_pausedst1', 'paused');
    await sleep(300);
    await m.sync(); // must not report anything while paused
    expect((await redis.hget(keys.usageOpen('sbx_pausedst1'), 'state')) as string).toBe('paused');
    await reportUsage(redis, 'sbx_pausedst1', 'idle', 'paused'); // the API: resumed
    m.resumed('sbx_pausedst1'); // the stream is still open: active again
    await m.sync();
    await sleep(100);
    end();
    await sleep(150);
    await m.sync();
    const u = await sandboxUsage(redis, 'sbx_pausedst1');
    within(u.seconds.paused * 1000, 300, 60);
    within(u.seconds.active * 1000, 150 + 100 + 50, 80);
  });

  it('an agent that dies mid-interval loses nothing: the next agent closes the interval it left open', async () => {
    await sandbox('sbx_restart01');
    const before = new ActivityMeter({ redis, graceMs: 50, log });
    before.track('sbx_restart01');
    before.begin('sbx_restart01'); // a command runs … and the agent is SIGKILLed (never ends it)
    await before.sync();
    const t0 = Date.now();
    await sleep(300);
    const after = new ActivityMeter({ redis, graceMs: 50, log });
    after.track('sbx_restart01', { reported: null }); // re-adopted: nothing reported by this agent yet
    await after.sync();
    const u = await sandboxUsage(redis, 'sbx_restart01');
    within(u.seconds.active * 1000, Date.now() - t0, 60);
    expect(u.state).toBe('idle');
  });

  it('skewed node clocks change nothing: every interval is timed on the Redis clock', async () => {
    await sandbox('sbx_skewed001');
    vi.useFakeTimers({ toFake: ['Date'] });
    vi.setSystemTime(Date.now() + 3 * 3600_000); // this "node" runs 3 h ahead
    const fast = new ActivityMeter({ redis, graceMs: 10_000, log });
    fast.track('sbx_skewed001');
    const end = fast.begin('sbx_skewed001');
    await fast.sync();
    vi.setSystemTime(Date.now() - 6 * 3600_000); // and another one 3 h behind
    await sleep(250);
    end();
    await reportUsage(redis, 'sbx_skewed001', 'paused'); // reported by the API on the slow node
    vi.useRealTimers();
    const u = await sandboxUsage(redis, 'sbx_skewed001');
    within(u.seconds.active * 1000, 250, 60);
    // the closed minute is now (Redis time), not 3 h either way
    const [sec] = await redis.time();
    const minute = Math.floor((Number(sec) * 1000) / 60_000);
    const fields = {
      ...(await redis.hgetall(keys.usageMinute(minute))),
      ...(await redis.hgetall(keys.usageMinute(minute - 1))),
    };
    expect(Object.keys(fields)).toContain('sbx_skewed001|active');
  });

  it('totals add up to the metered life exactly, and a range query agrees with them', async () => {
    await sandbox('sbx_sum000001', { template: 'base', apiKey: 'alpha' });
    await sandbox('sbx_sum000002', { template: 'py', apiKey: 'alpha', vcpus: 1, memoryMiB: 512 });
    const from = Date.now() - 1000;
    for (const state of ['active', 'idle', 'paused', 'idle', 'active'] as const) {
      await reportUsage(redis, 'sbx_sum000001', state);
      await reportUsage(redis, 'sbx_sum000002', state === 'active' ? 'idle' : 'active');
      await sleep(60);
    }
    // ended: the record says killed, and reports after the end never reopen an interval
    await redis.hset(keys.sandbox('sbx_sum000001'), 'state', 'killed');
    await reportUsage(redis, 'sbx_sum000001', 'ended');
    expect((await reportUsage(redis, 'sbx_sum000001', 'active')).state).toBeNull();
    const one = await sandboxUsage(redis, 'sbx_sum000001');
    expect(one.endedAt).not.toBeNull();
    const total = one.seconds.active + one.seconds.idle + one.seconds.paused;
    within(total * 1000, Date.parse(one.endedAt!) - Date.parse(one.startedAt!), 1);

    const bySandbox = await queryUsage(
      redis,
      { fromMs: from, toMs: Date.now() + 1000 },
      'sandbox',
      'default',
    );
    const g1 = bySandbox.groups.find((g) => g.key === 'sbx_sum000001')!;
    for (const s of ['active', 'idle', 'paused'] as const) within(g1.seconds[s], one.seconds[s], 0.002);
    const byTemplate = await queryUsage(
      redis,
      { fromMs: from, toMs: Date.now() + 1000 },
      'template',
      'default',
    );
    expect(byTemplate.groups.map((g) => g.key)).toEqual(['base', 'py']);
    const byKey = await queryUsage(redis, { fromMs: from, toMs: Date.now() + 1000 }, 'apiKey', 'default');
    expect(byKey.groups.map((g) => g.key)).toEqual(['alpha']);
    within(byKey.total.seconds.active, byTemplate.total.seconds.active, 0.002);
    // sandbox 2 is still open: its current interval counts up to the query
    const two = bySandbox.groups.find((g) => g.key === 'sbx_sum000002')!;
    expect(two.seconds.active).toBeGreaterThan(0);
    // vCPU- and GiB-seconds follow each sandbox's shape
    const py = byTemplate.groups.find((g) => g.key === 'py')!;
    within(py.vcpuSeconds.active, py.seconds.active * 1, 0.002);
    within(py.gibSeconds.active, py.seconds.active * 0.5, 0.002);
  });

  it('an idle running sandbox with autoPauseSec goes on the auto-pause timer; activity takes it off', async () => {
    await sandbox('sbx_autop0001');
    await redis.hset(keys.sandbox('sbx_autop0001'), 'autoPauseSec', '30');
    await reportUsage(redis, 'sbx_autop0001', 'active');
    expect(await redis.zscore(keys.autoPause(), 'sbx_autop0001')).toBeNull();
    const r = await reportUsage(redis, 'sbx_autop0001', 'idle');
    expect(Number(await redis.zscore(keys.autoPause(), 'sbx_autop0001'))).toBe(r.at + 30_000);
    // a repeated idle report keeps the first deadline (the idle period did not restart)
    await sleep(20);
    await reportUsage(redis, 'sbx_autop0001', 'idle');
    expect(Number(await redis.zscore(keys.autoPause(), 'sbx_autop0001'))).toBe(r.at + 30_000);
    await reportUsage(redis, 'sbx_autop0001', 'active');
    expect(await redis.zscore(keys.autoPause(), 'sbx_autop0001')).toBeNull();
  });

  it('a usage query refuses an empty or too long range', async () => {
    await expect(
      queryUsage(redis, { fromMs: 2_000_000, toMs: 1_000_000 }, 'sandbox', 'default'),
    ).rejects.toThrow(/after/);
    await expect(
      queryUsage(redis, { fromMs: 0, toMs: 40 * 86_400_000 }, 'sandbox', 'default'),
    ).rejects.toThrow(/31 days/);
  });
});
