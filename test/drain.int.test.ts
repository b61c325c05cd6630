/**
 * A node that is going away drains (issue 42 item 4, node replacement): while SPACE_DRAIN_FILE
 * exists (Kubernetes: written when the node is cordoned) the node is unschedulable, so creates go
 * elsewhere, and a SIGTERM waits, heartbeating, for its sandboxes to end, at most
 * SPACE_DRAIN_WAIT_MS. Real agent, API, Redis and gVisor sandboxes.
 */
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadAgentConfig } from '../runtime/agent/config.ts';
import { startAgent } from '../runtime/agent/service.ts';
import { agentEnv, type Stack, startStack, waitFor } from './stack.ts';

describe('draining node', () => {
  let s: Stack;
  let dir: string;
  let drainFile: string;
  const schedulable = async () =>
    (await s.call<{ nodes: { schedulable: boolean; alive: boolean }[] }>('GET', '/v1/nodes')).body.nodes[0];

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'space-drain-'));
    drainFile = join(dir, 'draining');
    s = await startStack({ SPACE_DRAIN_FILE: drainFile, SPACE_DRAIN_WAIT_MS: '120000' });
  }, 180_000);
  afterAll(async () => {
    await s?.stop();
    await rm(dir, { recursive: true, force: true });
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
