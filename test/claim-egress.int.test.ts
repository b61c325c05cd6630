/**
 * A warm claim's egress policy is put in force behind the create (runtime/agent/sandboxes/create.ts,
 * claimOrMake): the create answers once the state file is written, and every call into the
 * sandbox waits for the gateway registration. These check both outcomes against a real gateway:
 * the first command finds the policy registered, and a registration that cannot be made (the
 * gateway does not answer) never lets a command run and ends the sandbox as crashed. The last
 * checks what the watchdog registers again: only what the gateway may not hold.
 */
import { once } from 'node:events';
import { rename, rm } from 'node:fs/promises';
import { connect, createServer, type Socket } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { DEFAULT_DENY_CIDRS } from '../runtime/gateway/addresses.ts';
import { leftovers, NO_LEFTOVERS, type Stack, startStack, waitFor } from './stack.ts';

describe('warm claim: egress policy behind the create', () => {
  let s: Stack;
  beforeAll(async () => {
    // nothing here resolves names: the upstream DNS is a port nobody answers on. No watchdog pass
    // runs during these tests: a claim that fails is reported as crashed by the claim itself.
    s = await startStack(
      { SPACE_WARM_POOL_SIZE: '1', SPACE_WATCHDOG_INTERVAL_MS: '600000' },
      { upstreamDns: '127.0.0.1:9', denyCidrs: DEFAULT_DENY_CIDRS.join(',') },
    );
  }, 600_000);
  afterAll(async () => {
    if (!s) return;
    await s.stop();
    expect(await leftovers(s)).toEqual(NO_LEFTOVERS);
  });

  const warmSlot = () =>
    waitFor('a warm slot', async () => (s.agent.warm.counts().base === 1 ? true : undefined), 120_000);
  const record = async (id: string) =>
    (
      await s.call<{ state: string; killReason: string | null; createdFrom: string }>(
        'GET',
        `/v1/sandboxes/${id}`,
      )
    ).body;

  it('the first command of a warm claim finds its policy registered with the gateway', async () => {
    await warmSlot();
    const id = await s.createSandbox({ egress: { allow: ['example.test'] } });
    expect((await record(id)).createdFrom).toBe('warm');
    const r = await s.exec(id, { cmd: 'true' });
    expect(r.exit.exitCode).toBe(0);
    // the command waited for the registration: it is there, with the sandbox's policy
    const reg = s.gateway!.deps.registry.list().find((x) => x.sandboxId === id);
    expect(reg?.policy.allow).toEqual(['example.test']);
    const del = await s.call<{ operation: { id: string } }>('DELETE', `/v1/sandboxes/${id}`);
    await s.call('GET', `/v1/operations/${del.body.operation.id}?waitMs=30000`);
    expect(s.gateway!.deps.registry.list().some((x) => x.sandboxId === id)).toBe(false);
  });

  it('a claim whose policy cannot be registered runs nothing and ends as crashed', async () => {
    await warmSlot();
    // the gateway's control socket accepts and never answers: the registration hangs until the
    // agent's call times out, so a command asked meanwhile must be held, then refused
    const socketPath = s.gateway!.controlSocket;
    await s.gateway!.close();
    const held: Socket[] = [];
    const stall = createServer((c) => held.push(c));
    stall.listen(socketPath);
    await once(stall, 'listening');
    try {
      const id = await s.createSandbox({ egress: { allow: ['example.test'] } });
      expect((await record(id)).createdFrom).toBe('warm');
      const res = await s.call<{ error: { code: string; message: string } }>(
        'POST',
        `/v1/sandboxes/${id}/commands`,
        { cmd: 'touch', args: ['/tmp/ran'] },
      );
      // refused, and why: the held call fails with the step's error, or — when the sandbox's crash
      // was recorded first — as the crashed sandbox it is, with the same reason
      expect({ status: res.status, code: res.body.error?.code }).toSatisfy(
        (r: { status: number; code: string }) =>
          (r.status === 502 && r.code === 'GUEST_UNAVAILABLE') ||
          (r.status === 410 && r.code === 'SANDBOX_CRASHED'),
      );
      expect(res.body.error.message).toMatch(/egress policy could not be put in force/);
      const rec = await waitFor('the sandbox to end', async () => {
        const r = await record(id);
        return r.state === 'killed' ? r : undefined;
      });
      expect(rec.killReason).toBe('crashed');
      expect(s.agent.sandboxes.list().map((x) => x.id)).not.toContain(id);
    } finally {
      for (const c of held) c.destroy();
      stall.close();
      await rm(socketPath, { force: true });
      await s.restartGateway();
    }
  });

  it('a watchdog pass registers again only what the gateway may not hold', async () => {
    await warmSlot();
    const id = await s.createSandbox({ egress: { allow: ['example.test'] } });
    expect((await s.exec(id, { cmd: 'true' })).exit.exitCode).toBe(0); // its registration landed
    const pass = () => s.agent.sandboxes.watch(async () => {});
    const held = () => s.gateway!.deps.registry.list().find((x) => x.sandboxId === id)?.policy.allow;
    let put = vi.spyOn(s.gateway!.deps.registry, 'put');
    const puts = () => put.mock.calls.filter(([, r]) => r.sandboxId === id).length;
    try {
      // held as sent, by the registry that answered: nothing to send again
      await pass();
      await pass();
      expect(puts()).toBe(0);
      // a policy change is one registration, and then held
      expect((await s.call('PATCH', `/v1/sandboxes/${id}/egress`, { allow: ['other.test'] })).status).toBe(
        200,
      );
      expect(puts()).toBe(1);
      await pass();
      expect(puts()).toBe(1);
      expect(held()).toEqual(['other.test']);
      // a registration the gateway failed: the policy stays, and the next pass sends it again
      put.mockImplementationOnce(() => {
        throw new Error('registry fault (injected)');
      });
      expect((await s.call('PATCH', `/v1/sandboxes/${id}/egress`, { allow: ['third.test'] })).status).toBe(
        500,
      );
      expect(puts()).toBe(2);
      await pass();
      expect(puts()).toBe(3);
      expect(held()).toEqual(['other.test']);
      await pass();
      expect(puts()).toBe(3); // held again: nothing sent
      // a restarted gateway holds nothing (a new registry id): the next pass restores the policy
      put.mockRestore();
      await s.restartGateway();
      put = vi.spyOn(s.gateway!.deps.registry, 'put');
      expect(held()).toBeUndefined();
      await pass();
      expect(puts()).toBe(1);
      expect(held()).toEqual(['other.test']);
      await pass();
      expect(puts()).toBe(1);
    } finally {
      put.mockRestore();
      const del = await s.call<{ operation: { id: string } }>('DELETE', `/v1/sandboxes/${id}`);
      await s.call('GET', `/v1/operations/${del.body.operation.id}?waitMs=30000`);
    }
  });

  it('a delete during a claim’s registration leaves the gateway holding nothing for it', async () => {
    // Between the agent and the gateway, a relay that holds every registration (a PUT) for
    // HOLD_MS and passes everything else straight on. Each of the agent's connections gets its
    // own relay connection, so the delete's unregistration (a DELETE) can overtake the claim's
    // registration, as on a slow gateway. The agent must send it after the registration's answer:
    // else the registration lands last and the gateway keeps a policy for a sandbox that is gone.
    const HOLD_MS = 1500;
    await s.restartGateway(); // the agent's next calls open new connections: through the relay
    await warmSlot();
    const socketPath = s.gateway!.controlSocket;
    const realPath = `${socketPath}.real`;
    await rename(socketPath, realPath); // a bound socket keeps answering under its new name
    // what the relay held (the bytes of each held request), and requests sent on less answers read
    let held = '';
    let unanswered = 0;
    const relay = createServer((agentSide) => {
      const gatewaySide = connect(realPath);
      gatewaySide.on('data', (chunk: Buffer) => {
        // an answer's status line starts a chunk (HTTP/1.1, one request at a time per connection)
        if (chunk.subarray(0, 9).toString() === 'HTTP/1.1 ') unanswered--;
        agentSide.write(chunk);
      });
      let holding = false;
      let chain = Promise.resolve();
      agentSide.on('data', (chunk: Buffer) => {
        // a request line starts a chunk; the chunks after it up to the next belong to it
        const line = /^[A-Z]+ \//.exec(chunk.subarray(0, 16).toString());
        if (line) {
          unanswered++;
          holding = line[0].startsWith('PUT ');
        }
        const hold = holding;
        if (hold) held += chunk.toString();
        chain = chain
          .then(() => (hold ? sleep(HOLD_MS) : undefined))
          .then(() => void gatewaySide.write(chunk));
      });
      agentSide.on('close', () => gatewaySide.end());
      gatewaySide.on('close', () => agentSide.end());
      gatewaySide.on('error', () => agentSide.destroy());
      agentSide.on('error', () => gatewaySide.destroy());
    });
    relay.listen(socketPath);
    await once(relay, 'listening');
    try {
      const id = await s.createSandbox({ egress: { allow: ['example.test'] } });
      expect((await record(id)).createdFrom).toBe('warm');
      const del = await s.call<{ operation: { id: string } }>('DELETE', `/v1/sandboxes/${id}`);
      const op = await s.call<{ state: string }>(
        'GET',
        `/v1/operations/${del.body.operation.id}?waitMs=30000`,
      );
      expect(op.body.state).toBe('succeeded');
      // the claim's registration went through the relay and was held
      expect(held).toContain(id);
      // every request the relay passed on has been answered by the gateway
      await waitFor('the gateway to answer what the relay held', async () =>
        unanswered === 0 ? true : undefined,
      );
      expect(s.gateway!.deps.registry.list().filter((x) => x.sandboxId === id)).toEqual([]);
    } finally {
      relay.close();
      await rm(socketPath, { force: true });
      await rename(realPath, socketPath);
      await s.restartGateway();
    }
  });
});
