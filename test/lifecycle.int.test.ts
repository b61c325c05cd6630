/**
 * Lifecycle: bursts of creates (R8), lifetime and kill races (R9), warm pool, operations that
 * survive an API restart, sandboxes that survive an agent restart, and nothing left behind.
 */
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdir, readdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it, onTestFinished } from 'vitest';
import { loadAgentConfig } from '../runtime/agent/config.ts';
import { WARM_SLOT_CHECK_MS } from '../runtime/agent/sandboxes/manager.ts';
import { startAgent } from '../runtime/agent/service.ts';
import { loadApiConfig } from '../runtime/api/config.ts';
import { startApi } from '../runtime/api/service.ts';
import {
  agentEnv,
  collect,
  leftovers,
  NO_LEFTOVERS,
  readEvents,
  type Stack,
  startStack,
  waitFor,
  waitForEnd,
} from './stack.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Size of the R8 burst (the case says 100; SPACE_TEST_BURST lowers it on small machines). */
const BURST = Number(process.env.SPACE_TEST_BURST ?? 100);

/** vCPUs the lifecycle stack's node offers: the whole burst at 0.5 each, or one 40-vCPU sandbox. */
const NODE_VCPUS = Math.max(64, BURST / 2);
/** Memory the lifecycle stack's node offers, MiB: the whole burst at 128 MiB each, and a little more. */
const NODE_MEMORY_MIB = BURST * 128 + 512;

/**
 * Agent settings of the lifecycle stack, and of the agents that replace its agent in a test. The
 * node's capacity is pinned, not read from this machine: the burst fits exactly (BURST × 0.5 vCPU,
 * BURST × 128 MiB) and one 40-vCPU sandbox fits where two do not. No warm pool, not even one grown
 * by demand (SPACE_WARM_POOL_MAX 0): a slot refilled after one create would serve the next, and
 * the template-snapshot test's second create must boot (it once came from such a slot in CI).
 * gVisor's ptrace platform, not the default systrap: an idle systrap sandbox costs this 2-core VM
 * ~31 ms of CPU a second against ~3 under ptrace (8 idle sandboxes: 252 against 22 ms/s, cpuacct,
 * 2026-12-07), so the burst's 100 idle sandboxes would need ~3 of its 2 cores and creates time out
 * (9 of 100 did, NODE_UNAVAILABLE after the agent call's timeout). R8 is about placement,
 * distinctness and clean failure under a burst, which the platform does not change; what systrap
 * is the default for (a fork bomb's host tasks, R19) is tested in runtime-cases.int.test.ts.
 */
const LIFECYCLE_AGENT = {
  SPACE_GVISOR_PLATFORM: 'ptrace',
  SPACE_CREATE_CONCURRENCY: '6',
  SPACE_NODE_VCPUS: String(NODE_VCPUS),
  SPACE_NODE_MEMORY_MIB: String(NODE_MEMORY_MIB),
  SPACE_WARM_POOL_MAX: '0',
};

/**
 * SIGKILLs every process of instance `instanceId` and waits (≤ 10 s) until none is left running:
 * a signal is only sent when pkill returns, and a gVisor sandbox (systrap: many threads, large
 * mappings) takes a while to die on a loaded host, so a claim right after could still find it alive.
 * A zombie's cmdline is empty, so `pgrep -f` stops matching once the process has died.
 */
async function killInstance(instanceId: string): Promise<void> {
  await new Promise<void>((done) => execFile('pkill', ['-9', '-f', instanceId], () => done()));
  await waitFor(
    `instance ${instanceId} to die`,
    () =>
      new Promise<true | undefined>((done) =>
        execFile('pgrep', ['-f', instanceId], (err) => done(err ? true : undefined)),
      ),
    10_000,
  );
}

