/**
 * Pause and resume on real gVisor sandboxes: what a sandbox holds (files, background processes,
 * listening sockets, a command streaming output) survives frozen and hibernated pauses; the
 * idle timer pauses and the next command resumes; racing pause/resume/delete end in one
 * consistent state; running lifetime stops while paused; usage adds up to the sandbox's life;
 * a hibernated sandbox resumes on another agent reading the same store.
 */
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadAgentConfig } from '../runtime/agent/config.ts';
import { startAgent } from '../runtime/agent/service.ts';
import { FILE_METADATA_HEADER, type FileStat } from '../runtime/core/guest-protocol.ts';
import {
  agentEnv,
  collect,
  leftovers,
  NO_LEFTOVERS,
  readEvents,
  type Stack,
  startStack,
  waitFor,
} from './stack.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

interface Op {
  id: string;
  state: string;
  error: { code: string; message: string } | null;
}
interface Sb {
  id: string;
  state: string;
  nodeId: string | null;
  expiresAt: string;
  timeoutSec: number;
  pause: { mode: string; reason: string; pausedAt: string; timeLeftSec: number } | null;
}

describe('pause and resume', () => {
  let s: Stack;
  let hibernateDir: string;

  beforeAll(async () => {
    s = await startStack({
      SPACE_REAPER_INTERVAL_MS: '100',
      SPACE_ACTIVE_GRACE_MS: '300',
      SPACE_PAUSE_MODE: 'frozen',
    });
    hibernateDir = join(s.dir, 'agent', 'hibernated');
  });
  afterAll(async () => {
    if (!s) return;
    await s.stop();
    expect(await leftovers(s)).toEqual(NO_LEFTOVERS);
  });

  const get = async (id: string) => (await s.call<Sb>('GET', `/v1/sandboxes/${id}`)).body;

  /** Asks for pause/resume and waits for its operation; returns the operation. */
  async function lifecycle(id: string, verb: 'pause' | 'resume', body?: unknown): Promise<Op> {
    const res = await s.call<{ operation: Op }>('POST', `/v1/sandboxes/${id}/${verb}`, body);
    expect(res.status).toBe(202);
    const op = await s.call<Op>('GET', `/v1/operations/${res.body.operation.id}?waitMs=60000`);
    return op.body;
  }

  /** Deletes a sandbox and waits until its delete operation finished. */
  async function remove(id: string): Promise<void> {
    const d = await s.call<{ operation: Op }>('DELETE', `/v1/sandboxes/${id}`);
    expect(d.status).toBe(202);
    const op = await s.call<Op>('GET', `/v1/operations/${d.body.operation.id}?waitMs=60000`);
    expect(op.body.state).toBe('succeeded');
  }

  /** Starts a command and returns its stream (not read yet). */
  async function start(id: string, script: string) {
    const res = await s.call<{ stream: { url: string; token: string } }>(
      'POST',
      `/v1/sandboxes/${id}/commands`,
      { cmd: script, shell: true },
    );
    expect(res.status).toBe(201);
    return res.body.stream;
  }

  /** Puts state in the sandbox: a file, a background ticker, a listening HTTP server. */
  async function furnish(id: string): Promise<void> {
    const r = await s.exec(id, {
      cmd: [
        'echo kept > /home/user/note',
        'nohup sh -c "while true; do date +%s%N >> /tmp/ticks; sleep 0.2; done" >/dev/null 2>&1 &',
        'cd /tmp && nohup python3 -m http.server 8000 >/dev/null 2>&1 &',
        'for i in $(seq 1 50); do python3 -c "import urllib.request as u; u.urlopen(\'http://127.0.0.1:8000/\')" 2>/dev/null && exit 0; sleep 0.1; done; exit 1',
      ].join('\n'),
      shell: true,
    });
    expect(r.exit.exitCode).toBe(0);
    // and a file with metadata (kept by the guest daemon in memory: the pause must keep it)
    const put = await fetch(`${s.agent.url}/v1/sandboxes/${id}/files?path=/home/user/meta.txt`, {
      method: 'PUT',
      headers: {
        authorization: `Bearer ${(await s.token(id, ['files'])).token}`,
        'content-type': 'application/octet-stream',
        [FILE_METADATA_HEADER]: JSON.stringify({ kept: 'across the pause' }),
      },
      body: 'm',
    });
    expect(put.status).toBe(200);
  }

  /** Checks what {@link furnish} put there is still there and alive. */
  async function inspect(id: string): Promise<void> {
    const r = await s.exec(id, {
      cmd: [
        'cat /home/user/note',
        'a=$(wc -l < /tmp/ticks); sleep 0.7; b=$(wc -l < /tmp/ticks); [ "$b" -gt "$a" ] && echo ticking',
        'python3 -c "import urllib.request as u; print(u.urlopen(\'http://127.0.0.1:8000/\').status)"',
      ].join('\n'),
      shell: true,
    });
    expect(r.stdout.toString()).toBe('kept\nticking\n200\n');
    const st = await fetch(`${s.agent.url}/v1/sandboxes/${id}/fs/stat?path=/home/user/meta.txt`, {
      headers: { authorization: `Bearer ${(await s.token(id, ['files'])).token}` },
    });
    expect(((await st.json()) as FileStat).metadata).toEqual({ kept: 'across the pause' });
  }

  /** A command printing `n` numbered lines, 50 ms apart. */
  const counter = (n: number) => `for i in $(seq 1 ${n}); do echo "line $i"; sleep 0.05; done`;
  const expected = (n: number) => Array.from({ length: n }, (_, i) => `line ${i + 1}\n`).join('');

  it('frozen: files, processes, a listening socket and a streaming command survive; the lifetime stops', async () => {
    const id = await s.createSandbox({ autoPauseSec: 0, timeoutSec: 600 });
    await furnish(id);
    const stream = await start(id, counter(60));
    const first = await readEvents(stream.url, stream.token, { stopAfter: 3 });
    expect(first.length).toBe(3);

    const op = await lifecycle(id, 'pause', { mode: 'frozen' });
    expect(op).toMatchObject({ state: 'succeeded', error: null });
    const paused = await get(id);
    expect(paused.state).toBe('paused');
    expect(paused.pause).toMatchObject({ mode: 'frozen', reason: 'request' });
    expect(paused.pause!.timeLeftSec).toBeGreaterThan(500);
    expect(paused.pause!.timeLeftSec).toBeLessThanOrEqual(600);
    // while paused its deadline is the paused retention (7 days by default), not its lifetime
    expect(Date.parse(paused.expiresAt) - Date.now()).toBeGreaterThan(6 * 86_400_000);
    const inst = s.agent.sandboxes.get(id).instance.instanceId;
    expect((await s.agent.sandboxes.list()).find((x) => x.id === id)?.paused).toBe('frozen');
    // the guest is frozen: requests that need it are refused with a coded, retryable error
    const tok = await s.token(id); // minting a token resumes it …
    expect((await get(id)).state).toBe('running');
    await lifecycle(id, 'pause', { mode: 'frozen' }); // … so pause again for the direct check
    const direct = await fetch(`${s.agent.url}/v1/sandboxes/${id}/fs/stat?path=/home/user/note`, {
      headers: { authorization: `Bearer ${tok.token}` },
    });
    expect(direct.status).toBe(409);
    expect(((await direct.json()) as { error: { code: string } }).error.code).toBe('SANDBOX_PAUSED');
    // pausing twice is one state: the same (or an equivalent, succeeded) operation
    expect((await lifecycle(id, 'pause')).state).toBe('succeeded');

    expect((await lifecycle(id, 'resume')).state).toBe('succeeded');
    const resumed = await get(id);
    expect(resumed.state).toBe('running');
    expect(resumed.pause).toBeNull();
    expect(Date.parse(resumed.expiresAt) - Date.now()).toBeLessThanOrEqual(600_000);
    expect(s.agent.sandboxes.get(id).instance.instanceId).toBe(inst);
    await inspect(id);
    const all = collect(await readEvents(stream.url, stream.token));
    expect(all.stdout.toString()).toBe(expected(60));
    expect(all.exit.exitCode).toBe(0);
    await remove(id);
  });

  it('hibernated: the same survives a snapshot to disk, and the capacity is freed meanwhile', async () => {
    const id = await s.createSandbox({ autoPauseSec: 0, memoryMiB: 256 });
    await furnish(id);
    const stream = await start(id, counter(60));
    await readEvents(stream.url, stream.token, { stopAfter: 2 });
    const nodeBefore = await s.call<{ nodes: { usedMemoryMiB: number }[] }>('GET', '/v1/nodes');

    const op = await lifecycle(id, 'pause', { mode: 'hibernated' });
    expect(op).toMatchObject({ state: 'succeeded', error: null });
    const paused = await get(id);
    expect(paused).toMatchObject({ state: 'paused', nodeId: null });
    expect(paused.pause?.mode).toBe('hibernated');
    expect(() => s.agent.sandboxes.get(id)).toThrow(/no sandbox/);
    expect(existsSync(join(hibernateDir, id, 'hibernated.json'))).toBe(true);
    const nodeDuring = await s.call<{ nodes: { usedMemoryMiB: number }[] }>('GET', '/v1/nodes');
    expect(nodeDuring.body.nodes[0]!.usedMemoryMiB).toBe(nodeBefore.body.nodes[0]!.usedMemoryMiB - 256);

    expect((await lifecycle(id, 'resume')).state).toBe('succeeded');
    expect((await get(id)).state).toBe('running');
    expect(existsSync(join(hibernateDir, id))).toBe(false);
    await inspect(id);
    // the stream was served from the spool before; after the restore the same URL goes on
    const all = collect(await readEvents(stream.url, stream.token));
    expect(all.stdout.toString()).toBe(expected(60));
    await remove(id);
  });

  it('auto-pause: an idle sandbox pauses itself and the next command resumes it; usage adds up', async () => {
    const id = await s.createSandbox({ autoPauseSec: 1 });
    const born = Date.now();
    await s.exec(id, { cmd: 'sh', args: ['-c', 'echo hi > /home/user/f; sleep 1'] });
    const paused = await waitFor(
      'auto-pause',
      async () => {
        const sb = await get(id);
        return sb.state === 'paused' ? sb : undefined;
      },
      20_000,
    );
    expect(paused.pause?.reason).toBe('idle');
    const r = await s.exec(id, { cmd: 'cat', args: ['/home/user/f'] });
    expect(r.stdout.toString()).toBe('hi\n');
    expect((await get(id)).state).toBe('running');

    const u = await s.call<{
      startedAt: string;
      seconds: { active: number; idle: number; paused: number };
    }>('GET', `/v1/sandboxes/${id}/usage`);
    const { active, idle, paused: pausedSec } = u.body.seconds;
    expect(active).toBeGreaterThan(0.9); // the 1 s command
    expect(idle).toBeGreaterThan(0.9); // the idle second before the timer fired
    expect(pausedSec).toBeGreaterThan(0);
    const life = (Date.now() - Date.parse(u.body.startedAt)) / 1000;
    expect(Math.abs(active + idle + pausedSec - life)).toBeLessThan(0.5);
    expect(Date.parse(u.body.startedAt)).toBeGreaterThanOrEqual(born - 60_000);
    await remove(id);
  });

  it('racing pauses, resumes and a delete end in one consistent state with nothing left', async () => {
    const id = await s.createSandbox({ autoPauseSec: 0 });
    const asks = await Promise.all([
      s.call<{ operation: Op }>('POST', `/v1/sandboxes/${id}/pause`, { mode: 'frozen' }),
      s.call<{ operation: Op }>('POST', `/v1/sandboxes/${id}/pause`, { mode: 'frozen' }),
      s.call<{ operation: Op }>('POST', `/v1/sandboxes/${id}/resume`),
      s.exec(id, { cmd: 'echo', args: ['through'] }),
    ]);
    // two pause requests at once share one operation
    expect(asks[0].body.operation.id).toBe(asks[1].body.operation.id);
    expect(asks[3].stdout.toString()).toBe('through\n');
    for (const a of asks.slice(0, 3)) {
      await s.call(
        'GET',
        `/v1/operations/${(a as { body: { operation: Op } }).body.operation.id}?waitMs=60000`,
      );
    }
    const sb = await get(id);
    const local = s.agent.sandboxes.list().find((x) => x.id === id);
    expect(['running', 'paused']).toContain(sb.state);
    expect(local?.paused ?? null).toBe(sb.state === 'paused' ? 'frozen' : null);

    // pause and delete at once: the sandbox ends killed, its instance gone
    const [p, d] = await Promise.all([
      s.call<{ operation: Op }>('POST', `/v1/sandboxes/${id}/pause`, { mode: 'hibernated' }),
      s.call<{ operation: Op }>('DELETE', `/v1/sandboxes/${id}`),
    ]);
    for (const x of [p, d]) {
      if (x.status === 202) await s.call('GET', `/v1/operations/${x.body.operation.id}?waitMs=60000`);
    }
    await waitFor('killed', async () => ((await get(id)).state === 'killed' ? true : undefined));
    expect(s.agent.sandboxes.list().some((x) => x.id === id)).toBe(false);
    expect(existsSync(join(hibernateDir, id))).toBe(false);
  });

  it('r7/r9 across pause: the running lifetime stops while paused, extends while paused, and ends the sandbox after resume; kills while paused leave nothing', async () => {
    const id = await s.createSandbox({ autoPauseSec: 0, timeoutSec: 10 });
    const deadline = Date.parse((await get(id)).expiresAt);
    await sleep(1000);
    const asked = Date.now();
    expect((await lifecycle(id, 'pause', { mode: 'frozen' })).state).toBe('succeeded');
    const done = Date.now();
    // the lifetime left when the pause took hold (some moment of its operation; stored in ms,
    // rounded to whole seconds when read): bounded by the clock around the pause operation
    const left = (await get(id)).pause!.timeLeftSec;
    expect(left).toBeGreaterThan(0);
    expect(left).toBeGreaterThanOrEqual(Math.round((deadline - done) / 1000));
    expect(left).toBeLessThanOrEqual(Math.round((deadline - asked) / 1000));
    await sleep(left * 1000 + 1500); // past the deadline it had when it was paused
    expect((await get(id)).state).toBe('paused');
    // a new lifetime given while paused is running time left, counted from the resume
    const ext = await s.call<Sb>('POST', `/v1/sandboxes/${id}/timeout`, { timeoutSec: 3 });
    expect(ext.status).toBe(200);
    expect(ext.body.pause?.timeLeftSec).toBe(3);
    expect((await lifecycle(id, 'resume')).state).toBe('succeeded');
    const resumedAt = Date.now();
    const ends = Date.parse((await get(id)).expiresAt);
    expect(Math.abs(ends - (resumedAt + 3000))).toBeLessThan(1500);
    const ended = await waitFor(
      'lifetime end',
      async () => {
        const sb = await s.call<Sb & { killReason: string }>('GET', `/v1/sandboxes/${id}`);
        return sb.body.state === 'killed' ? sb.body : undefined;
      },
      15_000,
    );
    expect(ended.killReason).toBe('timeout');
    expect(Date.now() - resumedAt).toBeGreaterThanOrEqual(2500);

    // killed twice at once while hibernated: one end, nothing left on disk or on the node
    const nodeOf = async () =>
      (await s.call<{ nodes: { sandboxes: number; usedMemoryMiB: number }[] }>('GET', '/v1/nodes')).body
        .nodes[0]!;
    const baseline = await nodeOf();
    const h = await s.createSandbox({ autoPauseSec: 0 });
    expect((await lifecycle(h, 'pause', { mode: 'hibernated' })).state).toBe('succeeded');
    expect(existsSync(join(hibernateDir, h))).toBe(true);
    const dels = await Promise.all([
      s.call<{ operation: Op }>('DELETE', `/v1/sandboxes/${h}`),
      s.call<{ operation: Op }>('DELETE', `/v1/sandboxes/${h}`),
    ]);
    for (const d of dels) {
      const op = await s.call<Op>('GET', `/v1/operations/${d.body.operation.id}?waitMs=60000`);
      expect(op.body.state).toBe('succeeded');
    }
    expect((await get(h)).state).toBe('killed');
    expect(existsSync(join(hibernateDir, h))).toBe(false);
    expect(await nodeOf()).toMatchObject({
      sandboxes: baseline.sandboxes,
      usedMemoryMiB: baseline.usedMemoryMiB,
    });
  });

  it('a hibernated sandbox resumes on another agent that reads the same store', async () => {
    // both agents read one hibernation folder under one store name
    const shared = join(s.dir, 'shared-hibernation');
    await s.agent.close();
    s.agent = await startAgent(
      loadAgentConfig(agentEnv(s, { SPACE_HIBERNATE_DIR: shared, SPACE_HIBERNATE_STORE: 'shared' })),
    );
    const id = await s.createSandbox({ autoPauseSec: 0 });
    await furnish(id);
    expect((await lifecycle(id, 'pause', { mode: 'hibernated' })).state).toBe('succeeded');
    const first = s.agent;
    // the first node goes away; a second one (another id, state and address pool) takes over
    await first.close();
    s.agent = await startAgent(
      loadAgentConfig(
        agentEnv(s, {
          SPACE_NODE_ID: 'test-node-2',
          SPACE_AGENT_PORT: '0',
          SPACE_AGENT_STATE_DIR: join(s.dir, 'agent2'),
          SPACE_HIBERNATE_DIR: shared,
          SPACE_HIBERNATE_STORE: 'shared',
        }),
      ),
    );
    await waitFor('node 2 alive', async () => {
      const n = await s.call<{ nodes: { id: string; alive: boolean }[] }>('GET', '/v1/nodes');
      return n.body.nodes.find((x) => x.id === 'test-node-2' && x.alive) ? true : undefined;
    });
    expect((await lifecycle(id, 'resume')).state).toBe('succeeded');
    expect((await get(id)).nodeId).toBe('test-node-2');
    await inspect(id);
    await remove(id);
  });
});
