/**
 * Capacity at admission and the outage rule in the Lua placement, against a real Redis: admit.lua
 * places a create on a node with room in the step that admits it (so a burst cannot over-fill a
 * node, and a refused create writes nothing), and place.lua, admit.lua and the node store read a
 * node whose alive key expired during a Redis outage as alive for one TTL after it.
 */
import { Redis } from 'ioredis';
import { afterAll, beforeEach, describe, expect, inject, it } from 'vitest';
import { SpaceError } from '../core/errors.ts';
import { retryAfterSec } from '../core/http-errors.ts';
import { keys, NODE_ALIVE_TTL_MS } from '../core/redis-keys.ts';
import { StoreOutage } from '../core/store-outage.ts';
import { UNLIMITED_QUOTAS } from '../core/tenancy.ts';
import { toE2bError } from './e2b/shapes.ts';
import { NodeStore } from './node-store.ts';
import { OperationStore } from './operations.ts';
import { ROOM_RETRY_AFTER_SEC } from './placement.ts';
import { withScripts } from './redis-scripts.ts';
import { SandboxStore } from './sandbox-store.ts';
import { newSandbox } from './test-records.ts';

const redis = withScripts(new Redis(inject('redisUrl'), { db: 14 }));
const store = new SandboxStore(redis);
const ops = new OperationStore(redis);
afterAll(() => redis.disconnect());
beforeEach(async () => {
  await redis.flushdb();
});

/** Registers node `id` as an agent does: room for `max` sandboxes; alive key unless `alive` is false. */
async function node(id: string, max: number, opts: { alive?: boolean; heartbeatAt?: number } = {}) {
  const m = redis
    .multi()
    .sadd(keys.nodeIndex(), id)
    .hset(keys.node(id), {
      id,
      url: `http://${id}`,
      driver: 'gvisor',
      templates: 'base',
      schedulable: '1',
      vcpusMilli: '64000',
      memoryMiB: '65536',
      maxSandboxes: String(max),
      usedVcpusMilli: '0',
      usedMemoryMiB: '0',
      sandboxes: '0',
      hibernateStore: '',
      heartbeatAt: String(opts.heartbeatAt ?? Date.now()),
    });
  if (opts.alive !== false) m.set(keys.nodeAlive(id), '1');
  await m.exec();
}

const sandbox = (id: string) => newSandbox(id, { vcpus: 0.5, memoryMiB: 128, team: 'ta' });

/** Admits sandbox `n` with its create operation, placed at admission through `outage`. */
const admit = (n: number, outage = new StoreOutage()) => {
  const id = `sbx_room${String(n).padStart(16, '0')}`;
  return store.admit(
    sandbox(id),
    { ...UNLIMITED_QUOTAS, createsPerMinute: 1000 },
    Date.now(),
    ops.draft('sandbox.create', id, {}, 'ta'),
    undefined,
    { outage },
  );
};

describe('f10 capacity at admission (admit.lua)', () => {
  it('a concurrent burst admits exactly the room there is; each refusal is retryable, carries Retry-After and writes nothing', async () => {
    await node('n1', 3);
    const all = await Promise.allSettled(Array.from({ length: 12 }, (_, i) => admit(i)));
    const admitted = all.flatMap((r) => (r.status === 'fulfilled' && 'admitted' in r.value ? [r.value] : []));
    const refused = all.flatMap((r) => (r.status === 'rejected' ? [r.reason as SpaceError] : []));
    expect(admitted.length).toBe(3);
    expect(refused.length).toBe(9);
    for (const e of refused) {
      expect(e).toMatchObject({ code: 'NODE_CAPACITY_EXHAUSTED', status: 503, retryable: true });
      expect(retryAfterSec(e)).toBe(ROOM_RETRY_AFTER_SEC);
      // E2B clients read no room as their rate-limit error
      expect(toE2bError(e).code).toBe(429);
    }
    // admitted ones hold their node's share from the start, as the record says
    for (const a of admitted) expect(a.admitted.nodeId).toBe('n1');
    const [count, cpu, mem] = await redis.hmget(
      keys.node('n1'),
      'sandboxes',
      'usedVcpusMilli',
      'usedMemoryMiB',
    );
    expect([count, cpu, mem]).toEqual(['3', '1500', '384']);
    expect((await redis.smembers(keys.nodeSandboxes('n1'))).sort()).toEqual(
      admitted.map((a) => a.admitted.id).sort(),
    );
    // the refused left no record, no team reservation, no rate-window entry, no queued operation
    expect(await redis.zcard(keys.sandboxIndex())).toBe(3);
    expect(await redis.hget(keys.teamUsage('ta'), 'sandboxes')).toBe('3');
    expect(await redis.zcard(keys.teamCreates('ta'))).toBe(3);
    expect(await redis.xlen(keys.operationQueue())).toBe(3);
    // place.lua (the worker) finds each admitted create's node again, reserving nothing more
    const rec = (await store.get(admitted[0]!.admitted.id))!;
    expect(await store.place(rec)).toMatchObject({ nodeId: 'n1', alive: true });
    expect(await redis.hget(keys.node('n1'), 'sandboxes')).toBe('3');
    // room freed (a release) admits again
    await store.release(rec.id);
    await expect(admit(100)).resolves.toHaveProperty('admitted.nodeId', 'n1');
  });

  it('prefers the least loaded node, and with no live node refuses NODE_UNAVAILABLE', async () => {
    await node('n1', 2);
    await node('n2', 2);
    const a = await admit(1);
    const b = await admit(2);
    const placed = [a, b].map((r) => ('admitted' in r ? r.admitted.nodeId : null)).sort();
    expect(placed).toEqual(['n1', 'n2']);
    await redis.del(keys.nodeAlive('n1'), keys.nodeAlive('n2'));
    await expect(admit(3)).rejects.toMatchObject({ code: 'NODE_UNAVAILABLE', retryable: true });
  });
});

