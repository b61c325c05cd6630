/**
 * The sandbox verbs' races, run in milliseconds on the in-memory FakeDriver (drivers/test-fake-driver.ts):
 * each holds one driver call at a gate to order the race exactly, then asserts the end state —
 * no instance, network, gateway registration, state folder or hibernation left that no sandbox
 * owns, and the registry listing exactly the sandboxes that should run.
 */
import { readdir, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { pino } from 'pino';
import { afterEach, describe, expect, it } from 'vitest';
import { WarmPool } from '../instances/warm-pool.ts';
import { SandboxManager } from './manager.ts';
import { createRequest, fakeManagerOptions, fakeParts } from './test-manager.ts';
import type { CreateSandbox } from './types.ts';

const SHAPE = { vcpus: 1, memoryMiB: 256 };
const log = pino({ level: 'silent' });

/** A node of fakes: a manager over a FakeDriver, FakeNetworks and a FakeGateway, state in a temp folder. */
async function fakeNode() {
  const parts = await fakeParts('space-races-');
  const { dir, guests, driver, networks, gateway } = parts;
  const manager = new SandboxManager(fakeManagerOptions(parts, { log }));
  let pool: WarmPool | null = null;
  const node = {
    dir,
    guests,
    driver,
    networks,
    gateway,
    manager,
    /** A warm pool of one slot of {@link SHAPE} for `base`, taking its slots from the manager's warm slots. */
    warmPool(): WarmPool {
      pool = new WarmPool({
        templates: ['base'],
        min: 1,
        max: 1,
        shape: SHAPE,
        parallel: 1,
        share: 1,
        capacityMiB: 1 << 20,
        reservedMiB: () => manager.reservedMiB(),
        boot: (t) => manager.warmSlots.boot(t, SHAPE),
        discard: (i) => manager.warmSlots.discard(i),
        log,
      });
      manager.warmSlots.attach(pool);
      return pool;
    },
    /**
     * Asserts that the node holds exactly the sandboxes `running` (and the pool's ready slots):
     * their instances, networks, gateway registrations and state folders, and nothing else; and
     * the hibernations `hibernated` in the store.
     */
    async expectOnly(running: string[], hibernated: string[] = []): Promise<void> {
      const ids = [...running].sort();
      const sandboxes = manager.list();
      expect(sandboxes.map((s) => s.id).sort()).toEqual(ids);
      const slots = pool?.instanceIds() ?? [];
      const owned = [...sandboxes.map((s) => s.instance.instanceId), ...slots].sort();
      expect([...driver.instances.keys()].sort()).toEqual(owned);
      const nets = [
        ...sandboxes.map((s) => s.instance.network.netns),
        ...slots.map((i) => `fake-${i}`),
      ].sort();
      expect([...networks.allocated.keys()].sort()).toEqual(nets);
      expect([...gateway.held.values()].sort()).toEqual(ids);
      expect((await readdir(join(dir, 'state', 'sandboxes')).catch(() => [])).sort()).toEqual(ids);
      expect((await readdir(join(dir, 'hibernated')).catch(() => [])).sort()).toEqual([...hibernated].sort());
    },
    async close(): Promise<void> {
      await pool?.drain();
      await manager.destroyAll();
      await guests.close();
      await rm(dir, { recursive: true, force: true });
    },
  };
  return node;
}

type Node = Awaited<ReturnType<typeof fakeNode>>;

/** A create request of {@link SHAPE}, with an env and an egress allow-list the races must carry over. */
function request(id: string): CreateSandbox {
  return createRequest(id, {
    ...SHAPE,
    env: { A: '1' },
    egress: { mode: 'allow-list', allow: ['example.com'], deny: [], cidrs: [] },
  });
}

/**
 * Lets every other task run until it waits on I/O or a gate (a few turns of the event loop): a
 * verb that should be waiting for the one held at a gate has then had every chance not to.
 */
async function letOthersRun(): Promise<void> {
  for (let i = 0; i < 20; i++) await new Promise((r) => setImmediate(r));
}

/** The SpaceError code `p` rejects with (undefined when it resolves). */
async function codeOf(p: Promise<unknown>): Promise<string | undefined> {
  return p.then(
    () => undefined,
    (err: { code?: string }) => err.code ?? String(err),
  );
}

describe('sandbox verbs on the FakeDriver: races end consistent', () => {
  let node: Node | undefined;
  afterEach(async () => {
    await node?.close();
    node = undefined;
  });

  it('double create of one id is one sandbox on one instance (idempotent)', async () => {
    node = await fakeNode();
    const { manager, driver } = node;
    const [a, b] = await Promise.all([manager.create(request('sbx1')), manager.create(request('sbx1'))]);
    expect(a).toBe(b);
    expect(await manager.create(request('sbx1'))).toBe(a);
    expect(driver.calls.create).toBe(1);
    await node.expectOnly(['sbx1']);
    await manager.delete('sbx1');
    await node.expectOnly([]);
  });

  it('a delete during a create (its instance booting) refuses the create and leaves nothing', async () => {
    node = await fakeNode();
    const { manager, driver } = node;
    const boot = driver.hold('create');
    const created = manager.create(request('sbx1'));
    await boot.reached;
    const deleted = manager.delete('sbx1');
    await letOthersRun();
    boot.release();
    expect(await codeOf(created)).toBe('SANDBOX_NOT_FOUND');
    await deleted;
    await node.expectOnly([]);
    // the tombstone refuses a create that arrives after the delete
    expect(await codeOf(manager.create(request('sbx1')))).toBe('SANDBOX_NOT_FOUND');
    await node.expectOnly([]);
  });

  it('create and delete of one id sent together, in either order, leave nothing', async () => {
    node = await fakeNode();
    const { manager } = node;
    const [c1] = await Promise.allSettled([manager.create(request('sbx1')), manager.delete('sbx1')]);
    expect(c1.status).toBe('rejected');
    const [, c2] = await Promise.allSettled([manager.delete('sbx2'), manager.create(request('sbx2'))]);
    expect(c2.status).toBe('rejected');
    await node.expectOnly([]);
  });

  it('a create whose instance fails to boot, during a delete of it, leaves nothing', async () => {
    node = await fakeNode();
    const { manager, driver } = node;
    const boot = driver.hold('create');
    driver.failNext('create');
    const created = manager.create(request('sbx1'));
    await boot.reached;
    const deleted = manager.delete('sbx1');
    await letOthersRun();
    boot.release();
    expect(await codeOf(created)).toBe('DRIVER_FAILED');
    await deleted;
    await node.expectOnly([]);
  });

  it('a restore that fails is undone (instance and network) and the create boots instead', async () => {
    node = await fakeNode();
    const { manager, driver } = node;
    expect(await manager.prepareSnapshot('base', SHAPE)).not.toBeNull();
    await node.expectOnly([]);
    driver.failNext('restore');
    const sb = await manager.create(request('sbx1'));
    expect(sb.source).toBe('boot');
    await node.expectOnly(['sbx1']);
    // and with the snapshot working, a create restores from it (rekeyed to its own secret)
    const sb2 = await manager.create(request('sbx2'));
    expect(sb2.source).toBe('snapshot');
    await sb2.guest.health();
    await node.expectOnly(['sbx1', 'sbx2']);
  });

  it('pause vs delete: a delete waits for the pause in flight, then destroys the frozen sandbox', async () => {
    node = await fakeNode();
    const { manager, driver } = node;
    await manager.create(request('sbx1'));
    const freeze = driver.hold('pause');
    const paused = manager.pause('sbx1', 'frozen');
    await freeze.reached;
    const deleted = manager.delete('sbx1');
    await letOthersRun();
    freeze.release();
    expect(await paused).toMatchObject({ mode: 'frozen' });
    await deleted;
    await node.expectOnly([]);
    // a pause after the delete finds nothing
    expect(await codeOf(manager.pause('sbx1', 'frozen'))).toBe('SANDBOX_NOT_FOUND');
  });

  it('pause during a delete (its instance being destroyed) leaves nothing, whatever the pause answers', async () => {
    node = await fakeNode();
    const { manager, driver } = node;
    await manager.create(request('sbx1'));
    const destroy = driver.hold('destroy');
    const deleted = manager.delete('sbx1');
    await destroy.reached;
    const paused = manager.pause('sbx1', 'frozen');
    destroy.release();
    await Promise.allSettled([paused]);
    await deleted;
    await node.expectOnly([]);
  });

  it('hibernate vs delete: the delete waits for the snapshot, then removes the hibernation too', async () => {
    node = await fakeNode();
    const { manager, driver } = node;
    await manager.create(request('sbx1'));
    const snap = driver.hold('snapshot');
    const hibernated = manager.pause('sbx1', 'hibernated');
    await snap.reached;
    const deleted = manager.delete('sbx1');
    await letOthersRun();
    snap.release();
    expect((await hibernated).mode).toBe('hibernated');
    await deleted;
    await node.expectOnly([], []);
  });

  it('a hibernation that fails while a delete waits leaves the sandbox to the delete, and nothing after', async () => {
    node = await fakeNode();
    const { manager, driver } = node;
    await manager.create(request('sbx1'));
    const snap = driver.hold('snapshot');
    driver.failNext('snapshot');
    const hibernated = manager.pause('sbx1', 'hibernated');
    await snap.reached;
    const deleted = manager.delete('sbx1');
    await letOthersRun();
    snap.release();
    expect(await codeOf(hibernated)).toBe('DRIVER_FAILED');
    await deleted;
    await node.expectOnly([]);
  });

  it('resume (restore from hibernation) vs delete: the restored sandbox is destroyed, the hibernation gone', async () => {
    node = await fakeNode();
    const { manager, driver } = node;
    await manager.create(request('sbx1'));
    const { hibernation } = await manager.pause('sbx1', 'hibernated');
    await node.expectOnly([], ['sbx1']);
    const restore = driver.hold('restore');
    const resumed = manager.resume('sbx1', { ...request('sbx1'), hibernation: hibernation! });
    await restore.reached;
    const deleted = manager.delete('sbx1');
    await letOthersRun();
    restore.release();
    expect((await resumed).how).toBe('restored');
    await deleted;
    await node.expectOnly([]);
    // a resume after the delete is refused, and makes nothing
    expect(await codeOf(manager.resume('sbx1', { ...request('sbx1'), hibernation: hibernation! }))).toBe(
      'SANDBOX_NOT_FOUND',
    );
    await node.expectOnly([]);
  });

  it('resume (thaw) vs delete: the delete waits for the thaw, then destroys the sandbox', async () => {
    node = await fakeNode();
    const { manager, driver } = node;
    await manager.create(request('sbx1'));
    await manager.pause('sbx1', 'frozen');
    const thaw = driver.hold('resume');
    const resumed = manager.resume('sbx1');
    await thaw.reached;
    const deleted = manager.delete('sbx1');
    await letOthersRun();
    thaw.release();
    expect((await resumed).how).toBe('thawed');
    await deleted;
    await node.expectOnly([]);
  });

  it('warm-pool claim vs refill: a create claims the ready slot, the next boots cold while the refill is held', async () => {
    node = await fakeNode();
    const { manager, driver } = node;
    const pool = node.warmPool();
    pool.refill();
    await pool.settle();
    expect(pool.counts()).toEqual({ base: 1 });
    const a = await manager.create(request('sbx1'));
    expect(a.source).toBe('warm');
    // the refill that replaces the claimed slot is held at the driver; a create meanwhile does not wait for it
    const refill = driver.hold('create');
    pool.refill();
    await refill.reached;
    const b = await manager.create(request('sbx2'));
    expect(b.source).toBe('boot');
    refill.release();
    await pool.settle();
    expect(pool.counts()).toEqual({ base: 1 });
    await node.expectOnly(['sbx1', 'sbx2']);
    // a warm claim's sandbox got its env and its egress registration
    expect(node.guests.inits.get(a.instance.instanceId)).toEqual([{ env: { A: '1' } }]);
    await Promise.all([manager.delete('sbx1'), manager.delete('sbx2')]);
    await pool.drain();
    await node.expectOnly([]);
    expect(driver.instances.size).toBe(0);
    expect(await readdir(join(node.dir, 'state', 'warm')).catch(() => [])).toEqual([]);
  });

  it('a delete of a warm claim while its egress registration is in flight leaves the gateway holding nothing', async () => {
    node = await fakeNode();
    const { manager, gateway } = node;
    const pool = node.warmPool();
    pool.refill();
    await pool.settle();
    let letRegister!: () => void;
    const registered = new Promise<void>((r) => {
      letRegister = r;
    });
    const register = gateway.register.bind(gateway);
    gateway.register = async (address, r) => {
      await registered;
      return register(address, r);
    };
    const sb = await manager.create(request('sbx1'));
    expect(sb.source).toBe('warm');
    const deleted = manager.delete('sbx1');
    await letOthersRun();
    letRegister();
    await deleted;
    await pool.drain();
    await node.expectOnly([]);
  });
});
