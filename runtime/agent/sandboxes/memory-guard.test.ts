import pino from 'pino';
import { afterEach, describe, expect, it } from 'vitest';
import { SpaceError } from '../../core/errors.ts';
import type { OomKillResult } from '../../core/guest-protocol.ts';
import {
  AFTER_KILL_MS,
  type GuardedSandbox,
  killThreshold,
  MAX_CHECK_MS,
  MemoryGuard,
  MIN_CHECK_MS,
  nextCheckMs,
} from './memory-guard.ts';

const MiB = 2 ** 20;
const log = pino({ level: 'silent' });

describe('killThreshold and nextCheckMs', () => {
  it('keeps 64 MiB per vCPU below the limit, never more than a quarter of it', () => {
    expect(killThreshold(256 * MiB, 1)).toBe(192 * MiB);
    expect(killThreshold(2048 * MiB, 4)).toBe(1792 * MiB);
    expect(killThreshold(1024 * MiB, 8)).toBe(768 * MiB);
    expect(killThreshold(64 * MiB, 1)).toBe(48 * MiB);
  });

  it('reads a sandbox sooner the nearer it is to the threshold, within the bounds', () => {
    const t = 224 * MiB;
    expect(nextCheckMs(32 * MiB, t, 1)).toBe(187); // 192 MiB at 1 GiB/s
    expect(nextCheckMs(32 * MiB, t, 2)).toBe(93);
    expect(nextCheckMs(222 * MiB, t, 1)).toBe(MIN_CHECK_MS);
    expect(nextCheckMs(300 * MiB, t, 1)).toBe(MIN_CHECK_MS);
    expect(nextCheckMs(0, 64 * 1024 * MiB, 1)).toBe(MAX_CHECK_MS);
  });
});

describe('MemoryGuard', () => {
  const guards: MemoryGuard[] = [];
  afterEach(() => {
    for (const g of guards.splice(0)) g.stop();
  });

  /** A guard over one sandbox whose charge and kill the test controls (no timers started). */
  function setup(kill: () => Promise<OomKillResult>) {
    const charge = new Map<string, number>([['i1', 100 * MiB]]);
    const kills: string[] = [];
    let present = true;
    const sb: GuardedSandbox = {
      id: 'sb1',
      instanceId: 'i1',
      limitBytes: 256 * MiB,
      vcpus: 1,
      oomKill: () => {
        kills.push('sb1');
        return kill();
      },
    };
    const guard = new MemoryGuard({
      sandboxes: () => (present ? [sb] : []),
      charge: (id) => charge.get(id),
      log,
    });
    guards.push(guard);
    return { guard, charge, kills, remove: () => (present = false) };
  }

  it('does nothing below the threshold, kills once at it, and reads again soon after the kill', async () => {
    let answer!: (r: OomKillResult) => void;
    const { guard, charge, kills } = setup(() => new Promise((r) => (answer = r)));
    guard.tick(1_000);
    expect(kills).toEqual([]);
    charge.set('i1', 200 * MiB);
    guard.tick(2_000);
    expect(kills).toEqual(['sb1']);
    // a kill in flight: no second one, however often the guard looks
    guard.tick(2_010);
    guard.tick(2_500);
    expect(kills).toEqual(['sb1']);
    charge.set('i1', 60 * MiB);
    answer({ killed: { pid: 7, comm: 'python3', rssBytes: 190 * MiB } });
    await new Promise((r) => setImmediate(r));
    // the memory was freed: the next read finds it below, no second kill
    guard.tick(Date.now() + AFTER_KILL_MS);
    expect(kills).toEqual(['sb1']);
  });

  it('kills again when the charge stays above after a kill (the next largest process)', async () => {
    const { guard, charge, kills } = setup(async () => ({
      killed: { pid: 9, comm: 'node', rssBytes: 50 * MiB },
    }));
    charge.set('i1', 240 * MiB);
    guard.tick(Date.now());
    await new Promise((r) => setImmediate(r));
    guard.tick(Date.now() + AFTER_KILL_MS);
    await new Promise((r) => setImmediate(r));
    expect(kills.length).toBeGreaterThanOrEqual(2);
  });

  it('stops asking a guest that cannot kill (an older daemon), and forgets sandboxes that left', async () => {
    const { guard, charge, kills, remove } = setup(async () => {
      throw new SpaceError('BAD_REQUEST', 'protocol 2');
    });
    charge.set('i1', 250 * MiB);
    guard.tick(Date.now());
    await new Promise((r) => setImmediate(r));
    guard.tick(Date.now() + 10 * AFTER_KILL_MS);
    guard.tick(Date.now() + 20 * AFTER_KILL_MS);
    expect(kills).toEqual(['sb1']);
    remove();
    guard.tick(Date.now());
    expect(kills).toEqual(['sb1']);
  });

  it('a charge it cannot read (instance gone) is no reason to kill', () => {
    const { guard, charge, kills } = setup(async () => ({ killed: null }));
    charge.delete('i1');
    guard.tick(Date.now());
    expect(kills).toEqual([]);
  });
});
