/**
 * The whole stack on the `qemu` driver (real microVMs; software emulation on machines without
 * usable KVM): the template snapshot is made when the agent starts, a create restores from it,
 * commands stream and files round-trip through the API and the data plane, an agent restart while a
 * command streams loses nothing, and a VM that died while no agent watched is reported as such.
 */
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadAgentConfig } from '../runtime/agent/config.ts';
import { startAgent } from '../runtime/agent/service.ts';
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

const VM_ENV = {
  SPACE_DRIVER: 'qemu',
  SPACE_KVM: 'off',
  SPACE_WARM_TEMPLATES: 'base',
  SPACE_WARM_VCPUS: '1',
  SPACE_WARM_MEMORY_MIB: '512',
  SPACE_SANDBOX_DISK_MIB: '1024',
  SPACE_CREATE_CONCURRENCY: '2',
};

describe('the stack on the qemu driver', () => {
  let s: Stack;
  beforeAll(async () => {
    s = await startStack(VM_ENV);
    // the agent snapshots the template once at start (a boot under emulation: tens of seconds)
    await waitFor('the template snapshot', async () => s.agent.sandboxes.snapshots().get('base'), 240_000);
  }, 300_000);
  afterAll(async () => {
    if (!s) return;
    await s.stop();
    expect(await leftovers(s)).toEqual(NO_LEFTOVERS);
  }, 120_000);

  it('creates from the template snapshot; execs stream; files round-trip', async () => {
    const id = await s.createSandbox({ vcpus: 1, memoryMiB: 512 });
    const rec = await s.call<{ createdFrom: string; state: string }>('GET', `/v1/sandboxes/${id}`);
    expect(rec.body).toMatchObject({ state: 'running', createdFrom: 'snapshot' });
    const r = await s.exec(id, {
      cmd: 'sh',
      args: ['-c', 'for i in 1 2 3; do echo line $i; sleep 0.2; done; uname -s; exit 4'],
    });
    expect(r.stdout.toString()).toBe('line 1\nline 2\nline 3\nLinux\n');
    expect(r.exit.exitCode).toBe(4);
    const dp = await s.token(id);
    const put = await request(`${dp.url}/files?path=${encodeURIComponent('/home/user/data.txt')}`, {
      method: 'PUT',
      headers: { authorization: `Bearer ${dp.token}`, 'content-type': 'application/octet-stream' },
      body: 'hello from the host\n',
    });
    expect(put.statusCode).toBe(200);
    await put.body.dump();
    const cat = await s.exec(id, { cmd: 'cat', args: ['/home/user/data.txt'] });
    expect(cat.stdout.toString()).toBe('hello from the host\n');
    // its own kernel, not the host's namespaces
    const k = await s.exec(id, { cmd: 'sh', args: ['-c', 'cat /proc/cmdline; hostname'] });
    expect(k.stdout.toString()).toMatch(/space\.rootfs=\/dev\/vda/);
    expect(k.stdout.toString()).not.toMatch(/[0-9a-f]{64}/); // no guest token on the command line
    expect((await s.call('DELETE', `/v1/sandboxes/${id}`)).status).toBe(202);
  }, 180_000);

  it('agent restart: a streaming command loses nothing; a VM that died meanwhile is reported', async () => {
    const [keep, doomed] = await Promise.all([
      s.createSandbox({ vcpus: 1, memoryMiB: 512 }),
      s.createSandbox({ vcpus: 1, memoryMiB: 512 }),
    ]);
    const running = await s.call<{ stream: { url: string; token: string } }>(
      'POST',
      `/v1/sandboxes/${keep}/commands`,
      {
        cmd: 'sh',
        args: ['-c', 'echo before; sleep 4; echo after'],
      },
    );
    const doomedInstance = s.agent.sandboxes.get(doomed).instance;
    const cfg = loadAgentConfig(agentEnv(s, VM_ENV));
    await s.agent.close('test', 'keep');
    // the VM dies while no agent watches it
    const pidFile = join(s.dir, 'agent', 'driver', 'instances', doomedInstance.instanceId, 'qemu.pid');
    process.kill(Number((await readFile(pidFile, 'utf8')).trim()), 'SIGKILL');
    s.agent = await startAgent(cfg);
    expect(s.agent.sandboxes.list().map((x) => x.id)).toEqual([keep]);
    const out = collect(await readEvents(running.body.stream.url, running.body.stream.token));
    expect(out.stdout.toString()).toBe('before\nafter\n');
    expect(out.exit.exitCode).toBe(0);
    const rec = await waitFor(
      'the dead VM to be recorded',
      async () => {
        const r = await s.call<{ state: string; killReason: string; endMessage: string }>(
          'GET',
          `/v1/sandboxes/${doomed}`,
        );
        return r.body.state === 'killed' ? r.body : undefined;
      },
      60_000,
    );
    expect(rec.killReason).toBe('crashed');
    expect(rec.endMessage).toMatch(/VM stopped while the node agent was down/);
    expect((await s.call('DELETE', `/v1/sandboxes/${keep}`)).status).toBe(202);
  }, 240_000);
});
