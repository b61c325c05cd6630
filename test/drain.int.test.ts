/**
 * A node that is going away drains (issue 42 item 4, node replacement): while SPACE_DRAIN_FILE
 * exists (Kubernetes: written when the node is cordoned), or once an operator drained it through
 * the control plane (`space nodes drain`, any deployment mode), the node is unschedulable, so
 * creates go elsewhere, and a SIGTERM waits, heartbeating, for its sandboxes to end, at most
 * SPACE_DRAIN_WAIT_MS; `--hibernate` moves its sandboxes to a shared hibernation store, from which
 * they resume on another node. Real agent, API, Redis, CLI and gVisor sandboxes.
 */
import { execFile } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadAgentConfig } from '../runtime/agent/config.ts';
import { startAgent } from '../runtime/agent/service.ts';
import { keys } from '../runtime/core/redis-keys.ts';
import { SPACE } from './space-up.ts';
import { agentEnv, type Stack, startStack, waitFor } from './stack.ts';

const run = promisify(execFile);

/** `space <args> --json` against stack `s` as its admin: exit code and its JSON (stdout, or stderr on failure). */
async function space(s: Stack, args: string[]): Promise<{ code: number; out: Record<string, unknown> }> {
  const env = { ...process.env, SPACE_API_URL: s.apiUrl, SPACE_API_KEY: s.apiKey };
  const r = await run(process.execPath, [SPACE, ...args, '--json'], { env }).then(
    (x) => ({ code: 0, text: x.stdout }),
    // a failure's `{ error }` body goes to stderr
    (e: { code: number; stdout: string; stderr: string }) => ({ code: e.code, text: e.stdout || e.stderr }),
  );
  return { code: r.code, out: JSON.parse(r.text) as Record<string, unknown> };
}

describe('draining node', () => {
  let s: Stack;
  let dir: string;
  let drainFile: string;
  const schedulable = async () =>
    (
      await s.call<{ nodes: { schedulable: boolean; alive: boolean; drainRequestedAt: string | null }[] }>(
        'GET',
        '/v1/nodes',
      )
    ).body.nodes[0];

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'space-drain-'));
    drainFile = join(dir, 'draining');
    s = await startStack({ SPACE_DRAIN_FILE: drainFile, SPACE_DRAIN_WAIT_MS: '120000' });
  }, 180_000);
  afterAll(async () => {
    await s?.stop();
    await rm(dir, { recursive: true, force: true });
  });

  it('a drain refuses what it cannot do and changes nothing: an unknown node, a bad body, --hibernate to a node-local store', async () => {
    const unknown = await space(s, ['nodes', 'drain', 'no-such-node']);
    expect(unknown.code).toBe(125);
    expect(unknown.out).toMatchObject({ error: { code: 'NODE_NOT_FOUND' } });
    const bad = await s.call<{ error: { code: string } }>('PUT', '/v1/nodes/test-node/drain', {
      hibernate: 'yes',
    });
    expect([bad.status, bad.body.error.code]).toEqual([400, 'BAD_REQUEST']);
    // this stack's agent hibernates to its own disk (the default store, `node:<id>`)
    const local = await space(s, ['nodes', 'drain', 'test-node', '--hibernate']);
    expect(local.code).toBe(125);
    expect(local.out).toMatchObject({ error: { code: 'HIBERNATE_STORE_LOCAL' } });
    expect(await schedulable()).toMatchObject({ schedulable: true, drainRequestedAt: null });
  });

  it('cordoned: no new sandbox is placed here; at SIGTERM the agent waits, still heartbeating, until its sandboxes end', async () => {
    const id = await s.createSandbox();
    await writeFile(drainFile, '');
    await waitFor('the node to turn unschedulable', async () =>
      (await schedulable())?.schedulable === false ? true : undefined,
    );
    // no other node has room: the create is refused at POST (retryable, Retry-After), nothing written
    const refused = await s.call<{ error: { code: string } }>('POST', '/v1/sandboxes', { template: 'base' });
    expect(refused.status).toBe(503);
    expect(refused.body.error.code).toBe('NODE_CAPACITY_EXHAUSTED');

    let closed = false;
    const closing = s.agent.close('SIGTERM').then(() => {
      closed = true;
    });
    // the sandbox goes on serving, and the node stays alive, while the agent waits for it
    await new Promise((r) => setTimeout(r, 3000));
    expect(closed).toBe(false);
    const r = await s.exec(id, { cmd: 'echo', args: ['still here'] });
    expect(r.stdout.toString()).toBe('still here\n');
    expect((await schedulable())?.alive).toBe(true);

    const del = await s.call<{ operation: { id: string } }>('DELETE', `/v1/sandboxes/${id}`);
    expect(del.status).toBe(202);
    await closing;
    expect(closed).toBe(true);
  }, 120_000);

  it('the wait is bounded: a sandbox that does not end holds the agent at most SPACE_DRAIN_WAIT_MS', async () => {
    await rm(drainFile, { force: true });
    s.agent = await startAgent(
      loadAgentConfig(agentEnv(s, { SPACE_DRAIN_FILE: drainFile, SPACE_DRAIN_WAIT_MS: '2000' })),
    );
    await waitFor('the node to be schedulable again', async () =>
      (await schedulable())?.schedulable === true ? true : undefined,
    );
    await s.createSandbox();
    await writeFile(drainFile, '');
    const started = Date.now();
    await s.agent.close('SIGTERM');
    // it waited for the bound (the sandbox never ended), then stopped as configured
    expect(Date.now() - started).toBeGreaterThanOrEqual(2000);
    expect(s.agent.sandboxes.size).toBe(0);
  }, 120_000);
});

