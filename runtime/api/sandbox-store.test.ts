/** SandboxStore against a real Redis: pagination, filters, transitions, placement and expiry scripts. */

import { Redis } from 'ioredis';
import { afterAll, beforeEach, describe, expect, inject, it } from 'vitest';
import { newSandboxId } from '../core/ids.ts';
import { KEY_PREFIX, keys } from '../core/redis-keys.ts';
import { UNLIMITED_QUOTAS } from '../core/tenancy.ts';
import { OperationStore } from './operations.ts';
import { withScripts } from './redis-scripts.ts';
import { SandboxStore, TIMEOUT_PAUSE_RETRY_MS } from './sandbox-store.ts';
import { newSandbox } from './test-records.ts';

const redis = withScripts(new Redis(inject('redisUrl'), { db: 3 }));
const store = new SandboxStore(redis);
afterAll(() => redis.disconnect());
beforeEach(async () => {
  await redis.flushdb();
});

const make = (id: string, now: number, metadata: Record<string, string> = {}, team = 'default') =>
  store.create(newSandbox(id, { metadata, team }), UNLIMITED_QUOTAS, now);

/** Every id of the default team's listing, page by page (`limit` per page, at most 10 pages). */
async function listAll(limit: number): Promise<string[]> {
  const seen: string[] = [];
  let cursor: string | undefined;
  for (let guard = 0; guard < 10; guard++) {
    const page = await store.list({ limit, cursor, team: 'default' });
    seen.push(...page.sandboxes.map((s) => s.id));
    if (!page.nextCursor) break;
    cursor = page.nextCursor;
  }
  return seen;
}

async function addNode(id: string, vcpus: number, memoryMiB: number, warm = 0, driver = 'gvisor') {
  await redis
    .multi()
    .sadd(keys.nodeIndex(), id)
    .hset(keys.node(id), {
      id,
      url: `http://${id}:8081`,
      driver,
      schedulable: '1',
      vcpusMilli: String(vcpus * 1000),
      memoryMiB: String(memoryMiB),
      maxSandboxes: '100',
      usedVcpusMilli: '0',
      usedMemoryMiB: '0',
      sandboxes: '0',
      templates: 'base',
    })
    .set(keys.nodeAlive(id), '1')
    .hset(keys.nodeWarm(id), 'base', String(warm))
    .exec();
}

