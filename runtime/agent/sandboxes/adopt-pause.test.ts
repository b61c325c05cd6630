/**
 * Case F7 on the in-memory FakeDriver: an agent that dies at any step of a pause, a hibernation or
 * a restore (modelled by holding the driver call of that step at a gate for ever and starting a
 * second manager over the same state directory, driver and store) leaves a sandbox the next agent
 * settles into one state its files and its instance agree on, and whose next pause or resume works.
 */

import { existsSync } from 'node:fs';
import { cp, readdir, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { SandboxManager } from './manager.ts';
import { createRequest, fakeManagerOptions, fakeParts } from './test-manager.ts';

/** One node's lasting parts (state folder, store, driver) and a way to start an agent over them. */
async function node() {
  const parts = await fakeParts('space-adopt-pause-');
  const { dir, guests, driver } = parts;
  const agent = () => new SandboxManager(fakeManagerOptions(parts));
  const store = join(dir, 'hibernated');
  return {
    dir,
    store,
    driver,
    agent,
    /** The driver's instances and their states. */
    instances: async () => (await driver.list()).map((i) => i.state),
    hibernations: async () => (await readdir(store).catch(() => [] as string[])).sort(),
    async close() {
      await guests.close();
      await rm(dir, { recursive: true, force: true });
    },
  };
}

type Node = Awaited<ReturnType<typeof node>>;
let n: Node | null = null;
afterEach(async () => {
  await n?.close();
  n = null;
});

describe('an agent killed mid-pause: the next one settles the sandbox (F7)', () => {
  it('killed after the freeze of a hibernation: adopted frozen, the half-made snapshot dropped; thawed when its record runs, then hibernates', async () => {
    n = await node();
    const first = n.agent();
    await first.create(createRequest('sbx1'));
    n.driver.hold('snapshot');
    void first.pause('sbx1', 'hibernated').catch(() => {});
    await new Promise((r) => setTimeout(r, 50));
    expect(await n.instances()).toEqual(['paused']);

    const next = n.agent();
    expect((await next.adopt()).adopted).toEqual(['sbx1']);
    expect(next.get('sbx1').paused).toBe('frozen');
    expect(await n.hibernations()).toEqual([]);
    // the pause failed, its record says running: reconciliation thaws it
    expect(await next.convergePause('sbx1', 'running', async () => true)).toBe(true);
    expect(await n.instances()).toEqual(['running']);
    expect(next.get('sbx1').paused).toBeNull();
    const again = await next.pause('sbx1', 'hibernated');
    expect(again.mode).toBe('hibernated');
    expect(await n.instances()).toEqual([]);
    expect(await n.hibernations()).toEqual(['sbx1']);
  });

  it('killed after the freeze, the pause asked again: it finishes from the frozen instance', async () => {
    n = await node();
    const first = n.agent();
    await first.create(createRequest('sbx1'));
    n.driver.hold('snapshot');
    void first.pause('sbx1', 'hibernated').catch(() => {});
    await new Promise((r) => setTimeout(r, 50));
    const adoptedAt = Date.now();
    const next = n.agent();
    await next.adopt();
    // the moment of the freeze is the recorded one, not the adoption's
    expect(next.get('sbx1').pausedAt).toBeLessThan(adoptedAt);
    const out = await next.pause('sbx1', 'hibernated');
    expect(out.mode).toBe('hibernated');
    expect(out.pausedForMs).toBeGreaterThanOrEqual(50);
    expect(await n.instances()).toEqual([]);
  });

  it('killed after the snapshot was written, before the instance was destroyed: the snapshot is dropped, the sandbox kept', async () => {
    n = await node();
    const first = n.agent();
    await first.create(createRequest('sbx1'));
    const destroy = n.driver.hold('destroy');
    void first.pause('sbx1', 'hibernated').catch(() => {});
    await destroy.reached;
    expect(existsSync(join(n.store, 'sbx1', 'hibernated.json'))).toBe(true);

    const next = n.agent();
    expect((await next.adopt()).adopted).toEqual(['sbx1']);
    expect(await n.hibernations()).toEqual([]);
    expect(next.get('sbx1').paused).toBe('frozen');
    // a resume asked of it (its record says running) thaws it
    expect((await next.resume('sbx1')).how).toBe('thawed');
    expect(await n.instances()).toEqual(['running']);
  });

  it('killed after the instance was destroyed, before the sandbox was forgotten: hibernated, and the pause asked again answers so', async () => {
    n = await node();
    const first = n.agent();
    await first.create(createRequest('sbx1'));
    const saved = join(n.dir, 'saved');
    await cp(join(n.dir, 'state', 'sandboxes', 'sbx1'), saved, { recursive: true });
    await first.pause('sbx1', 'hibernated');
    // the state folder as it was before the agent would have removed it
    await cp(saved, join(n.dir, 'state', 'sandboxes', 'sbx1'), { recursive: true });

    const next = n.agent();
    const adopted = await next.adopt();
    expect(adopted).toMatchObject({ adopted: [], lost: [], hibernated: ['sbx1'] });
    expect(await n.hibernations()).toEqual(['sbx1']);
    const out = await next.pause('sbx1', 'hibernated');
    expect(out.mode).toBe('hibernated');
    expect(out.hibernation?.path).toBe(join(n.store, 'sbx1'));
  });

  it('killed during a restore, before the snapshot was removed: the restored instance is undone, the snapshot kept', async () => {
    n = await node();
    const first = n.agent();
    const req = createRequest('sbx1');
    await first.create(req);
    const h = await first.pause('sbx1', 'hibernated');
    const saved = join(n.dir, 'saved');
    await cp(join(n.store, 'sbx1'), saved, { recursive: true });
    await first.resume('sbx1', { ...req, hibernation: h.hibernation! });
    // the snapshot as it was before the agent would have removed it
    await cp(saved, join(n.store, 'sbx1'), { recursive: true });

    const next = n.agent();
    expect((await next.adopt()).unrestored).toEqual(['sbx1']);
    expect(await n.instances()).toEqual([]);
    expect(await n.hibernations()).toEqual(['sbx1']);
    const back = await next.resume('sbx1', { ...req, hibernation: h.hibernation! });
    expect(back.how).toBe('restored');
    expect(await n.instances()).toEqual(['running']);
  });

  it('a freeze its pause never recorded (killed right after the driver froze it) is still found frozen and thawed by a resume', async () => {
    n = await node();
    const first = n.agent();
    await first.create(createRequest('sbx1'));
    // the driver froze it, the agent died before writing anything
    await n.driver.pause((await n.driver.list())[0]!.instanceId);

    const next = n.agent();
    await next.adopt();
    expect(next.get('sbx1').paused).toBe('frozen');
    expect((await next.resume('sbx1')).how).toBe('thawed');
    expect(await n.instances()).toEqual(['running']);
  });

  it('a resume of a sandbox not marked paused thaws an instance its driver holds paused', async () => {
    n = await node();
    const agent = n.agent();
    await agent.create(createRequest('sbx1'));
    await n.driver.pause((await n.driver.list())[0]!.instanceId);
    expect(agent.get('sbx1').paused).toBeNull();
    await agent.resume('sbx1');
    expect(await n.instances()).toEqual(['running']);
  });

  it('reconciliation freezes a sandbox whose record is paused (frozen) but that runs, unless the record moved on', async () => {
    n = await node();
    const agent = n.agent();
    await agent.create(createRequest('sbx1'));
    expect(await agent.convergePause('sbx1', 'frozen', async () => false)).toBe(false);
    expect(await n.instances()).toEqual(['running']);
    expect(await agent.convergePause('sbx1', 'frozen', async () => true)).toBe(true);
    expect(await n.instances()).toEqual(['paused']);
    expect(agent.get('sbx1').paused).toBe('frozen');
  });
});