describe('node drained through the control plane (`space nodes drain`)', () => {
  let s: Stack;
  const shared = { SPACE_HIBERNATE_STORE: 'shared' } as Record<string, string>;
  const node = async (id = 'test-node') =>
    (
      await s.call<{
        nodes: {
          id: string;
          schedulable: boolean;
          alive: boolean;
          sandboxes: number;
          drainRequestedAt: string | null;
        }[];
      }>('GET', '/v1/nodes')
    ).body.nodes.find((n) => n.id === id);
  /** The node's own view, as its agent's last heartbeat wrote it. */
  const agentSays = async (id = 'test-node') => (await s.redis.hget(keys.node(id), 'schedulable')) === '1';

  beforeAll(async () => {
    const dir = await mkdtemp(join(tmpdir(), 'space-drain-shared-'));
    shared.SPACE_HIBERNATE_DIR = dir;
    s = await startStack({ ...shared, SPACE_DRAIN_WAIT_MS: '120000' });
  }, 180_000);
  afterAll(async () => {
    await s?.stop();
    if (shared.SPACE_HIBERNATE_DIR) await rm(shared.SPACE_HIBERNATE_DIR, { recursive: true, force: true });
  });

  it('takes no new sandbox, its agent sees it, a SIGTERM waits for its sandboxes, it outlives an agent restart, and undrain lifts it', async () => {
    const id = await s.createSandbox();
    const drained = await space(s, ['nodes', 'drain', 'test-node']);
    expect(drained.code).toBe(0);
    expect(drained.out).toMatchObject({
      node: { id: 'test-node', schedulable: false },
      hibernating: [],
      skipped: [],
    });
    expect(typeof (drained.out.node as { drainRequestedAt: unknown }).drainRequestedAt).toBe('string');
    // placement knows at once: the only node is drained, so a create is refused at POST
    const refused = await s.call<{ error: { code: string } }>('POST', '/v1/sandboxes', { template: 'base' });
    expect([refused.status, refused.body.error.code]).toEqual([503, 'NODE_CAPACITY_EXHAUSTED']);
    // the agent learns it from its next heartbeat
    await waitFor('the agent to say unschedulable', async () => ((await agentSays()) ? undefined : true));

    let closed = false;
    const closing = s.agent.close('SIGTERM').then(() => {
      closed = true;
    });
    await new Promise((r) => setTimeout(r, 3000));
    expect(closed).toBe(false);
    expect((await s.exec(id, { cmd: 'echo', args: ['still here'] })).stdout.toString()).toBe('still here\n');
    expect((await node())?.alive).toBe(true);
    await s.call('DELETE', `/v1/sandboxes/${id}`);
    await closing;

    // a new agent on the node (an upgrade, a restart) stays drained: the mark is the control plane's
    s.agent = await startAgent(loadAgentConfig(agentEnv(s, { ...shared, SPACE_DRAIN_WAIT_MS: '120000' })));
    await waitFor('the new agent alive', async () => ((await node())?.alive ? true : undefined));
    await new Promise((r) => setTimeout(r, 2500)); // two heartbeats of the new agent
    expect(await agentSays()).toBe(false);
    expect((await node())?.schedulable).toBe(false);

    const lifted = await space(s, ['nodes', 'undrain', 'test-node']);
    expect(lifted).toMatchObject({ code: 0, out: { node: { schedulable: false, drainRequestedAt: null } } });
    await waitFor('the agent to say schedulable', async () => ((await agentSays()) ? true : undefined));
    const again = await s.createSandbox();
    await s.call('DELETE', `/v1/sandboxes/${again}`);
  }, 180_000);

  it('--hibernate --wait: its sandboxes go to the shared store, the wait ends when it holds none, and they resume on another node', async () => {
    const id = await s.createSandbox({ autoPauseSec: 0 });
    await s.exec(id, { cmd: 'sh', args: ['-c', 'echo kept > /tmp/mark'] });
    const drained = await space(s, ['nodes', 'drain', 'test-node', '--hibernate', '--wait', '120']);
    expect(drained.code).toBe(0);
    expect(drained.out).toMatchObject({ node: { sandboxes: 0 }, skipped: [] });
    expect((drained.out.hibernating as { sandboxId: string }[]).map((h) => h.sandboxId)).toEqual([id]);
    const rec = (await s.call<{ state: string; pause?: { mode: string } }>('GET', `/v1/sandboxes/${id}`))
      .body;
    expect([rec.state, rec.pause?.mode]).toEqual(['paused', 'hibernated']);

    // the node goes; another one reading the same store takes over
    await s.agent.close();
    s.agent = await startAgent(
      loadAgentConfig(
        agentEnv(s, {
          ...shared,
          SPACE_NODE_ID: 'test-node-2',
          SPACE_AGENT_PORT: '0',
          SPACE_AGENT_STATE_DIR: join(s.dir, 'agent2'),
        }),
      ),
    );
    await waitFor('node 2 alive', async () => ((await node('test-node-2'))?.alive ? true : undefined));
    const resumed = await s.call<{ operation: { id: string } }>('POST', `/v1/sandboxes/${id}/resume`);
    const op = await s.call<{ state: string }>(
      'GET',
      `/v1/operations/${resumed.body.operation.id}?waitMs=60000`,
    );
    expect(op.body.state).toBe('succeeded');
    expect((await s.call<{ nodeId: string }>('GET', `/v1/sandboxes/${id}`)).body.nodeId).toBe('test-node-2');
    expect((await s.exec(id, { cmd: 'cat', args: ['/tmp/mark'] })).stdout.toString()).toBe('kept\n');
    await s.call('DELETE', `/v1/sandboxes/${id}`);
  }, 240_000);
});
