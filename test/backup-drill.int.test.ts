/**
 * The restore drill, on a real stack (API, agent, gVisor sandboxes, the test Redis) with s3rver as
 * the off-node store, through the `space` CLI as an operator runs it:
 * sandbox A runs → `space backup run` → sandbox B is created → Redis loses everything → with the
 * API and the agent stopped (the agent keeps its sandboxes running), `space backup restore latest`
 * → API and agent start again. Then A's record is back, A answers commands, the same API key
 * works; B, which the backup does not know, is destroyed by the agent's reconciliation (by
 * design: an agent cannot rebuild a record) and has no record. A restore while the API runs is
 * refused and writes nothing.
 */
import { execFile } from 'node:child_process';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadAgentConfig } from '../runtime/agent/config.ts';
import { startAgent } from '../runtime/agent/service.ts';
import { loadApiConfig } from '../runtime/api/config.ts';
import { startApi } from '../runtime/api/service.ts';
import { keys } from '../runtime/core/redis-keys.ts';
import { type S3Server, startS3Server } from './s3-server.ts';
import { agentEnv, type Stack, startStack, stopThenClean, waitFor } from './stack.ts';

const run = promisify(execFile);
const CLI = new URL('../runtime/cli/space.ts', import.meta.url).pathname;

let s: Stack;
let s3: S3Server;
beforeAll(async () => {
  s3 = await startS3Server();
  s = await startStack({ SPACE_AGENT_ON_SHUTDOWN: 'keep' });
}, 180_000);
afterAll(async () => {
  // the drill's agent keeps sandboxes at stop: one that destroys them runs last, whatever failed
  if (s) {
    await s.agent.close().catch(() => {});
    s.agent = await startAgent(loadAgentConfig(agentEnv(s)));
  }
  await stopThenClean(s, [() => s3.stop()]);
}, 120_000);

/** `space backup …` as a process with the store's settings; resolves with its exit code and output. */
async function space(...args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  try {
    const r = await run(process.execPath, [CLI, 'backup', ...args, '--json'], {
      env: { PATH: process.env.PATH ?? '/usr/bin:/bin', SPACE_REDIS_URL: s.redisUrl, ...s3.env('drill') },
    });
    return { code: 0, ...r };
  } catch (err) {
    const e = err as { code: number; stdout: string; stderr: string };
    return { code: e.code, stdout: e.stdout, stderr: e.stderr };
  }
}

/** The agent's count of sandboxes it destroyed by reconciliation (its /metrics). */
async function destroyedByReconciliation(): Promise<number> {
  const text = await (await fetch(`${s.agent.url}/metrics`)).text();
  const m = /space_agent_reconciled_total\{[^}]*action="destroyed"[^}]*\} (\d+)/.exec(text);
  return m ? Number(m[1]) : 0;
}

describe('restore drill: a stack rebuilt from a backup in an S3-compatible store', () => {
  it('brings back the records of the backup; sandboxes it does not know are destroyed by their agent', async () => {
    const a = await s.createSandbox();
    expect((await s.exec(a, { cmd: 'sh', args: ['-c', 'echo before > /tmp/mark'] })).exit.exitCode).toBe(0);

    const backup = await space('run');
    expect(backup.code, backup.stderr).toBe(0);
    const made = JSON.parse(backup.stdout) as { key: string; sha256: string; keys: number };
    expect(made.key).toMatch(/^space-backups\/drill\/redis-\d{8}T\d{9}Z\.rdb$/);
    expect(made.keys).toBeGreaterThan(0);
    expect(backup.stderr).toContain('"progress"');

    const b = await s.createSandbox();
    // refused while the API runs: nothing written
    const refused = await space('restore', 'latest');
    expect(refused.code).toBe(125);
    expect(JSON.parse(refused.stderr.trim().split('\n').at(-1)!).error.code).toBe('BACKUP_WRITERS_RUNNING');
    expect(await s.redis.exists(keys.sandbox(b))).toBe(1);

    // the writers stop (the agent keeps its sandboxes running), then Redis loses its data
    const apiPort = new URL(s.apiUrl).port;
    await s.api.close();
    await s.agent.close();
    await s.redis.flushall();

    const restored = await space('restore', 'latest');
    expect(restored.code, restored.stderr).toBe(0);
    expect(JSON.parse(restored.stdout)).toMatchObject({
      key: made.key,
      restored: made.keys,
      removed: 0,
      kept: 0,
    });

    const destroyedBefore = await destroyedByReconciliation().catch(() => 0);
    s.agent = await startAgent(loadAgentConfig(agentEnv(s, { SPACE_AGENT_ON_SHUTDOWN: 'keep' })));
    s.api = await startApi(
      loadApiConfig({
        SPACE_REDIS_URL: s.redisUrl,
        SPACE_LOG_LEVEL: 'silent',
        SPACE_SIGNING_KEY_FILE: join(s.dir, 'key.pem'),
        SPACE_VERIFY_KEY_FILE: join(s.dir, 'key.pub.pem'),
        SPACE_API_PORT: apiPort,
        SPACE_DEFAULT_AUTO_PAUSE_SEC: '0',
      }),
    );

    // A: its record is back (the same API key reads it), it runs, and it still has its file
    const got = await s.call<{ state: string; nodeId: string }>('GET', `/v1/sandboxes/${a}`);
    expect(got.status).toBe(200);
    expect(got.body.state).toBe('running');
    const r = await s.exec(a, { cmd: 'cat', args: ['/tmp/mark'] });
    expect(r.stdout.toString().trim()).toBe('before');
    // B: no record, and its agent destroyed it (it reports only A as running)
    expect((await s.call('GET', `/v1/sandboxes/${b}`)).status).toBe(404);
    await waitFor('the agent to destroy the sandbox the backup does not know', async () =>
      (await destroyedByReconciliation()) > destroyedBefore ? true : undefined,
    );
    await waitFor('the node inventory to hold only A', async () => {
      const inv = await s.redis.smembers(keys.nodeInventory('test-node'));
      return inv.length === 1 && inv[0] === a ? true : undefined;
    });
    // and the records agree with what the node runs: A alone is live
    const list = await s.call<{ sandboxes: { id: string }[] }>('GET', '/v1/sandboxes?state=running');
    expect(list.body.sandboxes.map((x) => x.id)).toEqual([a]);
    await s.call('DELETE', `/v1/sandboxes/${a}`);
  }, 300_000);
});