describe('lifecycle', () => {
  let s: Stack;
  beforeAll(async () => {
    s = await startStack({ SPACE_REAPER_INTERVAL_MS: '100', ...LIFECYCLE_AGENT });
  });
  afterAll(async () => {
    if (!s) return;
    await s.stop();
    expect(await leftovers(s)).toEqual(NO_LEFTOVERS);
  });

  it(`r8-bursts-of-creates: ${BURST} concurrent creates give ${BURST} distinct usable sandboxes`, async () => {
    const results = await Promise.allSettled(
      Array.from({ length: BURST }, () => s.createSandbox({ vcpus: 0.5, memoryMiB: 128 })),
    );
    const ids = results.flatMap((r) => (r.status === 'fulfilled' ? [r.value] : []));
    try {
      expect(results.filter((r) => r.status === 'rejected')).toEqual([]);
      expect(new Set(ids).size).toBe(BURST);
      expect(s.agent.sandboxes.size).toBe(BURST);
      const instances = new Set(s.agent.sandboxes.list().map((x) => x.instance.instanceId));
      expect(instances.size).toBe(BURST);
      // each is usable: a file written by one call is read by the next call to the same sandbox
      await Promise.all(
        ids.map(async (id) => {
          const w = await s.exec(id, { cmd: 'sh', args: ['-c', `echo ${id} > /home/user/me`] });
          expect(w.exit.exitCode).toBe(0);
          const r = await s.exec(id, { cmd: 'cat', args: ['/home/user/me'] });
          expect(r.stdout.toString()).toBe(`${id}\n`);
        }),
      );
    } finally {
      const dels = await Promise.all(
        ids.map((id) => s.call<{ operation: { id: string } }>('DELETE', `/v1/sandboxes/${id}`)),
      );
      for (const d of dels) {
        const op = await s.call<{ state: string }>(
          'GET',
          `/v1/operations/${d.body.operation.id}?waitMs=60000`,
        );
        expect(op.body.state).toBe('succeeded');
      }
    }
    expect(s.agent.sandboxes.size).toBe(0);
    const node = await s.call<{ nodes: { sandboxes: number; usedMemoryMiB: number; usedVcpus: number }[] }>(
      'GET',
      '/v1/nodes',
    );
    expect(node.body.nodes[0]).toMatchObject({ sandboxes: 0, usedMemoryMiB: 0, usedVcpus: 0 });
    // a correctness test, not a timed one: 100 boots on a loaded 2-core machine took 46 s quiet
    // and over 120 s under load, and a timeout here leaves the burst running into the next tests
  }, 600_000);

  it('r8-failed-creates-leave-nothing: creates beyond capacity are refused at POST and leave nothing', async () => {
    const createFailed = async () =>
      (
        await s.call<{ sandboxes: { killReason: string }[] }>('GET', '/v1/sandboxes?state=killed&limit=1000')
      ).body.sandboxes.filter((x) => x.killReason === 'create_failed').length;
    const before = await createFailed();
    const over = await Promise.allSettled(
      Array.from({ length: 3 }, () => s.createSandbox({ vcpus: 40, memoryMiB: 128 })),
    );
    const failed = over.filter((r) => r.status === 'rejected');
    // on a node of NODE_VCPUS (64) one 40-vCPU sandbox fits and the other two do not: they are
    // refused when asked (503, admission reserves room), not accepted and failed later
    expect(failed.length).toBe(2);
    for (const f of failed) {
      expect(String((f as PromiseRejectedResult).reason)).toContain('create: 503');
      expect(String((f as PromiseRejectedResult).reason)).toContain('NODE_CAPACITY_EXHAUSTED');
    }
    // a refused create writes no record: none ends killed `create_failed` (they all did before)
    expect(await createFailed()).toBe(before);
    for (const r of over) {
      if (r.status !== 'fulfilled') continue;
      const del = await s.call<{ operation: { id: string } }>('DELETE', `/v1/sandboxes/${r.value}`);
      await s.call('GET', `/v1/operations/${del.body.operation.id}?waitMs=30000`);
    }
  });

  it('r7-lifetime: at the deadline the sandbox is killed and its record says why', async () => {
    const id = await s.createSandbox({ timeoutSec: 2 });
    const rec = await waitForEnd(s, id);
    expect(rec.killReason).toBe('timeout');
    expect(rec.endMessage).toMatch(/lifetime/);
    expect(s.agent.sandboxes.list().map((x) => x.id)).not.toContain(id);
  });

  it('r9-extend-then-stop: repeated extensions keep it alive; it ends within its grace once they stop', async () => {
    // lifetimes count from creation (or the last extension); a loaded machine may take a few
    // seconds to create, so the lifetime leaves room for that
    const id = await s.createSandbox({ timeoutSec: 8 });
    for (let i = 0; i < 4; i++) {
      await sleep(2000);
      const r = await s.call<{ state: string }>('POST', `/v1/sandboxes/${id}/timeout`, { timeoutSec: 4 });
      expect(r.status).toBe(200);
      expect(r.body.state).toBe('running');
    }
    const stoppedAt = Date.now();
    await waitForEnd(s, id);
    expect(Date.now() - stoppedAt).toBeLessThan(4000 + 4000);
    const late = await s.call<{ error: { code: string } }>('POST', `/v1/sandboxes/${id}/timeout`, {
      timeoutSec: 60,
    });
    expect([late.status, late.body.error.code]).toEqual([409, 'SANDBOX_NOT_RUNNING']);
  });

  it('r9-kill-races: two concurrent kills, and a kill while the create still runs, leave nothing', async () => {
    const id = await s.createSandbox();
    const [k1, k2] = await Promise.all([
      s.call<{ operation: { id: string } }>('DELETE', `/v1/sandboxes/${id}`),
      s.call<{ operation: { id: string } }>('DELETE', `/v1/sandboxes/${id}`),
    ]);
    for (const k of [k1, k2]) {
      const op = await s.call<{ state: string }>('GET', `/v1/operations/${k.body.operation.id}?waitMs=30000`);
      expect(op.body.state).toBe('succeeded');
    }
    const created = await s.call<{ sandbox: { id: string }; operation: { id: string } }>(
      'POST',
      '/v1/sandboxes',
      {
        template: 'base',
      },
    );
    const kill = await s.call<{ operation: { id: string } }>(
      'DELETE',
      `/v1/sandboxes/${created.body.sandbox.id}`,
    );
    const killOp = await s.call<{ state: string }>(
      'GET',
      `/v1/operations/${kill.body.operation.id}?waitMs=30000`,
    );
    expect(killOp.body.state).toBe('succeeded');
    const createOp = await s.call<{ state: string }>(
      'GET',
      `/v1/operations/${created.body.operation.id}?waitMs=30000`,
    );
    expect(['succeeded', 'failed']).toContain(createOp.body.state);
    await sleep(500);
    const rec = await s.call<{ state: string }>('GET', `/v1/sandboxes/${created.body.sandbox.id}`);
    expect(rec.body.state).toBe('killed');
    expect(s.agent.sandboxes.list().map((x) => x.id)).not.toContain(created.body.sandbox.id);
  });

  it('r9-api-restart: operations queued before an API restart finish after it', async () => {
    await s.api.close();
    const env = {
      SPACE_REDIS_URL: s.redisUrl,
      SPACE_SIGNING_KEY_FILE: `${s.dir}/key.pem`,
      SPACE_API_PORT: new URL(s.apiUrl).port,
      SPACE_LOG_LEVEL: 'silent',
    };
    // queue work while no API runs: write a create the way the API would, through a short-lived API
    const first = await startApi(loadApiConfig(env));
    const created = await fetch(`${first.url}/v1/sandboxes`, {
      method: 'POST',
      headers: { authorization: `Bearer ${s.apiKey}`, 'content-type': 'application/json' },
      body: JSON.stringify({ template: 'base' }),
    }).then((r) => r.json() as Promise<{ sandbox: { id: string }; operation: { id: string } }>);
    await first.close();
    const second = await startApi(loadApiConfig(env));
    s.api = second;
    const op = await s.call<{ state: string }>('GET', `/v1/operations/${created.operation.id}?waitMs=60000`);
    expect(op.body.state).toBe('succeeded');
    const r = await s.exec(created.sandbox.id, { cmd: 'echo', args: ['after restart'] });
    expect(r.stdout.toString()).toBe('after restart\n');
  });

  it('agent restart re-adopts running sandboxes with their files and commands', async () => {
    const id = await s.createSandbox();
    await s.exec(id, { cmd: 'sh', args: ['-c', 'echo kept > /home/user/kept'] });
    const running = await s.call<{ command: { id: string }; stream: { url: string; token: string } }>(
      'POST',
      `/v1/sandboxes/${id}/commands`,
      { cmd: 'sh', args: ['-c', 'echo before; sleep 3; echo after'] },
    );
    const cfg = loadAgentConfig(agentEnv(s, LIFECYCLE_AGENT));
    await s.agent.close('test', 'keep');
    s.agent = await startAgent(cfg);
    expect(s.agent.sandboxes.list().map((x) => x.id)).toContain(id);
    const r = await s.exec(id, { cmd: 'cat', args: ['/home/user/kept'] });
    expect(r.stdout.toString()).toBe('kept\n');
    // the command that ran across the restart still streams all of its output
    const out = collect(await readEvents(running.body.stream.url, running.body.stream.token));
    expect(out.stdout.toString()).toBe('before\nafter\n');
    expect(out.exit.exitCode).toBe(0);
  });

  it('a sandbox that dies on its own is noticed: streams end, the record says crashed, resources return', async () => {
    const placed = async () =>
      (await s.call<{ nodes: { sandboxes: number }[] }>('GET', '/v1/nodes')).body.nodes[0]!.sandboxes;
    const before = await placed();
    const id = await s.createSandbox();
    const running = await s.call<{ stream: { url: string; token: string } }>(
      'POST',
      `/v1/sandboxes/${id}/commands`,
      {
        cmd: 'sleep',
        args: ['300'],
      },
    );
    const events = readEvents(running.body.stream.url, running.body.stream.token);
    // what the kernel's OOM killer (or gVisor failing to make a thread) does to a sandbox
    const inst = s.agent.sandboxes.get(id).instance.instanceId;
    await new Promise((r) => execFile('pkill', ['-KILL', '-f', `runsc-sandbox.*${inst}`], r));
    const ended = collect(await events);
    expect(ended.exit.exitCode).toBeNull();
    expect(ended.exit.error).toBeTruthy();
    const rec = await waitForEnd(s, id);
    expect(rec.killReason).toBe('crashed');
    expect(rec.endMessage).toMatch(/stopped on its own/);
    expect(await placed()).toBe(before);
  });

  it('a sandbox being deleted is never reported as stopped on its own (the watchdog racing a delete)', async () => {
    const ids = await Promise.all([s.createSandbox(), s.createSandbox()]);
    const reported: string[] = [];
    const ops = await Promise.all(
      ids.map((id) => s.call<{ operation: { id: string } }>('DELETE', `/v1/sandboxes/${id}`)),
    );
    // watchdog passes back to back for as long as the deletes run (`runsc delete` takes seconds)
    const done = () => Promise.all(ids.map((id) => s.call<{ state: string }>('GET', `/v1/sandboxes/${id}`)));
    let passes = 0;
    for (let i = 0; i < 200; i++) {
      await s.agent.sandboxes.watch(async (id) => void reported.push(id));
      passes++;
      if (
        (await done()).every((r) => r.body.state === 'killed') &&
        !s.agent.sandboxes.list().some((sb) => ids.includes(sb.id))
      )
        break;
    }
    expect(ops.map((o) => o.status)).toEqual([202, 202]);
    expect(passes).toBeGreaterThan(1); // the passes did run during the deletes
    expect(reported).toEqual([]);
    for (const id of ids) {
      const r = await s.call<{ killReason: string }>('GET', `/v1/sandboxes/${id}`);
      expect(r.body.killReason).toBe('request');
    }
  });

  it('a sandbox its node no longer runs is marked killed (node_lost) and its reservation released', async () => {
    const id = await s.createSandbox();
    const cfg = loadAgentConfig(agentEnv(s, LIFECYCLE_AGENT));
    // the agent goes away destroying its sandboxes, and a new one comes back without them
    await s.agent.close('test', 'destroy');
    s.agent = await startAgent(cfg);
    const rec = await waitForEnd(s, id, 20_000);
    expect(rec.killReason).toBe('node_lost');
    const node = await s.call<{ nodes: { sandboxes: number }[] }>('GET', '/v1/nodes');
    expect(node.body.nodes[0]!.sandboxes).toBe(0);
  });

  it('template snapshot: creates restore from it; one that cannot be restored falls back to a boot', async () => {
    const snap = await waitFor(
      'the template snapshot',
      async () => s.agent.sandboxes.snapshots().get('base'),
      120_000,
    );
    const a = await s.createSandbox({ vcpus: snap.vcpus, memoryMiB: snap.memoryMiB });
    expect((await s.call<{ createdFrom: string }>('GET', `/v1/sandboxes/${a}`)).body.createdFrom).toBe(
      'snapshot',
    );
    expect((await s.exec(a, { cmd: 'echo', args: ['restored'] })).stdout.toString()).toBe('restored\n');
    // break the snapshot (its checkpoint image goes; the record and disk stay): creates still work
    for (const f of await readdir(snap.path)) {
      if (f !== 'snapshot.json' && f !== 'disk.img')
        await rm(join(snap.path, f), { recursive: true, force: true });
    }
    const b = await s.createSandbox({ vcpus: snap.vcpus, memoryMiB: snap.memoryMiB });
    expect((await s.call<{ createdFrom: string }>('GET', `/v1/sandboxes/${b}`)).body.createdFrom).toBe(
      'boot',
    );
    expect((await s.exec(b, { cmd: 'echo', args: ['booted'] })).stdout.toString()).toBe('booted\n');
  }, 240_000);
});

