/**
 * Command outputs on the node's disk stay bounded per sandbox (commands/retention.ts): run through
 * the real manager, spools and state folder over the in-memory FakeDriver, whose guest answers
 * each command with one line and its exit.
 */
import { readdir, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { READ_GRACE_MS } from '../commands/retention.ts';
import type { FakeGuests } from '../drivers/test-fake-driver.ts';
import { SandboxManager } from './manager.ts';
import { createRequest, fakeManagerOptions, fakeParts } from './test-manager.ts';

const MAX_COMMANDS = 8;

describe('command outputs on disk', () => {
  let dir: string;
  let guests: FakeGuests;
  let manager: SandboxManager;

  beforeEach(async () => {
    const parts = await fakeParts('space-outputs-');
    ({ dir, guests } = parts);
    manager = new SandboxManager(
      fakeManagerOptions(parts, {
        spoolRetention: { maxCommands: MAX_COMMANDS, maxBytes: 1 << 30, maxAgeMs: 3_600_000 },
      }),
    );
    await manager.create(createRequest('sbx_outputs'));
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
