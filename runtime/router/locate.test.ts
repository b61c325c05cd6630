/**
 * SandboxLocator against a real Redis: a node whose alive key expired while Redis was away is not
 * read as gone (the outage rule of core/store-outage.ts), a node silent on its own is.
 */
import { Redis } from 'ioredis';
import { afterAll, beforeEach, describe, expect, inject, it } from 'vitest';
import { keys, NODE_ALIVE_TTL_MS } from '../core/redis-keys.ts';
import { StoreOutage } from '../core/store-outage.ts';
import { SandboxLocator } from './locate.ts';
import { createRouterMetrics } from './metrics.ts';

const redis = new Redis(inject('redisUrl'), { db: 12 });
afterAll(() => redis.disconnect());
beforeEach(async () => {
  await redis.flushdb();
});

describe('f8 SandboxLocator and Redis outages', () => {
  it('forwards to a node whose alive key expired during an outage; refuses a fenced or silent one', async () => {
    const id = 'sbx_locate00000000000001';
    const heardAt = Date.now() - 20_000; // its key has expired: silent 20 s > the alive TTL
    await redis.hset(keys.sandbox(id), { state: 'running', nodeId: 'n1', team: 'default' });
    await redis.hset(keys.node('n1'), { id: 'n1', url: 'http://n1:8081', heartbeatAt: String(heardAt) });
    const outage = new StoreOutage();
    const locator = new SandboxLocator(redis, createRouterMetrics(), { resumeTimeoutMs: 1_000, outage });
    // no outage seen: the silence is the node's
    await expect(locator.locate(id, { team: 'default' })).rejects.toMatchObject({ code: 'NODE_UNAVAILABLE' });
    // Redis was away from just after its last heartbeat until now: the silence was Redis's
    for (let t = heardAt + 1_000; t < Date.now(); t += 2_000) outage.down(t);
    outage.up();
    await expect(locator.locate(id, { team: 'default' })).resolves.toMatchObject({
      nodeId: 'n1',
      url: 'http://n1:8081',
    });
    // fenced as lost: gone whatever the outage
    await redis.hset(keys.node('n1'), 'lostAt', String(Date.now()));
    await expect(locator.locate(id, { team: 'default' })).rejects.toMatchObject({ code: 'NODE_UNAVAILABLE' });
    // a full alive TTL after the outage without a heartbeat: gone
    await redis.hdel(keys.node('n1'), 'lostAt');
    const later = new StoreOutage();
    later.down(heardAt + 1_000);
    later.up(Date.now() - NODE_ALIVE_TTL_MS - 1);
    const strict = new SandboxLocator(redis, createRouterMetrics(), {
      resumeTimeoutMs: 1_000,
      outage: later,
    });
    await expect(strict.locate(id, { team: 'default' })).rejects.toMatchObject({ code: 'NODE_UNAVAILABLE' });
  });
});
