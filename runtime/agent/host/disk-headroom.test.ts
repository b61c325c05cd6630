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
