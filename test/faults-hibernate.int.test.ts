/**
 * Round-3 fault cases F7 and F9 (`npm run test:faults`), injected for real into a stack of separate
 * processes (test/fault-stack.ts):
 * - f7: the node agent is killed -9 (with the runsc and copy processes it had started, as a service
 *   manager's restart does) at points of a hibernating pause — right after runsc froze the
 *   instance, and while the checkpoint is being written — then started again. The sandbox must end
 *   in one state its record and its instance agree on, the pause's operation must end once, and the
 *   next command (after a resume when it is paused) and a resume must work.
 * - f9: the API is killed -9 while a hibernating pause runs and started again; its worker finishes
 *   the operation after the reclaim time. The time since the instance was frozen must be metered
 *   paused, not active.
 */
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { readdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  createSandbox,
  type FaultStack,
  type Op,
  finished as operationEnd,
  report,
  runCommand,
  startFaultStack,
  stopFaultStack,
} from './fault-stack.ts';

const run = promisify(execFile);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

type Sb = { id: string; state: string; nodeId: string | null; pause: { mode: string } | null };
type Usage = { seconds: { active: number; idle: number; paused: number } };

describe('faults: hibernate', { timeout: 300_000 }, () => {
  let s: FaultStack;

  beforeAll(async () => {
    s = await startFaultStack();
  });
  afterAll(() => stopFaultStack(s));

  const runscRoot = () => join(s.dir, 'agent', 'driver', 'runsc');
  const get = async (id: string) => (await s.call<Sb>('GET', `/v1/sandboxes/${id}`)).body;

  // the agent or the API may be restarting: a failed poll is tried again (for 40 polls at most)
  const finished = (opId: string) => operationEnd(s, opId, { polls: 40, tolerant: true });
  const create = () => createSandbox(s, { polls: 40, tolerant: true });

  async function lifecycle(id: string, verb: 'pause' | 'resume', body?: unknown): Promise<Op> {
    const res = await s.call<{ operation: Op }>('POST', `/v1/sandboxes/${id}/${verb}`, body);
    expect(res.status).toBe(202);
    return finished(res.body.operation.id);
  }

  /** Runs `echo ok` in the sandbox; returns the status the start got and whether it ran to its exit. */
  async function exec(id: string): Promise<{ status: number; code?: string; ran: boolean }> {
    const { status, code, exitCode } = await runCommand(s, id, 'echo', ['ok']);
    return { status, ...(code === undefined ? {} : { code }), ran: exitCode === 0 };
  }

  /** runsc's state of every container of the stack's agent (id → status). */
  async function runscStates(): Promise<Map<string, string>> {
    const { stdout } = await run('runsc', [`--root=${runscRoot()}`, 'list', '--format=json']).catch(() => ({
      stdout: '[]',
    }));
    const list = (JSON.parse(stdout || '[]') as { id: string; status: string }[] | null) ?? [];
    return new Map(list.map((c) => [c.id, c.status]));
  }

  /** The instance id the agent's state file gives sandbox `id` (undefined when it has none). */
  async function instanceOf(id: string): Promise<string | undefined> {
    const file = join(s.dir, 'agent', 'sandboxes', id, 'sandbox.json');
    const text = await readFile(file, 'utf8').catch(() => '');
    return text ? (JSON.parse(text) as { instance: { instanceId: string } }).instance.instanceId : undefined;
  }

  /** Polls (bounded, ~20 ms apart) until `check` holds; returns when it did (epoch ms). */
  async function when(
    what: string,
    check: () => Promise<boolean> | boolean,
    timeoutMs = 30_000,
  ): Promise<number> {
    const until = Date.now() + timeoutMs;
    while (Date.now() < until) {
      if (await check()) return Date.now();
      await sleep(20);
    }
    throw new Error(`timed out waiting for ${what}`);
  }

  /**
   * SIGKILLs the agent and every process it started that still runs (its runsc and cp children),
   * as a service manager's restart of a killed agent does; the sandboxes' own processes are not
   * its children (runsc daemonises them).
   */
  async function killAgentTree(): Promise<void> {
    const root = s.proc('agent').pid;
    if (root === undefined) return;
    const children = new Map<number, number[]>();
    for (const p of await readdir('/proc').catch(() => [] as string[])) {
      if (!/^\d+$/.test(p)) continue;
      const stat = await readFile(`/proc/${p}/stat`, 'utf8').catch(() => '');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      if (ppid) children.set(ppid, [...(children.get(ppid) ?? []), Number(p)]);
    }
    const tree: number[] = [];
    const walk = (pid: number) => {
      for (const c of children.get(pid) ?? []) {
        tree.push(c);
        walk(c);
      }
    };
    walk(root);
    await s.kill('agent');
    for (const pid of tree) {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        // already gone
      }
    }
  }

  /** The record and the node agree on the sandbox: paused and not on the node, or running on it. */
  async function agree(id: string): Promise<'paused' | 'running'> {
    const rec = await get(id);
    const onNode = (await s.inventory()).includes(id);
    const inst = await instanceOf(id);
    const status = inst ? (await runscStates()).get(inst) : undefined;
    if (rec.state === 'paused' && rec.pause?.mode === 'hibernated') {
      expect(onNode).toBe(false);
      expect(status).toBeUndefined();
      expect(existsSync(join(s.dir, 'agent', 'hibernated', id, 'hibernated.json'))).toBe(true);
      return 'paused';
    }
    expect(rec.state).toBe('running');
    expect(onNode).toBe(true);
    expect(status).toBe('running');
    return 'running';
  }

  /** Kills the agent once `point` holds during a hibernating pause, restarts it, checks the outcome. */
  async function killDuringHibernate(point: string, reached: (inst: string, id: string) => Promise<boolean>) {
    const id = await create();
    expect((await exec(id)).ran).toBe(true);
    const inst = (await instanceOf(id))!;
    const res = await s.call<{ operation: Op }>('POST', `/v1/sandboxes/${id}/pause`, { mode: 'hibernated' });
    expect(res.status).toBe(202);
    await when(point, () => reached(inst, id));
    await killAgentTree();
    const killedAt = Date.now();
    await s.start('agent');
    const op = await finished(res.body.operation.id);
    const settled = await agree(id);
    if (settled === 'paused') expect(op.state).toBe('succeeded');
    // an operation that ended never changes again
    await sleep(1000);
    expect((await s.call<Op>('GET', `/v1/operations/${op.id}`)).body.state).toBe(op.state);
    const before = settled === 'running' ? await exec(id) : null;
    if (settled === 'paused') expect((await lifecycle(id, 'resume')).state).toBe('succeeded');
    const after = await exec(id);
    expect(after).toMatchObject({ status: 201, ran: true });
    // a resume of the running sandbox succeeds, and it still runs commands
    expect((await lifecycle(id, 'resume')).state).toBe('succeeded');
    expect((await exec(id)).ran).toBe(true);
    expect(await agree(id)).toBe('running');
    report(`f7-${point}`, {
      settled,
      op: op.state,
      code: op.error?.code,
      execBefore: before,
      ms: Date.now() - killedAt,
    });
    expect((await s.call('DELETE', `/v1/sandboxes/${id}`)).status).toBe(202);
  }

  it('f7-kill-mid-hibernate: killed after the freeze and during the checkpoint, the sandbox is usable and agrees with its record', async () => {
    // right after runsc froze the instance
    await killDuringHibernate('frozen', async (inst) => (await runscStates()).get(inst) === 'paused');
    // while runsc writes the checkpoint into the store
    await killDuringHibernate('checkpoint', async (_inst, id) =>
      existsSync(join(s.dir, 'agent', 'hibernated', id, 'snapshot', 'checkpoint.img')),
    );
  });

  it('f9-api-kill-mid-hibernate-bills-paused: the time since the instance froze is metered paused', async () => {
    const id = await create();
    const inst = (await instanceOf(id))!;
    const res = await s.call<{ operation: Op }>('POST', `/v1/sandboxes/${id}/pause`, { mode: 'hibernated' });
    expect(res.status).toBe(202);
    const frozeAt = await when(
      'the instance to freeze',
      async () => (await runscStates()).get(inst) === 'paused',
    );
    await s.kill('api');
    await s.start('api');
    const op = await finished(res.body.operation.id);
    const endedAt = Date.now();
    expect(op.state).toBe('succeeded');
    expect((await get(id)).state).toBe('paused');
    const usage = (await s.call<Usage>('GET', `/v1/sandboxes/${id}/usage`)).body;
    // frozen since `frozeAt` (seen ≤ 20 ms after runsc did it, plus the test's own steps): all of
    // that is paused time; 2 s of slack for the polls and the API's round trips
    const pausedAtLeast = (endedAt - frozeAt) / 1000 - 2;
    report('f9-api-kill-mid-hibernate', {
      opMs: endedAt - frozeAt,
      seconds: usage.seconds,
      pausedAtLeast,
    });
    expect(usage.seconds.paused).toBeGreaterThanOrEqual(pausedAtLeast);
    // and the operation ended once
    await sleep(1000);
    expect((await s.call<Op>('GET', `/v1/operations/${op.id}`)).body.state).toBe('succeeded');
    expect((await lifecycle(id, 'resume')).state).toBe('succeeded');
    expect((await exec(id)).ran).toBe(true);
    expect((await s.call('DELETE', `/v1/sandboxes/${id}`)).status).toBe(202);
  });
});
