/**
 * An agent restart slower than the control plane's node-lost grace, on a real stack (API, agent,
 * gVisor sandboxes): the agent that stops keeping its sandboxes announces when it will be back
 * (`restartBy`), so the API's reaper does not declare the node lost meanwhile, and the next agent
 * re-adopts a sandbox that still works. The same restart with no hold
 * (SPACE_AGENT_RESTART_HOLD_MS=0) loses the sandbox: the grace alone decides. The grace here is 2 s
 * and the reaper runs every 200 ms, so each restart waits out the alive key's TTL and the grace.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadAgentConfig } from '../runtime/agent/config.ts';
import { startAgent } from '../runtime/agent/service.ts';
import { keys, NODE_ALIVE_TTL_MS } from '../runtime/core/redis-keys.ts';
import { agentEnv, type Stack, startStack, stopThenClean, waitFor } from './stack.ts';

const GRACE_MS = 2000;
const ENV = {
  SPACE_NODE_LOST_GRACE_MS: String(GRACE_MS),
  SPACE_REAPER_INTERVAL_MS: '200',
  SPACE_AGENT_ON_SHUTDOWN: 'keep',
};

let s: Stack;
beforeAll(async () => {
  s = await startStack(ENV);
}, 180_000);
afterAll(async () => {
  // whatever failed: an agent that destroys its sandboxes at stop runs last
  if (s) {
    await s.agent.close().catch(() => {});
    s.agent = await startAgent(loadAgentConfig(agentEnv(s, { ...ENV, SPACE_AGENT_ON_SHUTDOWN: 'destroy' })));
  }
  await stopThenClean(s, []);
}, 120_000);

/** Stops the agent keeping its sandboxes and waits until its alive key has expired and a grace passed. */
async function slowRestartGap(): Promise<void> {
  await s.agent.close('test', 'keep');
  await waitFor(
    'the alive key to expire',
    async () => ((await s.redis.exists(keys.nodeAlive('test-node'))) === 0 ? true : undefined),
    NODE_ALIVE_TTL_MS + 10_000,
  );
  // the grace, and several reaper passes after it
  await new Promise((r) => setTimeout(r, GRACE_MS + 2000));
}

const state = async (id: string) =>
  (await s.call<{ state: string; killReason?: string }>('GET', `/v1/sandboxes/${id}`)).body;

describe('an agent restart slower than the node-lost grace', () => {
  it('with the restart hold, nothing is declared lost and the sandbox works after it', async () => {
    const id = await s.createSandbox();
    await s.exec(id, { cmd: 'sh', args: ['-c', 'echo kept > /home/user/kept'] });
    await slowRestartGap();
    expect(Number(await s.redis.hget(keys.node('test-node'), 'restartBy'))).toBeGreaterThan(Date.now());
    expect(await s.redis.hget(keys.node('test-node'), 'lostAt')).toBeNull();
    expect(await state(id)).toMatchObject({ state: 'running' });
    s.agent = await startAgent(loadAgentConfig(agentEnv(s, ENV)));
    expect(s.agent.sandboxes.list().map((x) => x.id)).toContain(id);
    expect((await s.exec(id, { cmd: 'cat', args: ['/home/user/kept'] })).stdout.toString()).toBe('kept\n');
    // the heartbeat ended the hold
    expect(await s.redis.hget(keys.node('test-node'), 'restartBy')).toBeNull();
  }, 120_000);

  it('without it (SPACE_AGENT_RESTART_HOLD_MS=0) the grace alone decides: the sandbox is lost', async () => {
    await s.agent.close('test', 'keep');
    s.agent = await startAgent(loadAgentConfig(agentEnv(s, { ...ENV, SPACE_AGENT_RESTART_HOLD_MS: '0' })));
    const id = await s.createSandbox();
    await slowRestartGap();
    expect(await s.redis.hget(keys.node('test-node'), 'restartBy')).toBeNull();
    expect(await state(id)).toMatchObject({ state: 'killed', killReason: 'node_lost' });
    s.agent = await startAgent(loadAgentConfig(agentEnv(s, ENV)));
    // the node rejoins after reconciling: the lost sandbox is gone from it
    await waitFor('the node to drop the lost sandbox', async () =>
      s.agent.sandboxes.list().some((x) => x.id === id) ? undefined : true,
    );
  }, 120_000);
});
