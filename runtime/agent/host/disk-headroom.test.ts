import { execFileSync } from 'node:child_process';
import { tmpdir } from 'node:os';
import { describe, expect, it } from 'vitest';
import { stateDiskFinding } from '../doctor.ts';
import { DiskGuard, floorBytes, headroom, underPressure } from './disk-headroom.ts';

const GiB = 2 ** 30;

describe('state disk headroom', () => {
  it('the floor is the larger of the bytes and the share of the size', () => {
    expect(floorBytes(100 * GiB, { bytes: GiB, percent: 5 })).toBe(5 * GiB);
    expect(floorBytes(10 * GiB, { bytes: GiB, percent: 5 })).toBe(GiB);
    expect(underPressure({ freeBytes: GiB - 1, totalBytes: 10 * GiB }, { bytes: GiB, percent: 5 })).toBe(
      true,
    );
    expect(underPressure({ freeBytes: GiB, totalBytes: 10 * GiB }, { bytes: GiB, percent: 5 })).toBe(false);
  });

  it('reads a real file system: free within total', async () => {
    const h = await headroom(tmpdir());
    expect(h.totalBytes).toBeGreaterThan(0);
    expect(h.freeBytes).toBeGreaterThanOrEqual(0);
    expect(h.freeBytes).toBeLessThanOrEqual(h.totalBytes);
    // free is what an unprivileged user may still write, as df's "avail" (root-reserved blocks
    // left out: 5% of an ext4 by default), give or take what others wrote in between
    const avail = Number(
      execFileSync('df', ['-B1', '--output=avail', tmpdir()], { encoding: 'utf8' }).split('\n')[1],
    );
    expect(Math.abs(h.freeBytes - avail)).toBeLessThan(256 * 2 ** 20);
  });

  it('over several file systems the reading is the tightest; a path that does not exist is skipped', async () => {
    const paths = [tmpdir(), '/dev/shm', process.cwd()];
    const read = await Promise.all(paths.map(async (p) => ({ p, h: await headroom(p) })));
    read.sort((a, b) => b.h.freeBytes - a.h.freeBytes);
    const [roomy, tight] = [read[0]!, read.at(-1)!];
    const guard = new DiskGuard([`${tmpdir()}/not/there`, roomy.p, tight.p], { bytes: 0, percent: 0 });
    expect((await guard.sample()).totalBytes).toBe(tight.h.totalBytes);
    // a floor between the two: the tight one is under it, so the node is
    if (roomy.h.freeBytes - tight.h.freeBytes < 2 ** 30) return; // one file system here: nothing to tell apart
    const between = { bytes: Math.round((roomy.h.freeBytes + tight.h.freeBytes) / 2), percent: 0 };
    expect((await new DiskGuard([roomy.p, tight.p], between).sample()).pressure).toBe(true);
  });

  it('admits above the floor and refuses under it with NODE_DISK_FULL', async () => {
    await new DiskGuard(tmpdir(), { bytes: 0, percent: 0 }).admit();
    const changes: boolean[] = [];
    const full = new DiskGuard(tmpdir(), { bytes: Number.MAX_SAFE_INTEGER, percent: 0 }, (h) =>
      changes.push(h.pressure),
    );
    await expect(full.admit()).rejects.toMatchObject({ code: 'NODE_DISK_FULL' });
    expect(full.last?.pressure).toBe(true);
    // the crossing is told once, whichever sample saw it first (here a create's)
    await full.sample();
    expect(changes).toEqual([true]);
  });

  it('doctor lists the headroom (never blocking), for a state dir not made yet too', async () => {
    const ok = await stateDiskFinding(`${tmpdir()}/not/made/yet`, { bytes: 0, percent: 0 });
    expect(ok).toMatchObject({ id: 'state-disk', ok: true, neededBy: [] });
    expect(ok.detail).toMatch(/GiB free of .* GiB at .*not\/made\/yet \(floor/);
    const low = await stateDiskFinding(tmpdir(), { bytes: 0, percent: 100 });
    expect(low.ok).toBe(false);
  });
});
