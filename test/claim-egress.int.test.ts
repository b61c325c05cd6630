/**
 * A warm claim's egress policy is put in force behind the create (runtime/agent/sandboxes.ts,
 * #claimOrMake): the create answers once the state file is written, and every call into the
 * sandbox waits for the gateway registration. These check both outcomes against a real gateway:
 * the first command finds the policy registered, and a registration that cannot be made (the
 * gateway is down) never lets a command run and ends the sandbox as crashed.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DEFAULT_DENY_CIDRS } from '../runtime/gateway/addresses.ts';
import { leftovers, NO_LEFTOVERS, type Stack, startStack, waitFor } from './stack.ts';

describe('warm claim: egress policy behind the create', () => {
  let s: Stack;
  beforeAll(async () => {
    // nothing here resolves names: the upstream DNS is a port nobody answers on
    s = await startStack(
      { SPACE_WARM_POOL_SIZE: '1' },
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
    await s.gateway!.close();
    try {
      const id = await s.createSandbox({ egress: { allow: ['example.test'] } });
      expect((await record(id)).createdFrom).toBe('warm');
      const res = await s.call<{ error: { code: string; message: string } }>(
        'POST',
        `/v1/sandboxes/${id}/commands`,
        { cmd: 'touch', args: ['/tmp/ran'] },
      );
      // refused before it reached the guest (or the sandbox is already gone)
      expect(res.status).toBeGreaterThanOrEqual(400);
      if (res.status === 502) {
        expect(res.body.error.code).toBe('GUEST_UNAVAILABLE');
        expect(res.body.error.message).toMatch(/egress policy could not be put in force/);
      }
      const rec = await waitFor('the sandbox to end', async () => {
        const r = await record(id);
        return r.state === 'killed' ? r : undefined;
      });
      expect(rec.killReason).toBe('crashed');
      expect(s.agent.sandboxes.list().map((x) => x.id)).not.toContain(id);
    } finally {
      await s.restartGateway();
    }
  });
});