describe('SandboxStore', () => {
  it('writes an admitted sandbox and its queued create operation in one step; a refusal writes neither', async () => {
    const ops = new OperationStore(redis);
    const sandbox = (id: string) => newSandbox(id, { team: 'tq' });
    const quotas = { ...UNLIMITED_QUOTAS, sandboxes: 1 };
    const first = ops.draft('sandbox.create', 'sbx_admit00000000000001', {}, 'tq');
    await store.create(sandbox('sbx_admit00000000000001'), quotas, 1_000, first);
    expect(await ops.get(first.record.id)).toEqual(first.record);
    const queued = await redis.xrange(keys.operationQueue(), '-', '+');
    expect(queued.map(([, fields]) => fields)).toEqual([['id', first.record.id]]);
    // over the team's quota: no record, no operation, nothing queued
    const second = ops.draft('sandbox.create', 'sbx_admit00000000000002', {}, 'tq');
    await expect(
      store.create(sandbox('sbx_admit00000000000002'), quotas, 1_001, second),
    ).rejects.toMatchObject({
      code: 'QUOTA_EXCEEDED',
    });
    expect(await store.get('sbx_admit00000000000002')).toBeNull();
    expect(await ops.get(second.record.id)).toBeNull();
    expect(await redis.xlen(keys.operationQueue())).toBe(1);
  });

  it('an Idempotency-Key is claimed in the admission step or answered with the first sandbox (claim-or-return)', async () => {
    const ops = new OperationStore(redis);
    const sandbox = (id: string, memoryMiB = 512) => newSandbox(id, { memoryMiB, team: 'ti' });
    const key = keys.idempotency('ti', 'k1');
    const idem = (bodyHash: string) => ({ key, bodyHash, ttlSec: 60 });
    const quotas = { ...UNLIMITED_QUOTAS, memoryMiB: 1024 };
    // refused by a quota: no key is written, so the key stays free
    const big = ops.draft('sandbox.create', 'sbx_idem00000000000000', {}, 'ti');
    await expect(
      store.admit(sandbox('sbx_idem00000000000000', 2048), quotas, 1_000, big, idem('h1')),
    ).rejects.toMatchObject({ code: 'QUOTA_EXCEEDED' });
    expect(await redis.exists(key)).toBe(0);
    // admitted: the key holds the sandbox and its operation, written in the same step
    const first = ops.draft('sandbox.create', 'sbx_idem00000000000001', {}, 'ti');
    const made = await store.admit(sandbox('sbx_idem00000000000001'), quotas, 1_000, first, idem('h1'));
    expect(made).toMatchObject({ admitted: { id: 'sbx_idem00000000000001', state: 'creating' } });
    expect(JSON.parse((await redis.get(key))!)).toEqual({
      bodyHash: 'h1',
      sandboxId: 'sbx_idem00000000000001',
      operationId: first.record.id,
    });
    expect(await redis.ttl(key)).toBeGreaterThan(0);
    // the same body again: the first answer, nothing written, no quota or rate counted
    const again = ops.draft('sandbox.create', 'sbx_idem00000000000002', {}, 'ti');
    expect(await store.admit(sandbox('sbx_idem00000000000002'), quotas, 1_001, again, idem('h1'))).toEqual({
      replay: { sandboxId: 'sbx_idem00000000000001', operationId: first.record.id },
    });
    expect(await store.get('sbx_idem00000000000002')).toBeNull();
    expect(await ops.get(again.record.id)).toBeNull();
    expect(await store.reserved('ti')).toEqual({ sandboxes: 1, vcpus: 1, memoryMiB: 512 });
    // another body: a conflict, nothing written
    await expect(
      store.admit(sandbox('sbx_idem00000000000003'), quotas, 1_002, undefined, idem('h2')),
    ).rejects.toMatchObject({ code: 'IDEMPOTENCY_CONFLICT' });
    expect(await store.get('sbx_idem00000000000003')).toBeNull();
    // a key an API from before claim-or-return claimed without its operation yet
    await redis.set(key, JSON.stringify({ bodyHash: 'h3', sandboxId: 'sbx_idem00000000000004' }));
    await expect(
      store.admit(sandbox('sbx_idem00000000000005'), quotas, 1_003, undefined, idem('h3')),
    ).rejects.toMatchObject({ code: 'INTERNAL' });
  });

  it('pages through every sandbox exactly once, newest first, including equal timestamps', async () => {
    const ids: string[] = [];
    for (let i = 0; i < 25; i++) {
      const id = `sbx_page${String(i).padStart(16, '0')}`;
      ids.push(id);
      await make(id, 1_000 + Math.floor(i / 3), { team: i % 2 === 0 ? 'even' : 'odd' }); // 3 share each ms
    }
    const seen = await listAll(10);
    expect(seen.length).toBe(25);
    expect(new Set(seen).size).toBe(25);
    const created = seen.map((id) => Number(ids.indexOf(id)));
    expect(created.map((i) => Math.floor(i / 3))).toEqual(
      [...created.map((i) => Math.floor(i / 3))].sort((a, b) => b - a),
    );
    const even = await store.list({ limit: 100, metadata: { team: 'even' }, team: 'default' });
    expect(even.sandboxes.length).toBe(13);
    expect(await store.list({ limit: 100, state: ['running'], team: 'default' })).toEqual({
      sandboxes: [],
      nextCursor: null,
    });
  });

  it('hands out a cursor only when a match follows: a full last page ends the listing, filters included', async () => {
    for (let i = 0; i < 20; i++)
      await make(`sbx_full${String(i).padStart(16, '0')}`, 2_000 + Math.floor(i / 4), {
        k: i % 2 ? 'odd' : 'even',
      });
    // exactly two full pages: the second has no cursor (no extra, empty third page)
    const first = await store.list({ limit: 10, team: 'default' });
    expect(first.sandboxes).toHaveLength(10);
    const second = await store.list({ limit: 10, cursor: first.nextCursor!, team: 'default' });
    expect([second.sandboxes.length, second.nextCursor]).toEqual([10, null]);
    // the same with filters that leave exactly a page's worth (metadata; a predicate)
    expect((await store.list({ limit: 10, metadata: { k: 'odd' }, team: 'default' })).nextCursor).toBeNull();
    const odd = (r: { id: string }) => Number(r.id.slice(-2)) % 2 === 1;
    const byMatch = await store.list({ limit: 5, match: odd, team: 'default' });
    expect(byMatch.sandboxes.every(odd)).toBe(true);
    const rest = await store.list({ limit: 5, match: odd, cursor: byMatch.nextCursor!, team: 'default' });
    expect([rest.sandboxes.length, rest.nextCursor]).toEqual([5, null]);
    // one more than a page: a cursor, and a last page of one
    await make('sbx_full9999999999999999', 1_000); // the oldest: after the second page
    const again = await store.list({ limit: 10, cursor: first.nextCursor!, team: 'default' });
    expect(again.nextCursor).not.toBeNull();
    expect((await store.list({ limit: 21, team: 'default' })).nextCursor).toBeNull();
  });

  it("pages oldest first with order 'asc', every sandbox once, equal timestamps included", async () => {
    const ids: string[] = [];
    for (let i = 0; i < 23; i++) {
      const id = `sbx_asc${String(i).padStart(17, '0')}`;
      ids.push(id);
      await make(id, 3_000 + Math.floor(i / 3)); // 3 share each ms
    }
    const seen: string[] = [];
    let cursor: string | undefined;
    for (let guard = 0; guard < 10; guard++) {
      const page = await store.list({ limit: 4, order: 'asc', cursor, team: 'default' });
      seen.push(...page.sandboxes.map((s) => s.id));
      if (!page.nextCursor) break;
      cursor = page.nextCursor;
    }
    // ids sort like their creation order here (zero-padded), so oldest first is the ids in order
    expect(seen).toEqual(ids);
    expect((await store.list({ limit: 100, team: 'default' })).sandboxes.map((s) => s.id)).toEqual(
      [...ids].reverse(),
    );
  });

  it('a listing whose pages are mostly expired records prunes them and skips none of the live ones', async () => {
    // 120 sandboxes, every 4th left alive: a page of the index (50 ids at limit 20) holds ~13 live
    // ones, so each call reads past pruned members into the next page of the index
    const live: string[] = [];
    for (let i = 0; i < 120; i++) {
      const id = `sbx_prune${String(i).padStart(15, '0')}`;
      await make(id, 5_000 + i);
      if (i % 4 === 0) live.push(id);
      else await redis.del(keys.sandbox(id));
    }
    const seen = await listAll(20);
    expect(seen).toEqual([...live].reverse());
    expect(await redis.zcard(keys.teamSandboxes('default'))).toBe(live.length);
    expect(await redis.zcard(keys.sandboxIndex())).toBe(live.length);
  });

  it('a state filter without killed reads the live index: killing leaves it, a stale entry is pruned', async () => {
    const ids: string[] = [];
    for (let i = 0; i < 30; i++) {
      const id = `sbx_live${String(i).padStart(16, '0')}`;
      ids.push(id);
      await make(id, 7_000 + i);
    }
    // every third one stays; the rest are killed (creating → killing → killed)
    const kept = ids.filter((_, i) => i % 3 === 0);
    for (const id of ids.filter((_, i) => i % 3 !== 0)) {
      expect((await store.markKilling(id, 'request')).ok).toBe(true);
      expect((await store.markKilled(id, 'request')).ok).toBe(true);
    }
    const live = keys.teamLiveSandboxes('default');
    expect((await redis.zrange(live, 0, -1)).sort()).toEqual([...kept].sort());
    // an entry a version before this index left behind: killed, but still in the live index
    await store.markKilling(kept[0]!, 'request');
    await redis.hset(keys.sandbox(kept[0]!), 'state', 'killed');
    expect(await redis.zscore(live, kept[0]!)).not.toBeNull();
    const creating = await store.list({ limit: 100, state: ['creating'], team: 'default' });
    expect(creating.sandboxes.map((s) => s.id)).toEqual(kept.slice(1).reverse());
    expect(await redis.zscore(live, kept[0]!)).toBeNull();
    // the whole index still lists the killed ones
    const killed = await store.list({ limit: 100, state: ['killed'], team: 'default' });
    expect(killed.sandboxes).toHaveLength(ids.length - kept.length + 1);
    expect((await store.list({ limit: 100, team: 'default' })).sandboxes).toHaveLength(ids.length);
  });

  it("lists a team's sandboxes from its own index; records from before the index join it at start", async () => {
    const mk = (id: string, team: string, now: number) => make(id, now, {}, team);
    await mk('sbx_teamaaaaaaaaaaaaaaaa', 'ta', 1000);
    await mk('sbx_teambbbbbbbbbbbbbbbb', 'tb', 1001);
    await mk('sbx_teamaaaaaaaaaaaaaaab', 'ta', 1002);
    expect(await redis.zrange(keys.teamSandboxes('ta'), 0, -1)).toEqual([
      'sbx_teamaaaaaaaaaaaaaaaa',
      'sbx_teamaaaaaaaaaaaaaaab',
    ]);
    const ids = async (team: string) => (await store.list({ limit: 10, team })).sandboxes.map((x) => x.id);
    expect(await ids('ta')).toEqual(['sbx_teamaaaaaaaaaaaaaaab', 'sbx_teamaaaaaaaaaaaaaaaa']);
    expect(await ids('tb')).toEqual(['sbx_teambbbbbbbbbbbbbbbb']);
    // a record made before the team indexes (no team field: the default team's) and one of ta's
    // that only the global index holds
    await redis.hset(keys.sandbox('sbx_oldoldoldoldoldoldol'), {
      id: 'sbx_oldoldoldoldoldoldol',
      state: 'running',
    });
    await redis.zadd(keys.sandboxIndex(), 900, 'sbx_oldoldoldoldoldoldol');
    await redis.zrem(keys.teamSandboxes('ta'), 'sbx_teamaaaaaaaaaaaaaaaa');
    expect(await ids('default')).toEqual([]);
    // both records join their team index; the old one, running, also its team's live index
    expect(await store.indexTeams()).toEqual({ teamIndex: 2, liveIndex: 1 });
    expect(await store.indexTeams()).toEqual({ teamIndex: 0, liveIndex: 0 });
    expect(await redis.zscore(keys.teamLiveSandboxes('default'), 'sbx_oldoldoldoldoldoldol')).toBe('900');
    expect(await ids('default')).toEqual(['sbx_oldoldoldoldoldoldol']);
    expect(await ids('ta')).toEqual(['sbx_teamaaaaaaaaaaaaaaab', 'sbx_teamaaaaaaaaaaaaaaaa']);
    // an expired record leaves both indexes when listed
    await redis.del(keys.sandbox('sbx_teambbbbbbbbbbbbbbbb'));
    expect(await ids('tb')).toEqual([]);
    expect(await redis.zscore(keys.sandboxIndex(), 'sbx_teambbbbbbbbbbbbbbbb')).toBeNull();
    expect(await redis.exists(keys.teamSandboxes('tb'))).toBe(0);
  });

  it('allows only the transitions of the lifecycle table', async () => {
    await make('sbx_trans000000000000001', 1);
    expect(await store.transition('sbx_trans000000000000001', 'paused')).toEqual({
      ok: false,
      current: 'creating',
    });
    expect(await store.transition('sbx_trans000000000000001', 'running')).toEqual({ ok: true });
    expect(await redis.zscore(keys.deadlines(), 'sbx_trans000000000000001')).not.toBeNull();
    expect(await store.markKilling('sbx_trans000000000000001', 'request')).toEqual({ ok: true });
    expect(await redis.zscore(keys.deadlines(), 'sbx_trans000000000000001')).toBeNull();
    expect(await store.transition('sbx_trans000000000000001', 'running')).toEqual({
      ok: false,
      current: 'killing',
    });
    expect(await store.markKilled('sbx_trans000000000000001', 'request')).toEqual({ ok: true });
    expect(await store.transition('sbx_nope00000000000000001', 'running')).toEqual({
      ok: false,
      current: null,
    });
  });

  it('places on a node with a warm slot first, reserves atomically, refuses when full, releases once', async () => {
    await addNode('cold-node', 4, 2048, 0);
    await addNode('warm-node', 4, 2048, 1);
    const a = await make('sbx_place00000000000001', 1);
    const onWarm = { nodeId: 'warm-node', fromWarm: true, url: 'http://warm-node:8081', alive: true };
    expect(await store.place(a)).toEqual(onWarm);
    expect(await store.place(a)).toEqual(onWarm); // idempotent
    // placed before on a node that stopped heartbeating: it keeps its node, and says it is not alive
    await redis.del(keys.nodeAlive('warm-node'));
    expect(await store.place(a)).toEqual({ ...onWarm, alive: false });
    await redis.set(keys.nodeAlive('warm-node'), '1');
    expect(await redis.hget(keys.nodeWarm('warm-node'), 'base')).toBe('0');
    // fill both nodes' memory: 2048 MiB each, 512 per sandbox
    const placed = await Promise.all(
      Array.from({ length: 10 }, async (_, i) => store.place(await make(`sbx_place0000000000001${i}`, 2))),
    );
    expect(placed.filter((p) => p.nodeId !== null).length).toBe(7);
    expect(placed.filter((p) => p.nodeId === null).every((p) => 'reason' in p && p.reason === 'full')).toBe(
      true,
    );
    expect(Number(await redis.hget(keys.node('warm-node'), 'usedMemoryMiB'))).toBe(2048);
    expect(await store.release('sbx_place00000000000001')).toBe(true);
    expect(await store.release('sbx_place00000000000001')).toBe(false);
    expect(Number(await redis.hget(keys.node('warm-node'), 'usedMemoryMiB'))).toBe(1536);
    await redis.del(keys.nodeAlive('warm-node'), keys.nodeAlive('cold-node'));
    expect(await store.place(await make('sbx_place00000000000099', 3))).toEqual({
      nodeId: null,
      reason: 'no_nodes',
    });
  });

  it('counts warm slots against the node, less the slot a create of their shape claims', async () => {
    // 1024 MiB; two warm slots of 1 vCPU / 512 MiB hold 256 MiB each (as the agent's heartbeat says)
    await addNode('held-node', 4, 1024, 2);
    await redis.hset(keys.node('held-node'), {
      warmMemoryMiB: '512',
      warmSlotFootprintMiB: '256',
      warmSlotVcpusMilli: '1000',
      warmSlotMemoryMiB: '512',
    });
    // another shape cannot claim a slot, and the slots leave it too little room
    const big = { ...(await make('sbx_held000000000000001', 1)), memoryMiB: 768 };
    expect(await store.place(big)).toEqual({ nodeId: null, reason: 'full' });
    // the slots' own shape claims one: it fits, and that slot's share moves to the sandbox
    expect(await store.place(await make('sbx_held000000000000002', 2))).toMatchObject({
      nodeId: 'held-node',
      fromWarm: true,
    });
    expect(await redis.hmget(keys.node('held-node'), 'usedMemoryMiB', 'warmMemoryMiB')).toEqual([
      '512',
      '256',
    ]);
    expect(await store.place(await make('sbx_held000000000000003', 3))).toMatchObject({
      nodeId: 'held-node',
      fromWarm: true,
    });
    // no slot left and no memory left
    expect(await store.place(await make('sbx_held000000000000004', 4))).toEqual({
      nodeId: null,
      reason: 'full',
    });
    await redis.del(keys.nodeAlive('held-node'));
  });

  it('places only on nodes whose driver can run the shape (Firecracker: 1 or an even number of vCPUs)', async () => {
    await addNode('fc-node', 16, 8192, 1, 'firecracker');
    await addNode('gv-node', 16, 8192, 0, 'gvisor');
    const three = { ...(await make('sbx_shape00000000000001', 1)), vcpus: 3 };
    // the warm slot on the Firecracker node does not win: 3 vCPUs cannot run there
    expect(await store.place(three)).toMatchObject({
      nodeId: 'gv-node',
      fromWarm: false,
    });
    const two = { ...(await make('sbx_shape00000000000002', 1)), vcpus: 2 };
    expect(await store.place(two)).toMatchObject({
      nodeId: 'fc-node',
      fromWarm: true,
    });
    await redis.del(keys.nodeAlive('gv-node'));
    const half = { ...(await make('sbx_shape00000000000003', 1)), vcpus: 0.5 };
    expect(await store.place(half)).toEqual({ nodeId: null, reason: 'full' });
  });

  it('expires each sandbox once, queues its delete, and loses races with extension cleanly', async () => {
    await make('sbx_expire0000000000001', 0);
    await make('sbx_expire0000000000002', 0);
    await store.transition('sbx_expire0000000000001', 'running', {}, 0);
    await store.transition('sbx_expire0000000000002', 'running', {}, 0);
    // the second is extended before the sweep; the first is not
    expect(await store.extend('sbx_expire0000000000002', 60, 50_000)).toEqual({ ok: true });
    expect((await store.claimExpired(61_000)).killed).toEqual(['sbx_expire0000000000001']);
    expect((await store.claimExpired(61_000)).killed).toEqual([]);
    expect((await store.get('sbx_expire0000000000001'))?.state).toBe('killing');
    expect(await redis.xlen(keys.operationQueue())).toBe(1);
    expect(await redis.hget(`${KEY_PREFIX}operation:op_texpire0000000000001`, 'kind')).toBe('sandbox.delete');
    expect(await store.extend('sbx_expire0000000000001', 60)).toEqual({ ok: false, current: 'killing' });
  });

  it('pausing stops the running clock: time left kept, deadline = retention, given back on resume', async () => {
    await make('sbx_pauseclock000000001', 0); // timeoutSec 60
    await store.transition('sbx_pauseclock000000001', 'running', {}, 0);
    await store.transition('sbx_pauseclock000000001', 'pausing', { retentionMs: '5000' }, 10_000);
    await store.transition('sbx_pauseclock000000001', 'paused', { pauseMode: 'frozen' }, 20_000);
    let rec = (await store.get('sbx_pauseclock000000001'))!;
    expect(rec.pause).toMatchObject({ mode: 'frozen', timeLeftSec: 40 });
    expect(rec.expiresAtMs).toBe(25_000);
    // past its old deadline (60 s) but inside the retention: nothing expires
    expect((await store.claimExpired(24_000)).killed).toEqual([]);
    // a new lifetime while paused is running time left; the retention deadline stays
    expect(await store.extend('sbx_pauseclock000000001', 30, 21_000)).toEqual({ ok: true });
    expect((await store.get('sbx_pauseclock000000001'))!.expiresAtMs).toBe(25_000);
    await store.transition('sbx_pauseclock000000001', 'resuming', {}, 22_000);
    await store.transition('sbx_pauseclock000000001', 'running', {}, 23_000);
    rec = (await store.get('sbx_pauseclock000000001'))!;
    expect(rec.expiresAtMs).toBe(53_000);
    expect(rec.pause).toBeNull();
    expect(await redis.zscore(keys.deadlines(), 'sbx_pauseclock000000001')).toBe('53000');
  });

  it('a sandbox deleted while being paused has no pause (its record stays valid for the API)', async () => {
    await make('sbx_pausekill00000000001', 0);
    await store.transition('sbx_pausekill00000000001', 'running', {}, 0);
    await store.transition(
      'sbx_pausekill00000000001',
      'pausing',
      { pauseMode: 'hibernated', retentionMs: '5000' },
      1_000,
    );
    expect(await store.markKilling('sbx_pausekill00000000001', 'request')).toEqual({ ok: true });
    const rec = (await store.get('sbx_pausekill00000000001'))!;
    expect(rec.state).toBe('killing');
    expect(rec.pause).toBeNull();
  });

  it('a sandbox paused past its retention is killed with reason retention', async () => {
    await make('sbx_retention0000000001', 0);
    await store.transition('sbx_retention0000000001', 'running', {}, 0);
    await store.transition('sbx_retention0000000001', 'pausing', { retentionMs: '1000' }, 100);
    await store.transition('sbx_retention0000000001', 'paused', {}, 200);
    expect((await store.claimExpired(1_100)).killed).toEqual([]);
    expect((await store.claimExpired(1_300)).killed).toEqual(['sbx_retention0000000001']);
    const rec = (await store.get('sbx_retention0000000001'))!;
    expect(rec).toMatchObject({ state: 'killing', killReason: 'retention' });
  });

  it("onTimeout 'pause': the deadline queues one pause (reason timeout), never a kill while live; its resume restarts the lifetime", async () => {
    const id = 'sbx_ontimeout0000000001';
    await store.create(newSandbox(id, { onTimeout: 'pause', timeoutSec: 60 }), UNLIMITED_QUOTAS, 0);
    await store.transition(id, 'running', {}, 0);
    expect(await store.claimExpired(61_000)).toEqual({ killed: [], paused: [id] });
    const opId = (await redis.hget(keys.sandbox(id), 'pauseOperationId'))!;
    expect(await redis.hmget(`${KEY_PREFIX}operation:${opId}`, 'kind', 'target', 'state', 'args')).toEqual([
      'sandbox.pause',
      id,
      'pending',
      '{"reason":"timeout"}',
    ]);
    // still running at the retry while that pause is pending: no second pause, no kill
    expect(await redis.zscore(keys.deadlines(), id)).toBe(String(61_000 + TIMEOUT_PAUSE_RETRY_MS));
    expect(await store.claimExpired(61_000 + TIMEOUT_PAUSE_RETRY_MS)).toEqual({ killed: [], paused: [] });
    // a request pause that failed is no reason to kill: the deadline asks for a timeout pause
    await redis.hset(`${KEY_PREFIX}operation:${opId}`, { state: 'failed', args: '{"reason":"idle"}' });
    expect((await store.claimExpired(61_000 + 2 * TIMEOUT_PAUSE_RETRY_MS)).paused).toEqual([id]);
    // pausing past a retry: not killed
    await store.transition(
      id,
      'pausing',
      { pauseMode: 'frozen', pauseReason: 'timeout', retentionMs: '600000' },
      200_000,
    );
    expect(await store.claimExpired(200_000 + 3 * TIMEOUT_PAUSE_RETRY_MS)).toEqual({
      killed: [],
      paused: [],
    });
    expect((await store.get(id))?.state).toBe('pausing');
    await store.transition(id, 'paused', {}, 300_000);
    expect((await store.get(id))?.pause).toMatchObject({ reason: 'timeout', timeLeftSec: 0 });
    // resumed: the whole timeoutSec again, not the ~0 s left at the pause
    await store.transition(id, 'resuming', {}, 400_000);
    await store.transition(id, 'running', {}, 400_000);
    expect((await store.get(id))?.expiresAtMs).toBe(400_000 + 60_000);
    // paused past its retention it ends like any paused sandbox
    await store.transition(
      id,
      'pausing',
      { pauseMode: 'frozen', pauseReason: 'request', retentionMs: '1000' },
      410_000,
    );
    await store.transition(id, 'paused', {}, 410_000);
    expect((await store.claimExpired(411_001)).killed).toEqual([id]);
    // a timeout pause that failed (the sandbox runs on): the next sweep kills it, never runs it on
    const stuck = 'sbx_ontimeout0000000003';
    await store.create(newSandbox(stuck, { onTimeout: 'pause', timeoutSec: 60 }), UNLIMITED_QUOTAS, 0);
    await store.transition(stuck, 'running', {}, 0);
    expect((await store.claimExpired(61_000)).paused).toEqual([stuck]);
    const stuckOp = (await redis.hget(keys.sandbox(stuck), 'pauseOperationId'))!;
    await redis.hset(`${KEY_PREFIX}operation:${stuckOp}`, 'state', 'failed');
    expect(await store.claimExpired(61_000 + TIMEOUT_PAUSE_RETRY_MS)).toEqual({
      killed: [stuck],
      paused: [],
    });
    expect(await store.get(stuck)).toMatchObject({ state: 'killing', killReason: 'timeout' });
    // a request pause gives back only what was left (the rule did not change)
    const other = 'sbx_ontimeout0000000002';
    await store.create(newSandbox(other, { onTimeout: 'pause', timeoutSec: 60 }), UNLIMITED_QUOTAS, 0);
    await store.transition(other, 'running', {}, 0);
    await store.transition(
      other,
      'pausing',
      { pauseMode: 'frozen', pauseReason: 'request', retentionMs: '600000' },
      20_000,
    );
    await store.transition(other, 'paused', {}, 20_000);
    await store.transition(other, 'resuming', {}, 100_000);
    await store.transition(other, 'running', {}, 100_000);
    expect((await store.get(other))?.expiresAtMs).toBe(100_000 + 40_000);
  });

  it('expires DNS-safe sandbox ids too (no `_` to split on)', async () => {
    const id = newSandboxId();
    await make(id, 0);
    await store.transition(id, 'running', {}, 0);
    expect((await store.claimExpired(61_000)).killed).toEqual([id]);
    expect(await redis.hget(`${KEY_PREFIX}operation:op_t${id.slice(3)}`, 'kind')).toBe('sandbox.delete');
  });
});
