/** Reconciler against a real Redis: restarts within the grace keep sandboxes; dead nodes and missing ones lose them. */
import { Redis } from 'ioredis';
import pino from 'pino';
import { afterAll, beforeEach, describe, expect, inject, it } from 'vitest';
import { NodeRegistry } from '../agent/registry.ts';
import { keys } from '../core/redis-keys.ts';
import { UNLIMITED_QUOTAS } from '../core/tenancy.ts';
import { OperationStore } from './operations.ts';
import { MAX_RESTART_HOLD_MS, NODE_LOST_GRACE_MS, Reconciler } from './reconciler.ts';
import { withScripts } from './redis-scripts.ts';
import { SandboxStore } from './sandbox-store.ts';
import { newSandbox } from './test-records.ts';

const redis = withScripts(new Redis(inject('redisUrl'), { db: 4 }));
const sandboxes = new SandboxStore(redis);
const reconciler = new Reconciler(sandboxes, new OperationStore(redis), pino({ level: 'silent' }));
afterAll(() => redis.disconnect());
beforeEach(async () => {
  await redis.flushdb();
});

async function runningOn(node: string, id: string, at: number) {
  await redis
    .multi()
    .sadd(keys.nodeIndex(), node)
    .hset(keys.node(node), {
      id: node,
      driver: 'gvisor',
      schedulable: '1',
      vcpusMilli: '8000',
      memoryMiB: '8192',
      maxSandboxes: '10',
      usedVcpusMilli: '0',
      usedMemoryMiB: '0',
      sandboxes: '0',
      templates: 'base',
    })
    .set(keys.nodeAlive(node), '1')
    .exec();
  const rec = await sandboxes.create(newSandbox(id, { timeoutSec: 3600 }), UNLIMITED_QUOTAS, at);
  await sandboxes.place(rec);
  await sandboxes.transition(id, 'running', {}, at);
}

describe('Reconciler', () => {
  it('keeps the sandboxes of a node that restarts within the grace, and declares them lost after it', async () => {
    const t0 = Date.now() - 10 * 60_000;
    await runningOn('n1', 'sbx_recon0000000000001', t0);
    await redis.del(keys.nodeAlive('n1'));
    await redis.hset(keys.node('n1'), 'heartbeatAt', String(Date.now() - 10_000));
    expect(await reconciler.pass()).toEqual({ lost: [], requeued: [] });
    expect((await sandboxes.get('sbx_recon0000000000001'))?.state).toBe('running');
    await redis.hset(keys.node('n1'), 'heartbeatAt', String(Date.now() - NODE_LOST_GRACE_MS - 1000));
    expect((await reconciler.pass()).lost).toEqual(['sbx_recon0000000000001']);
    expect(await sandboxes.get('sbx_recon0000000000001')).toMatchObject({
      state: 'killing',
      killReason: 'node_lost',
    });
  });

  it('redis-outage-past-grace: silence while Redis was away does not make a node lost', async () => {
    const own = new Reconciler(sandboxes, new OperationStore(redis), pino({ level: 'silent' }));
    const t0 = Date.now() - 10 * 60_000;
    await runningOn('n2', 'sbx_recon0000000000009', t0);
    // Redis was away longer than the grace: the alive key expired, the last heartbeat is old
    await redis.del(keys.nodeAlive('n2'));
    await redis.hset(keys.node('n2'), 'heartbeatAt', String(Date.now() - NODE_LOST_GRACE_MS - 30_000));
    own.noteStoreOutage(Date.now() - 1000);
    expect(await own.pass()).toEqual({ lost: [], requeued: [] });
    expect(await redis.hget(keys.node('n2'), 'lostAt')).toBeNull();
    expect((await sandboxes.get('sbx_recon0000000000009'))?.state).toBe('running');
    // a node still silent a whole grace after Redis came back is lost
    expect((await own.pass(Date.now() + NODE_LOST_GRACE_MS + 1000)).lost).toEqual(['sbx_recon0000000000009']);
  });

  it('a restart the agent announced holds its node past the grace until it said it would be back, capped; its next heartbeat ends the hold', async () => {
    const own = new Reconciler(sandboxes, new OperationStore(redis), pino({ level: 'silent' }));
    const id = 'sbx_recon0000000000010';
    await runningOn('n5', id, Date.now() - 60_000);
    const registry = new NodeRegistry({
      redis,
      registration: {
        id: 'n5',
        url: 'http://127.0.0.1:1',
        driver: 'gvisor',
        capabilities: [],
        protocol: 3,
        version: 'test',
        vcpus: 8,
        memoryMiB: 8192,
        maxSandboxes: 10,
        hibernateStore: 'local',
      },
      log: pino({ level: 'silent' }),
      state: () => ({
        schedulable: true,
        templates: ['base'],
        warm: {},
        warmHeld: { memoryMiB: 0, slotFootprintMiB: 0, slotVcpusMilli: 0, slotMemoryMiB: 0 },
        sandboxes: [id],
        disk: null,
      }),
    });
    const stopAndExpire = async (holdMs: number) => {
      await registry.beat();
      const at = Date.now();
      await registry.stop(false, holdMs);
      await redis.del(keys.nodeAlive('n5'));
      return at;
    };
    // a restart slower than the grace: held until restartBy
    const at = await stopAndExpire(10 * 60_000);
    expect(Number(await redis.hget(keys.node('n5'), 'restartBy'))).toBeGreaterThanOrEqual(at + 10 * 60_000);
    expect(await own.pass(at + NODE_LOST_GRACE_MS + 60_000)).toEqual({ lost: [], requeued: [] });
    expect(await own.pass(at + 9 * 60_000)).toEqual({ lost: [], requeued: [] });
    expect((await sandboxes.get(id))?.state).toBe('running');
    // the agent came back: its heartbeat ends the hold
    await registry.beat();
    expect(await redis.hget(keys.node('n5'), 'restartBy')).toBeNull();
    // a hold longer than the cap counts from the last heartbeat for MAX_RESTART_HOLD_MS only
    const long = await stopAndExpire(24 * 60 * 60_000);
    expect(await own.pass(long + MAX_RESTART_HOLD_MS - 60_000)).toEqual({ lost: [], requeued: [] });
    expect((await own.pass(long + MAX_RESTART_HOLD_MS + 60_000)).lost).toEqual([id]);
  });

  it('without a hold (SPACE_AGENT_RESTART_HOLD_MS=0, or a node going away) the grace alone decides', async () => {
    const id = 'sbx_recon0000000000011';
    await runningOn('n6', id, Date.now() - 60_000);
    await redis.del(keys.nodeAlive('n6'));
    const at = Date.now();
    await redis.hset(keys.node('n6'), 'heartbeatAt', String(at));
    expect((await reconciler.pass(at + NODE_LOST_GRACE_MS + 1000)).lost).toEqual([id]);
  });

  it('declares lost a sandbox an alive node stopped reporting, and records a crash the node saw', async () => {
    const t0 = Date.now() - 10 * 60_000;
    await runningOn('n2', 'sbx_recon0000000000002', t0);
    await runningOn('n2', 'sbx_recon0000000000003', t0);
    await runningOn('n2', 'sbx_recon0000000000004', t0);
    await redis.hset(keys.node('n2'), { inventoryAt: String(Date.now()), heartbeatAt: String(Date.now()) });
    await redis.sadd(keys.nodeInventory('n2'), 'sbx_recon0000000000002');
    await redis.hset(keys.nodeEnded('n2'), 'sbx_recon0000000000004', 'it ran out of memory');
    const { lost } = await reconciler.pass();
    expect(lost.sort()).toEqual(['sbx_recon0000000000003', 'sbx_recon0000000000004']);
    expect((await sandboxes.get('sbx_recon0000000000002'))?.state).toBe('running');
    expect(await sandboxes.get('sbx_recon0000000000003')).toMatchObject({ killReason: 'node_lost' });
    expect(await sandboxes.get('sbx_recon0000000000004')).toMatchObject({ killReason: 'crashed' });
    expect(await redis.hlen(keys.nodeEnded('n2'))).toBe(0);
  });
});

