/**
 * Command outputs on the node's disk stay bounded per sandbox (commands/retention.ts): run through
 * the real manager, spools and state folder over the in-memory FakeDriver, whose guest answers
 * each command with one line and its exit.
 */
import { mkdtemp, readdir, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pino } from 'pino';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { READ_GRACE_MS } from '../commands/retention.ts';
import { FakeDriver, FakeGateway, FakeGuests, FakeNetworks } from '../drivers/test-fake-driver.ts';
import { SandboxManager } from './manager.ts';

const MAX_COMMANDS = 8;

describe('command outputs on disk', () => {
  let dir: string;
  let guests: FakeGuests;
  let manager: SandboxManager;

  beforeEach(async () => {
    dir = await mkdtemp(join(tmpdir(), 'space-outputs-'));
    guests = new FakeGuests();
    await guests.listen();
    manager = new SandboxManager({
      stateDir: join(dir, 'state'),
      driver: new FakeDriver(guests),
      networks: new FakeNetworks(),
      templateImage: async (t) => ({ template: t, digest: 'fake', lowerDirs: [] }),
      pidsLimit: 64,
      diskMiB: 0,
      createConcurrency: 4,
      refillConcurrency: 1,
      spoolLimitBytes: 1 << 20,
      spoolRetention: { maxCommands: MAX_COMMANDS, maxBytes: 1 << 30, maxAgeMs: 3_600_000 },
      gateway: new FakeGateway(),
      baseEnv: {},
      hibernateDir: join(dir, 'hibernated'),
      hibernateStore: 'test',
      activity: null,
      log: pino({ level: 'silent' }),
    });
    await manager.create({
      sandboxId: 'sbx_outputs',
      sessionId: 'ses0000000001',
      template: 'base',
      vcpus: 1,
      memoryMiB: 256,
      env: {},
      expiresAtMs: Date.now() + 60_000,
      egress: { mode: 'allow-list', allow: [], deny: [], cidrs: [] },
      credentials: [],
    });
  });
  afterEach(async () => {
    await manager.destroyAll();
    await guests.close();
    await rm(dir, { recursive: true, force: true });
  });

  const files = () => readdir(join(dir, 'state', 'sandboxes', 'sbx_outputs', 'commands'));
  const run = async (i: number) => {
    const cmd = await manager.startCommand('sbx_outputs', {
      commandId: `cmd${String(i).padStart(4, '0')}`,
      cmd: 'true',
      args: [],
      shell: false,
      env: {},
      user: 'user',
    });
    await cmd.done;
    return cmd;
  };

  it('many commands leave at most the bound of outputs (spool + record each), the newest', async () => {
    for (let i = 0; i < 60; i++) await run(i);
    const names = await files();
    expect(names.length).toBeLessThanOrEqual(2 * MAX_COMMANDS);
    expect(names).toContain('cmd0059.out');
    expect(names).toContain('cmd0059.json');
    expect(names).not.toContain('cmd0000.out');
    expect(manager.get('sbx_outputs').commands.size).toBeLessThanOrEqual(MAX_COMMANDS);
  });

  it('an output read to its exit is reclaimed after the read grace; one not read stays', async () => {
    const read = await run(1);
    const unread = await run(2);
    const got: number[] = [];
    for await (const f of read.spool.frames(0)) got.push(f.type);
    expect(got).toEqual([1, 3]);
    expect(await manager.reclaimOutputs(Date.now())).toBe(0);
    expect(await manager.reclaimOutputs(Date.now() + READ_GRACE_MS)).toBe(1);
    expect((await files()).sort()).toEqual([`${unread.id}.json`, `${unread.id}.out`]);
    expect([...manager.get('sbx_outputs').commands.keys()]).toEqual([unread.id]);
  });
});