describe('f8 the outage rule in the placement scripts and the node store', () => {
  /** An outage that ended `agoMs` ago and began 22 s before that. */
  function outageEnded(agoMs: number): StoreOutage {
    const o = new StoreOutage();
    const end = Date.now() - agoMs;
    // ioredis reports each failed reconnect (every 2 s at most), then ready
    for (let t = end - 22_000; t <= end; t += 2_000) o.down(t);
    o.up(end);
    return o;
  }

  it('a node whose key expired during the outage is placed on and reads alive; a fenced or long-dead one is not', async () => {
    const before = Date.now() - 22_000 - 2_000;
    await node('n1', 4, { alive: false, heartbeatAt: before });
    const recent = outageEnded(1_000);
    // strictly (no outage seen) the node is gone
    await expect(admit(1)).rejects.toMatchObject({ code: 'NODE_UNAVAILABLE' });
    expect((await new NodeStore(redis, new StoreOutage()).get('n1'))?.alive).toBe(false);
    // through the outage it is alive: admitted, placed, listed alive, found again by place.lua
    const got = await admit(2, recent);
    expect('admitted' in got && got.admitted.nodeId).toBe('n1');
    const nodes = new NodeStore(redis, recent);
    expect((await nodes.get('n1'))?.alive).toBe(true);
    expect((await nodes.list())[0]?.alive).toBe(true);
    const rec = (await store.get('admitted' in got ? got.admitted.id : ''))!;
    expect(await store.place(rec, '', recent)).toMatchObject({ nodeId: 'n1', alive: true });
    expect(await store.place(rec)).toMatchObject({ nodeId: 'n1', alive: false });
    // a dispatch is not aborted for the missing key (the watch polls once a second; the call
    // gives up as a real dispatch does when its signal aborts)
    const call = await nodes.whileAlive(
      'n1',
      (signal) =>
        new Promise((resolve, reject) => {
          const t = setTimeout(() => resolve('answered'), 1_500);
          signal.addEventListener('abort', () => {
            clearTimeout(t);
            reject(new Error('aborted'));
          });
        }),
    );
    expect(call).toBe('answered');
    // one TTL after the outage ended, its silence is its own
    await expect(admit(3, outageEnded(NODE_ALIVE_TTL_MS + 1))).rejects.toMatchObject({
      code: 'NODE_UNAVAILABLE',
    });
    // fenced as lost: never presumed
    await redis.hset(keys.node('n1'), 'lostAt', String(Date.now()));
    await expect(admit(4, recent)).rejects.toMatchObject({ code: 'NODE_UNAVAILABLE' });
    expect((await nodes.get('n1'))?.alive).toBe(false);
    // silent a whole TTL before the outage began: dead before it
    await redis.hdel(keys.node('n1'), 'lostAt');
    await redis.hset(keys.node('n1'), 'heartbeatAt', String(before - NODE_ALIVE_TTL_MS - 22_000));
    await expect(admit(5, recent)).rejects.toMatchObject({ code: 'NODE_UNAVAILABLE' });
  });

  it('retryAfterSec: the control plane outage, a rate window, room; nothing for other refusals', () => {
    expect(retryAfterSec(new SpaceError('CONTROL_PLANE_UNAVAILABLE', 'x'))).toBe(2);
    expect(retryAfterSec(new SpaceError('RATE_LIMITED', 'x', { retryAfterSec: 60 }))).toBe(60);
    expect(retryAfterSec(new SpaceError('NODE_UNAVAILABLE', 'x'))).toBeNull();
    expect(retryAfterSec(new SpaceError('RATE_LIMITED', 'x', { retryAfterSec: -1 }))).toBeNull();
  });
});