describe('Reconciler: deletes the node could not confirm', () => {
  it('f2-fence: fences a lost node once and queues one delete per ending sandbox until it finishes', async () => {
    const t0 = Date.now() - 10 * 60_000;
    await runningOn('n3', 'sbx_recon0000000000005', t0);
    await sandboxes.markKilling('sbx_recon0000000000005', 'request');
    await redis.del(keys.nodeAlive('n3'));
    await redis.hset(keys.node('n3'), 'heartbeatAt', String(Date.now() - NODE_LOST_GRACE_MS - 1000));
    expect((await reconciler.pass()).requeued).toEqual(['sbx_recon0000000000005']);
    const lostAt = await redis.hget(keys.node('n3'), 'lostAt');
    expect(lostAt).not.toBeNull();
    // the queued delete is still pending: no second one
    expect((await reconciler.pass()).requeued).toEqual([]);
    expect(await redis.hget(keys.node('n3'), 'lostAt')).toBe(lostAt);
  });

  it('f2-node-dropped-it: finishes the delete of a killing sandbox its alive node no longer runs', async () => {
    const t0 = Date.now() - 10 * 60_000;
    await runningOn('n4', 'sbx_recon0000000000006', t0);
    await runningOn('n4', 'sbx_recon0000000000007', t0);
    const asked = Date.now() - 10_000; // deleted 10 s ago: not stuck yet
    await sandboxes.transition('sbx_recon0000000000006', 'killing', { killReason: 'request' }, asked);
    await sandboxes.transition('sbx_recon0000000000007', 'killing', { killReason: 'request' }, asked);
    await redis.hset(keys.node('n4'), { inventoryAt: String(Date.now()), heartbeatAt: String(Date.now()) });
    // the node still runs 7 (its destroy is under way) and dropped 6
    await redis.sadd(keys.nodeInventory('n4'), 'sbx_recon0000000000007');
    expect((await reconciler.pass()).requeued).toEqual(['sbx_recon0000000000006']);
    expect(await redis.hget(keys.node('n4'), 'lostAt')).toBeNull();
  });
});