describe('warm pool', () => {
  let s: Stack;
  beforeAll(async () => {
    // two starts at a time, so a burst of 8 must queue at the start gate
    s = await startStack({ SPACE_WARM_POOL_SIZE: '2', SPACE_CREATE_CONCURRENCY: '2' });
  });
  afterAll(async () => {
    if (!s) return;
    await s.stop();
    expect(await leftovers(s)).toEqual(NO_LEFTOVERS);
  });

  it('claims a warm slot for a default-shaped create and refills the pool', async () => {
    await waitFor('2 warm slots', async () => (s.agent.warm.counts().base === 2 ? true : undefined), 60_000);
    await sleep(1500); // one heartbeat publishes the counts
    // each slot has its state directory made ahead: its instance marker and a commands folder, and
    // no record (an empty sandbox.json would read as torn at the next start)
    const slots = s.agent.warm.instanceIds();
    for (const slot of slots) {
      const names = await readdir(join(s.dir, 'agent', 'warm', slot));
      expect(names.sort()).toEqual(['commands', `instance-${slot}`]);
      expect((await stat(join(s.dir, 'agent', 'warm', slot, 'commands'))).isDirectory()).toBe(true);
    }
    const id = await s.createSandbox();
    const rec = await s.call<{ fromWarmPool: boolean }>('GET', `/v1/sandboxes/${id}`);
    expect(rec.body.fromWarmPool).toBe(true);
    // the claim took its slot's directory: the slot's is gone, the sandbox's holds its record
    const claimed = s.agent.sandboxes.get(id).instance.instanceId;
    expect(slots).toContain(claimed);
    expect(existsSync(join(s.dir, 'agent', 'warm', claimed))).toBe(false);
    const stateFile = join(s.dir, 'agent', 'sandboxes', id, 'sandbox.json');
    const state = JSON.parse(await readFile(stateFile, 'utf8')) as {
      req: { sandboxId: string };
      instance: { instanceId: string };
      source: string;
    };
    expect([state.req.sandboxId, state.instance.instanceId, state.source]).toEqual([id, claimed, 'warm']);
    expect((await stat(stateFile)).mode & 0o777).toBe(0o600);
    const r = await s.exec(id, { cmd: 'sh', args: ['-c', 'echo "$MARK"'], env: { MARK: 'warm' } });
    expect(r.stdout.toString()).toBe('warm\n');
    await waitFor(
      'the pool to refill',
      async () => (s.agent.warm.counts().base === 2 ? true : undefined),
      60_000,
    );
    const cold = await s.createSandbox({ memoryMiB: 768 });
    expect((await s.call<{ fromWarmPool: boolean }>('GET', `/v1/sandboxes/${cold}`)).body.fromWarmPool).toBe(
      false,
    );
  });

  it('a warm slot that died in the pool is undone and the create falls back to a cold start', async () => {
    await waitFor('2 warm slots', async () => (s.agent.warm.counts().base === 2 ? true : undefined), 60_000);
    // the slot a claim takes next (the pool hands out its oldest first): kill its whole instance
    const dead = s.agent.warm.instanceIds()[0]!;
    await killInstance(dead);
    const id = await s.createSandbox();
    const rec = await s.call<{ createdFrom: string; state: string }>('GET', `/v1/sandboxes/${id}`);
    expect(rec.body.state).toBe('running');
    expect(rec.body.createdFrom).not.toBe('warm');
    const r = await s.exec(id, { cmd: 'sh', args: ['-c', 'echo alive'] });
    expect(r.stdout.toString()).toBe('alive\n');
    // the dead slot is gone from the pool and from the node's inventory; only the new sandbox's
    // state directory exists for this id
    expect(s.agent.warm.instanceIds()).not.toContain(dead);
    expect(s.agent.sandboxes.get(id).instance.instanceId).not.toBe(dead);
    expect(existsSync(join(s.dir, 'agent', 'warm', dead))).toBe(false);
    await s.call('DELETE', `/v1/sandboxes/${id}`);
  }, 120_000);

  it('the watchdog asks each warm slot at most every WARM_SLOT_CHECK_MS, and replaces a slot whose guest stopped answering', async () => {
    await waitFor('2 warm slots', async () => (s.agent.warm.counts().base === 2 ? true : undefined), 60_000);
    const slots = s.agent.warm.instanceIds();
    // as if the check period had passed for every slot: each is asked once
    const checked = await s.agent.sandboxes.checkWarmSlots(Date.now() + WARM_SLOT_CHECK_MS + 1);
    expect([...checked].sort()).toEqual([...slots].sort());
    // just asked: nobody is asked again before the period is over
    expect(await s.agent.sandboxes.checkWarmSlots(Date.now() + WARM_SLOT_CHECK_MS / 2)).toEqual([]);
    // a slot whose instance died: the next check (not a claim) takes it out of the pool
    const dead = slots[0]!;
    await killInstance(dead);
    expect(await s.agent.sandboxes.checkWarmSlots(Date.now() + WARM_SLOT_CHECK_MS + 1)).toContain(dead);
    expect(s.agent.warm.instanceIds()).not.toContain(dead);
    await waitFor(
      'the pool to refill',
      async () => (s.agent.warm.counts().base === 2 ? true : undefined),
      60_000,
    );
  }, 120_000);

  it('an agent restart re-adopts a warm-claimed sandbox, and drops the state directories of old slots and of a claim that stopped before its record', async () => {
    await waitFor('2 warm slots', async () => (s.agent.warm.counts().base === 2 ? true : undefined), 60_000);
    // a sandbox made by a warm claim: its state directory was the slot's, its record the claim's
    const kept = await s.createSandbox();
    onTestFinished(async () => {
      await s.call('DELETE', `/v1/sandboxes/${kept}`); // whether or not the checks below passed
    });
    expect((await s.call<{ createdFrom: string }>('GET', `/v1/sandboxes/${kept}`)).body.createdFrom).toBe(
      'warm',
    );
    await s.exec(kept, { cmd: 'sh', args: ['-c', 'echo kept > /home/user/kept'] });
    await waitFor('2 warm slots', async () => (s.agent.warm.counts().base === 2 ? true : undefined), 60_000);
    const old = s.agent.warm.instanceIds();
    // a claim that renamed its slot's directory and stopped before writing the record
    const torn = join(s.dir, 'agent', 'sandboxes', 'sbxtornclaim00000000000');
    await mkdir(join(torn, 'commands'), { recursive: true });
    await writeFile(join(torn, 'sandbox.json'), '');
    // and the directory of a slot whose instance is already gone
    const ghost = join(s.dir, 'agent', 'warm', 'ghost-slot');
    await mkdir(join(ghost, 'commands'), { recursive: true });
    const cfg = loadAgentConfig(agentEnv(s, { SPACE_WARM_POOL_SIZE: '2', SPACE_CREATE_CONCURRENCY: '2' }));
    await s.agent.close('test', 'keep');
    s.agent = await startAgent(cfg);
    expect([existsSync(torn), existsSync(ghost)]).toEqual([false, false]);
    for (const slot of old) expect(existsSync(join(s.dir, 'agent', 'warm', slot))).toBe(false);
    expect(s.agent.sandboxes.list().map((x) => x.id)).toContain(kept);
    const r = await s.exec(kept, { cmd: 'cat', args: ['/home/user/kept'] });
    expect(r.stdout.toString()).toBe('kept\n');
    await waitFor('2 warm slots', async () => (s.agent.warm.counts().base === 2 ? true : undefined), 60_000);
    const fresh = s.agent.warm.instanceIds();
    expect(fresh.filter((x) => old.includes(x))).toEqual([]);
    expect((await readdir(join(s.dir, 'agent', 'warm'))).sort()).toEqual([...fresh].sort());
  }, 240_000); // three waits of up to 60 s for the pool, a create, two commands and a restart

  it('a burst larger than the pool: the rest restore from the snapshot, a few at a time; the pool grows for the next', async () => {
    const snap = await waitFor(
      'the template snapshot',
      async () => s.agent.sandboxes.snapshots().get('base'),
      120_000,
    );
    await waitFor('2 warm slots', async () => (s.agent.warm.counts().base === 2 ? true : undefined), 60_000);
    await sleep(1500); // one heartbeat publishes the counts
    const most = { running: 0, waitingCreates: 0 };
    const sampler = setInterval(() => {
      const st = s.agent.sandboxes.startStats();
      most.running = Math.max(most.running, st.running.create + st.running.refill);
      most.waitingCreates = Math.max(most.waitingCreates, st.waiting.create);
    }, 10);
    const ids = await Promise.all(
      Array.from({ length: 8 }, () => s.createSandbox({ vcpus: snap.vcpus, memoryMiB: snap.memoryMiB })),
    ).finally(() => clearInterval(sampler));
    const from: Record<string, number> = {};
    for (const id of ids) {
      const rec = await s.call<{ createdFrom: string }>('GET', `/v1/sandboxes/${id}`);
      from[rec.body.createdFrom] = (from[rec.body.createdFrom] ?? 0) + 1;
    }
    // the pool's two slots (and any refilled meanwhile), then restores: no create paid for a boot
    expect(from.boot ?? 0).toBe(0);
    expect(from.warm).toBeGreaterThanOrEqual(2);
    expect((from.warm ?? 0) + (from.snapshot ?? 0)).toBe(8);
    expect(from.snapshot).toBeGreaterThan(0);
    expect(most.running).toBeLessThanOrEqual(2);
    expect(most.waitingCreates).toBeGreaterThan(0);
    // the burst is demand: the pool now aims higher than its minimum and fills towards it
    const target = s.agent.warm.target('base');
    expect(target).toBeGreaterThan(2);
    await waitFor(
      'the pool to grow',
      async () => ((s.agent.warm.counts().base ?? 0) >= 3 ? true : undefined),
      60_000,
    );
    for (const id of ids) await s.call('DELETE', `/v1/sandboxes/${id}`);
  }, 240_000);
});
