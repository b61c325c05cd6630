/**
 * The fault suite (`npm run test:faults`): each fault case (F1–F5) injected
 * for real into a stack whose parts are separate processes (kill -9, SIGSTOP/SIGCONT, a killed
 * gateway), checking the node as well as the records: after each, node inventory = records =
 * reservations, and no operation ended twice. The `workload-…` cases run the fault workload
 * (test/fault-workload.ts: line streams, create/delete churn, exec probe) around API, agent, Redis
 * and gateway kill -9 and agent SIGSTOP (short, past the node-lost grace). Each case logs how long
 * recovery took and what the clients saw (`fault …` lines) — the figures of the fault table in
 * docs/operations.md.
 */
import { readdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { Agent, request } from 'undici';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { keys } from '../runtime/core/redis-keys.ts';
import {
  converged,
  createSandbox,
  type FaultStack,
  type Op,
  finished as operationEnd,
  report,
  restartParts,
  sandboxRecord,
  startFaultStack,
  stopFaultStack,
} from './fault-stack.ts';
import {
  Churn,
  ExecProbe,
  LineStream,
  type Seen,
  tally,
  terminal,
  watchOperation,
} from './fault-workload.ts';
import { collect, readEvents, waitFor } from './stack.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
/** Node-lost grace the suite's API uses (the default is 2 min), ms. */
const GRACE_MS = 20_000;
/** Dispatch timeout of the suite's API (default 60 s): past the reclaim time (30 s), as in F3. */
const DISPATCH_TIMEOUT_MS = 40_000;

describe('faults', { timeout: 240_000 }, () => {
  let s: FaultStack;

  const create = () => createSandbox(s);
  const finished = (opId: string) => operationEnd(s, opId);
  const record = (id: string) => sandboxRecord(s, id);

  async function del(id: string): Promise<string> {
    const res = await s.call<{ operation: { id: string } }>('DELETE', `/v1/sandboxes/${id}`);
    expect(res.status).toBe(202);
    return res.body.operation.id;
  }

  /** Starts a command printing numbered lines every 100 ms; returns its stream. */
  async function lines(id: string): Promise<{ url: string; token: string }> {
    const res = await s.call<{ stream: { url: string; token: string } }>(
      'POST',
      `/v1/sandboxes/${id}/commands`,
      {
        cmd: 'sh',
        args: ['-c', 'i=0; while :; do echo $i; i=$((i+1)); sleep 0.1; done'],
      },
    );
    expect(res.status).toBe(201);
    return res.body.stream;
  }

  /** Instances the driver holds on disk (each a runsc sandbox with its network). */
  async function instances(): Promise<number> {
    return (await readdir(join(s.dir, 'agent', 'driver', 'instances')).catch(() => [])).length;
  }

  /** Waits until the node's alive key expired (the agent is stopped or cut off). */
  async function notAlive(): Promise<number> {
    const t0 = Date.now();
    await waitFor(
      'the node to stop counting as alive',
      async () => ((await s.redis.exists(keys.nodeAlive(s.nodeId))) === 0 ? true : undefined),
      30_000,
    );
    return Date.now() - t0;
  }

  async function agentMetric(name: string): Promise<number> {
    const res = await request(`${s.agentUrl}/metrics`);
    const text = await res.body.text();
    const line = text.split('\n').find((l) => l.startsWith(`${name} `) || l.startsWith(`${name}{`));
    return Number(line?.split(' ').pop() ?? 'NaN');
  }

  beforeAll(async () => {
    s = await startFaultStack({
      SPACE_NODE_LOST_GRACE_MS: String(GRACE_MS),
      SPACE_DISPATCH_TIMEOUT_MS: String(DISPATCH_TIMEOUT_MS),
    });
  });
  afterEach(() => restartParts(s));
  afterAll(() => stopFaultStack(s));

  it('f1-delete-without-gateway: a delete while the gateway is dead still destroys the instance', async () => {
    const keep = await create();
    const id = await create();
    await s.kill('gateway');
    const t0 = Date.now();
    const op = await finished(await del(id));
    await s.start('gateway');
    const agreed = await converged(s);
    report('F1', { op: op.state, code: op.error?.code ?? null, recoveredMs: Date.now() - t0 });
    expect(op.state).toBe('succeeded');
    expect(await record(id)).toMatchObject({ state: 'killed' });
    expect(agreed).toEqual([keep]);
    expect(await instances()).toBe(1);
    await finished(await del(keep));
    expect(await converged(s)).toEqual([]);
  });

  it('f2-delete-while-stopped: a delete the node missed is finished when the node speaks again', async () => {
    const keep = await create();
    const id = await create();
    s.signal('agent', 'SIGSTOP');
    await notAlive();
    const op = await finished(await del(id));
    // the control plane does not call done what it never carried out on the node
    expect(op.state).toBe('failed');
    expect(op.error?.code).toBe('NODE_UNAVAILABLE');
    expect(await record(id)).toMatchObject({ state: 'killing' });
    // its reservation is held while it may still run
    expect(await s.redis.hget(keys.node(s.nodeId), 'sandboxes')).toBe('2');
    s.signal('agent', 'SIGCONT');
    const t0 = Date.now();
    await waitFor(
      'the delete to finish',
      async () => ((await record(id)).state === 'killed' ? true : undefined),
      60_000,
    );
    const agreed = await converged(s);
    report('F2-short', { op: op.state, code: op.error?.code, recoveredAfterContMs: Date.now() - t0 });
    expect(agreed).toEqual([keep]);
    expect(await instances()).toBe(1);
    await finished(await del(keep));
    expect(await converged(s)).toEqual([]);
  });

  it('f2-node-lost: a node declared lost destroys its sandboxes when it speaks again', async () => {
    const ids = [await create(), await create()];
    const stream = await lines(ids[0]!);
    const reader = readEvents(stream.url, stream.token).then(
      (events) => ({ events }),
      (err: unknown) => ({ err }),
    );
    s.signal('agent', 'SIGSTOP');
    const stoppedAt = Date.now();
    await notAlive();
    for (const id of ids) {
      await waitFor(
        'the sandbox to be declared lost',
        async () => ((await record(id)).state === 'killed' ? true : undefined),
        GRACE_MS + 60_000,
      );
      expect(await record(id)).toMatchObject({ killReason: 'node_lost' });
    }
    const lostAfterMs = Date.now() - stoppedAt;
    expect(await s.redis.hget(keys.node(s.nodeId), 'lostAt')).not.toBeNull();
    s.signal('agent', 'SIGCONT');
    const t0 = Date.now();
    expect(await converged(s)).toEqual([]);
    const recoveredMs = Date.now() - t0;
    expect(await instances()).toBe(0);
    // the stream of a destroyed sandbox ends, and its token opens nothing any more
    const ended = await reader;
    const again = await request(stream.url, { headers: { authorization: `Bearer ${stream.token}` } });
    await again.body.dump();
    expect(again.statusCode).toBe(404);
    expect(await s.redis.hget(keys.node(s.nodeId), 'lostAt')).toBeNull();
    report('F2-lost', {
      lostAfterMs,
      recoveredAfterContMs: recoveredMs,
      stream: 'err' in ended ? 'error' : 'ended',
    });
    // the node is back in service
    const id = await create();
    expect(await converged(s)).toEqual([id]);
    await finished(await del(id));
  });

  it('f3-operation-ends-once: a delete dispatched to a hung node ends once and stays ended', async () => {
    const id = await create();
    s.signal('agent', 'SIGSTOP');
    const t0 = Date.now();
    const opId = await del(id);
    // watch the operation, the node still stopped, past the worker's reclaim time (30 s) and the
    // dispatch timeout: every state it shows
    const seen: string[] = [];
    while (Date.now() - t0 < DISPATCH_TIMEOUT_MS + 5_000) {
      const op = await s.call<Op>('GET', `/v1/operations/${opId}`);
      if (seen.at(-1) !== op.body.state) seen.push(op.body.state);
      await sleep(250);
    }
    s.signal('agent', 'SIGCONT');
    const op = await finished(opId);
    const terminal = seen.filter((x) => x === 'succeeded' || x === 'failed');
    report('F3', { states: seen, final: op.state, code: op.error?.code ?? null });
    expect(terminal.length).toBe(1);
    expect(op.state).toBe(terminal[0]);
    await waitFor(
      'the sandbox to be killed',
      async () => ((await record(id)).state === 'killed' ? true : undefined),
      60_000,
    );
    // the node missed nothing afterwards either: the first outcome is still the outcome
    expect((await finished(opId)).state).toBe(terminal[0]);
    expect(await converged(s)).toEqual([]);
    expect(await instances()).toBe(0);
  });

  it('f4-abandoned-streams: clients that gave up during a stall leave no stream behind', async () => {
    const id = await create();
    const stream = await lines(id);
    for (let round = 0; round < 4; round++) {
      s.signal('agent', 'SIGSTOP');
      await Promise.allSettled(
        Array.from({ length: 70 }, () =>
          request(stream.url, {
            headers: { authorization: `Bearer ${stream.token}` },
            signal: AbortSignal.timeout(2000),
          }).then((r) => r.body.dump()),
        ),
      );
      s.signal('agent', 'SIGCONT');
      await sleep(500);
    }
    const t0 = Date.now();
    await waitFor(
      'every abandoned stream to be freed',
      async () => ((await agentMetric('space_agent_streams')) === 0 ? true : undefined),
      30_000,
    );
    const freedMs = Date.now() - t0;
    // a new client gets a stream whose lines are in sequence, nothing lost or repeated
    const abort = new AbortController();
    const events = await readEvents(stream.url, stream.token, { stopAfter: 20, signal: abort.signal });
    const text = events
      .filter((e) => e.event === 'stdout')
      .map((e) => Buffer.from(JSON.parse(e.data).data, 'base64').toString())
      .join('');
    const numbers = text.trim().split('\n').map(Number);
    expect(numbers).toEqual(numbers.map((_, i) => numbers[0]! + i));
    await waitFor(
      'the stream to be freed',
      async () => ((await agentMetric('space_agent_streams')) === 0 ? true : undefined),
      30_000,
    );
    // shutdown ends (destroy mode: the sandbox goes with it)
    const exited = new Promise((r) => s.proc('agent').once('exit', r));
    const stopAt = Date.now();
    s.signal('agent', 'SIGTERM');
    await exited;
    report('F4', { freedAfterContMs: freedMs, shutdownMs: Date.now() - stopAt });
    await s.start('agent');
    await waitFor(
      'the sandbox to be ended',
      async () => ((await record(id)).state === 'killed' ? true : undefined),
      60_000,
    );
    expect(await converged(s)).toEqual([]);
  });

  it('f5-transient-codes: no live node gives retryable codes, and a failed create holds nothing', async () => {
    // a create dispatched to a node that hangs: it fails once the node stops heartbeating
    s.signal('agent', 'SIGSTOP');
    const accepted = await s.call<{ sandbox: { id: string }; operation: { id: string } }>(
      'POST',
      '/v1/sandboxes',
      {
        template: 'base',
        vcpus: 0.5,
        memoryMiB: 128,
      },
    );
    expect(accepted.status).toBe(202);
    const waitedMs = await notAlive();
    const refused = await s.call<{ error: { code: string } }>('POST', '/v1/sandboxes', { template: 'base' });
    expect([refused.status, refused.body.error.code]).toEqual([409, 'TEMPLATE_NOT_READY']);
    const templates = await s.call<{ templates: { name: string; ready: boolean }[] }>('GET', '/v1/templates');
    expect(templates.body.templates).toContainEqual({ name: 'base', ready: false });
    // with no live node nothing can say a name is wrong for good: retryable too
    const unknown = await s.call<{ error: { code: string } }>('POST', '/v1/sandboxes', { template: 'nope' });
    expect([unknown.status, unknown.body.error.code]).toEqual([503, 'NODE_UNAVAILABLE']);
    // the hung create ends (while the node is still stopped) and releases its reservation at once
    const op = await finished(accepted.body.operation.id);
    expect(op).toMatchObject({ state: 'failed', error: { code: 'NODE_UNAVAILABLE' } });
    expect(await s.redis.hget(keys.node(s.nodeId), 'sandboxes')).toBe('0');
    expect(await record(accepted.body.sandbox.id)).toMatchObject({
      state: 'killed',
      killReason: 'create_failed',
    });
    s.signal('agent', 'SIGCONT');
    const t0 = Date.now();
    // the node carried the create out after all (it was waiting in its socket): it destroys it
    expect(await converged(s)).toEqual([]);
    await waitFor(
      'the late instance to be destroyed',
      async () => ((await instances()) === 0 ? true : undefined),
      60_000,
    );
    report('F5', {
      notAliveAfterMs: waitedMs,
      createCode: refused.body.error.code,
      recoveredAfterContMs: Date.now() - t0,
    });
    const id = await create();
    await finished(await del(id));
    expect(await converged(s)).toEqual([]);
  });

  it('api-sigkill-mid-operation: an API killed with SIGKILL while it runs an operation; a second API reclaims and finishes it', async () => {
    // hold the operation in flight: the node takes the dispatch but does not answer yet
    s.signal('agent', 'SIGSTOP');
    const accepted = await s.call<{ sandbox: { id: string }; operation: { id: string } }>(
      'POST',
      '/v1/sandboxes',
      { template: 'base', vcpus: 0.5, memoryMiB: 128 },
    );
    expect(accepted.status).toBe(202);
    const opId = accepted.body.operation.id;
    await waitFor('the first API to run the operation', async () =>
      (await s.call<Op>('GET', `/v1/operations/${opId}`)).body.state === 'running' ? true : undefined,
    );
    const logFile = join(s.dir, 'api.log');
    await s.kill('api');
    const before = (await readFile(logFile, 'utf8')).length;
    await s.start('api');
    s.signal('agent', 'SIGCONT');
    const t0 = Date.now();
    // nothing else will finish it: its queue entry belongs to the dead API until it sits unrenewed
    // for the reclaim time (30 s), then the new API's worker claims it (XAUTOCLAIM) and runs it again
    const op = await waitFor(
      'the reclaimed operation to end',
      async () => {
        const o = (await s.call<Op>('GET', `/v1/operations/${opId}?waitMs=5000`)).body;
        return o.state === 'succeeded' || o.state === 'failed' ? o : undefined;
      },
      90_000,
    );
    const after = (await readFile(logFile, 'utf8')).slice(before);
    report('api-sigkill', {
      state: op.state,
      code: op.error?.code ?? null,
      finishedAfterMs: Date.now() - t0,
    });
    expect(after).toContain('operations reclaimed');
    expect(op.state).toBe('succeeded');
    expect(await record(accepted.body.sandbox.id)).toMatchObject({ state: 'running' });
    expect(await converged(s)).toEqual([accepted.body.sandbox.id]);
    // it ended once: the reclaimed run's outcome stays
    expect((await finished(opId)).state).toBe('succeeded');
    await finished(await del(accepted.body.sandbox.id));
    expect(await converged(s)).toEqual([]);
  });

  it('agent-sigkill-readoption: an agent killed with SIGKILL re-adopts its running sandbox, files and a command that ran on', async () => {
    const id = await create();
    const sh = async (script: string) => {
      const res = await s.call<{ stream: { url: string; token: string } }>(
        'POST',
        `/v1/sandboxes/${id}/commands`,
        {
          cmd: 'sh',
          args: ['-c', script],
        },
      );
      expect(res.status).toBe(201);
      return res.body.stream;
    };
    const text = async (stream: { url: string; token: string }) =>
      collect(await readEvents(stream.url, stream.token)).stdout.toString();
    expect(await text(await sh('echo kept > /home/user/kept; echo written'))).toBe('written\n');
    const running = await sh('sleep 2; touch /home/user/later; echo done');
    await s.kill('agent');
    await s.start('agent');
    expect(await s.inventory()).toContain(id);
    expect(await record(id)).toMatchObject({ state: 'running' });
    // the sandbox's processes never noticed: the file and the command that ran across the kill
    expect(await text(await sh('cat /home/user/kept'))).toBe('kept\n');
    // its output, spooled on the node, streams to the end after the new agent adopted it
    const across = collect(await readEvents(running.url, running.token));
    expect([across.stdout.toString(), across.exit.exitCode]).toEqual(['done\n', 0]);
    expect(await text(await sh('test -e /home/user/later && echo yes'))).toBe('yes\n');
    expect(await converged(s)).toEqual([id]);
    await finished(await del(id));
    expect(await converged(s)).toEqual([]);
  });

  it('gateway-reregistration: a gateway killed and started again (empty) learns the running sandbox back from the agent', async () => {
    const id = await create();
    const control = new Agent({ connect: { socketPath: join(s.dir, 'gateway.sock') } });
    const registered = async () => {
      const res = await request('http://gateway/v1/sandboxes', { dispatcher: control });
      const body = (await res.body.json()) as { sandboxes: { sandboxId: string }[] };
      return body.sandboxes.map((x) => x.sandboxId);
    };
    expect(await registered()).toContain(id);
    await s.kill('gateway');
    await s.start('gateway');
    // the new gateway keeps nothing across a restart: only the agent's watchdog can tell it
    const t0 = Date.now();
    await waitFor('the sandbox to be registered again', async () =>
      (await registered()).includes(id) ? true : undefined,
    );
    report('gateway-reregistration', { afterMs: Date.now() - t0 });
    await finished(await del(id));
    await waitFor('the deleted sandbox to be unregistered', async () =>
      (await registered()).includes(id) ? undefined : true,
    );
    await control.close();
  });

  it('redis-kill-mid-create: Redis killed (-9) while a create runs; the owner API finishes it once Redis is back', async () => {
    const logFile = join(s.dir, 'api.log');
    const before = (await readFile(logFile, 'utf8')).length;
    // the node holds the dispatch until Redis is gone, so the outage falls inside the running
    // operation: the node's answer comes while Redis is away and the handler's next step fails
    s.signal('agent', 'SIGSTOP');
    const accepted = await s.call<{ sandbox: { id: string }; operation: { id: string } }>(
      'POST',
      '/v1/sandboxes',
      { template: 'base', vcpus: 0.5, memoryMiB: 128 },
    );
    expect(accepted.status).toBe(202);
    const id = accepted.body.sandbox.id;
    const opId = accepted.body.operation.id;
    const watch = watchOperation(s, opId);
    await waitFor('the operation to run', async () => (watch.states.includes('running') ? true : undefined));
    await s.kill('redis');
    const t0 = Date.now();
    s.signal('agent', 'SIGCONT');
    // The node answers ~0.8 s into the outage; Redis stays away 1.5 s more. ioredis holds a command
    // through 3 reconnects (at ~0.5, ~1.8, ~3.9 s into an outage) before failing it, so the API's
    // next write after the node's answer fails while Redis is still away: the case to survive
    await waitFor(
      'the node to make the sandbox',
      async () => ((await s.inventory().catch((): string[] => [])).includes(id) ? true : undefined),
      10_000,
    );
    await sleep(1500);
    await s.start('redis');
    const back = Date.now();
    await watch.done;
    const log = (await readFile(logFile, 'utf8')).slice(before);
    const succeededLines = log
      .split('\n')
      .filter((l) => l.includes(opId) && l.includes('"msg":"operation succeeded"')).length;
    report('redis-mid-create', {
      outageMs: back - t0,
      states: watch.states,
      endedAfterRedisBackMs: (watch.endedAt ?? Number.NaN) - back,
      clientsSaw: tally(watch.refused),
      interrupted: log.includes('operation interrupted by a redis outage'),
    });
    expect(terminal(watch.states)).toEqual(['succeeded']);
    expect(succeededLines).toBe(1);
    // its own worker finished it: no other API's reclaim 30 s later
    expect(log).not.toContain('operations reclaimed');
    expect(watch.endedAt! - back).toBeLessThan(15_000);
    expect(await record(id)).toMatchObject({ state: 'running' });
    expect(await converged(s)).toEqual([id]);
    await finished(await del(id));
    expect(await converged(s)).toEqual([]);
  });

  /**
   * The fault workload around one fault: 3 sandboxes streaming numbered
   * lines (one of them also the exec probe's), a create/delete loop and an exec probe every 500 ms.
   * `inject` makes the fault and resolves when it is over (the part restarted, SIGCONT sent);
   * it returns when it began. Afterwards: the probe works again (the recovery time is logged with
   * what clients saw), no stream lost or repeated a line, no operation is stuck or ended twice,
   * node inventory = records = reservations, and the driver holds exactly the live instances.
   * With `lost`, the fault is expected to cost the sandboxes (node declared lost): they must be
   * recorded `node_lost` and gone from the node instead.
   */
  async function workloadCase(
    name: string,
    inject: () => Promise<number>,
    opts: { lost?: boolean } = {},
  ): Promise<void> {
    const ids = await Promise.all([create(), create(), create()]);
    const streams = await Promise.all(ids.map(async (id) => new LineStream({ id, stream: await lines(id) })));
    const probe = new ExecProbe(s, ids[0]!);
    const churn = new Churn(s);
    await Promise.all(streams.map((x) => x.more(10)));
    await probe.recovered(Date.now());
    const at = await inject();
    const endedAt = Date.now();
    const rec = await probe.recovered(at);
    // the streams go on where they were: 10 more lines each after the fault
    if (!opts.lost) await Promise.all(streams.map((x) => x.more(10, 60_000)));
    await churn.stop();
    await probe.stop();
    await Promise.all(streams.map((x) => x.stop()));
    // probe sandboxes made to replace a lost one (a create may have failed while the node was away)
    const made: string[] = [];
    for (const id of probe.made) if ((await record(id)).state === 'running') made.push(id);
    const expected = opts.lost ? made : [...ids, ...made];
    const agreed = await converged(s, 90_000);
    const streamSaw: Seen[] = streams.flatMap((x) => x.refused);
    report(name, {
      recoveredMs: rec.ms,
      faultMs: endedAt - at,
      probeSaw: tally(rec.failed),
      streamsSaw: tally(streamSaw),
      streamResumes: streams.reduce((n, x) => n + x.resumes, 0),
      linesRead: streams.map((x) => x.numbers.length),
      churnRounds: churn.rounds.length,
      churnSaw: tally(churn.refused),
      churnFailed: churn.failures(),
    });
    expect(churn.problems()).toEqual([]);
    for (const x of streams) expect(x.check(), `stream of ${x.id}: ${x.numbers.join(',')}`).toBe(-1);
    if (opts.lost) {
      for (const id of ids)
        expect(await record(id)).toMatchObject({ state: 'killed', killReason: 'node_lost' });
    } else {
      for (const x of streams) expect(x.ended).toBe(false);
      for (const id of ids) expect(await record(id)).toMatchObject({ state: 'running' });
    }
    expect(agreed).toEqual([...expected].sort());
    await waitFor('the driver to hold only live instances', async () =>
      (await instances()) === agreed.length ? true : undefined,
    );
    await Promise.all(agreed.map(async (id) => finished(await del(id))));
    expect(await converged(s)).toEqual([]);
  }

  it('workload-api-sigkill: the API killed (-9) and started again', async () => {
    await workloadCase('workload-api-sigkill', async () => {
      await s.kill('api');
      const at = Date.now();
      await s.start('api');
      return at;
    });
  });

  it('workload-agent-sigkill: the agent killed (-9) and started again', async () => {
    await workloadCase('workload-agent-sigkill', async () => {
      await s.kill('agent');
      const at = Date.now();
      await s.start('agent');
      return at;
    });
  });

  it('workload-agent-sigstop-short: the agent stopped 4 s', async () => {
    await workloadCase('workload-agent-sigstop-short', async () => {
      s.signal('agent', 'SIGSTOP');
      const at = Date.now();
      await sleep(4000);
      s.signal('agent', 'SIGCONT');
      return at;
    });
  });

  it('workload-agent-sigstop-lost: the agent stopped past the node-lost grace', async () => {
    let ids: string[] = [];
    await workloadCase(
      'workload-agent-sigstop-lost',
      async () => {
        ids = (await s.redis.smembers(keys.nodeSandboxes(s.nodeId))).sort();
        s.signal('agent', 'SIGSTOP');
        const at = Date.now();
        await waitFor(
          'the node to be declared lost',
          async () => ((await s.redis.hget(keys.node(s.nodeId), 'lostAt')) ? true : undefined),
          GRACE_MS + 60_000,
        );
        s.signal('agent', 'SIGCONT');
        return at;
      },
      { lost: true },
    );
    expect(ids.length).toBeGreaterThanOrEqual(3);
  });

  it('workload-redis-sigkill-short: Redis killed (-9) for ~1 s', async () => {
    await workloadCase('workload-redis-sigkill-short', async () => {
      await s.kill('redis');
      const at = Date.now();
      await sleep(1000);
      await s.start('redis');
      return at;
    });
  });

  it('workload-redis-sigkill-long: Redis killed (-9) past the heartbeat TTL and the node-lost grace', async () => {
    await workloadCase('workload-redis-sigkill-long', async () => {
      await s.kill('redis');
      const at = Date.now();
      // past the alive key's TTL (15 s) and the suite's node-lost grace (20 s): nodes were silent
      // only because Redis was away, which must not make them lost
      await sleep(GRACE_MS + 1000);
      // the node's first heartbeat after the outage comes a few seconds late (the default interval
      // is 5 s, the suite's 1 s), so the API's reconciler passes (every 2 s) see the node first
      s.signal('agent', 'SIGSTOP');
      await sleep(1000);
      await s.start('redis');
      await sleep(4000);
      s.signal('agent', 'SIGCONT');
      return at;
    });
  });

  it('workload-gateway-sigkill: the gateway killed (-9) and started again', async () => {
    await workloadCase('workload-gateway-sigkill', async () => {
      await s.kill('gateway');
      const at = Date.now();
      await s.start('gateway');
      return at;
    });
  });
});
