/**
 * The state disk's headroom: free and total bytes of the file system holding the agent's state
 * directory (`statfs(2)`: free = blocks available to unprivileged users × block size, so the
 * root-reserved blocks do not count as room), and the guard that stops the node taking new
 * sandboxes before that disk is full. Below the floor — the larger of SPACE_DISK_RESERVE_BYTES and
 * SPACE_DISK_RESERVE_PERCENT of the size — the node is unschedulable and says `diskPressure` in its
 * heartbeat, creates sent to it anyway answer NODE_DISK_FULL and its warm pool stops refilling;
 * the sandboxes it runs go on. The floor is checked every heartbeat and before each create.
 */
import { statfs } from 'node:fs/promises';
import { SpaceError } from '../../core/errors.ts';

/** Free and total bytes of a file system. */
export interface Headroom {
  freeBytes: number;
  totalBytes: number;
}

/** The floor below which a node takes no new sandboxes. */
export interface DiskReserve {
  bytes: number;
  /** Share of the file system's size, percent (0–100). */
  percent: number;
}

/** The headroom of the file system holding `path`. @throws what statfs throws (ENOENT, EACCES). */
export async function headroom(path: string): Promise<Headroom> {
  const s = await statfs(path);
  return { freeBytes: s.bavail * s.bsize, totalBytes: s.blocks * s.bsize };
}

/** The floor in bytes for a file system of `totalBytes`: the larger of the two settings. Pure. */
export function floorBytes(totalBytes: number, r: DiskReserve): number {
  return Math.max(r.bytes, Math.ceil((totalBytes * r.percent) / 100));
}

/** Whether `h` is below the floor of `r`. Pure. */
export function underPressure(h: Headroom, r: DiskReserve): boolean {
  return h.freeBytes < floorBytes(h.totalBytes, r);
}

/** "1.2 GiB" for a byte count. Pure. */
export function gib(bytes: number): string {
  return `${(bytes / 2 ** 30).toFixed(bytes < 2 ** 30 ? 3 : 1)} GiB`;
}

/**
 * Watches the state disk: {@link sample} reads it again (the heartbeat and each create call it),
 * {@link last} is the latest reading. A reading that fails counts as no pressure (logged by the
 * caller): a statfs error is no evidence the disk is full.
 */
export class DiskGuard {
  readonly #paths: string[];
  readonly #reserve: DiskReserve;
  readonly #onChange: ((h: Headroom & { pressure: boolean }) => void) | undefined;
  #last: (Headroom & { pressure: boolean }) | null = null;

  /**
   * Watches the file systems holding `paths` (the state directory, and folders of it that may be
   * mounted apart, e.g. `sandboxes/`): the reading is the one with the least free space. Paths
   * that do not exist are skipped (at least one must). `onChange` is called with the reading that
   * went under the floor or back above it (whichever caller's sample saw it: a create's too).
   */
  constructor(
    paths: string | readonly string[],
    reserve: DiskReserve,
    onChange?: (h: Headroom & { pressure: boolean }) => void,
  ) {
    this.#paths = typeof paths === 'string' ? [paths] : [...paths];
    this.#reserve = reserve;
    this.#onChange = onChange;
  }

  /** The latest reading, or null before the first. */
  get last(): (Headroom & { pressure: boolean }) | null {
    return this.#last;
  }

  /** Reads the disk now; returns and keeps the reading. @throws what statfs throws. */
  async sample(): Promise<Headroom & { pressure: boolean }> {
    const all = await Promise.allSettled(this.#paths.map((p) => headroom(p)));
    const read = all.flatMap((r) => (r.status === 'fulfilled' ? [r.value] : []));
    if (read.length === 0) throw (all[0] as PromiseRejectedResult).reason;
    const withPressure = read.map((h) => ({ ...h, pressure: underPressure(h, this.#reserve) }));
    // the tightest: one under its floor first, else the least free
    withPressure.sort((a, b) => Number(b.pressure) - Number(a.pressure) || a.freeBytes - b.freeBytes);
    const was = this.#last?.pressure ?? false;
    const h = withPressure[0]!;
    this.#last = h;
    if (h.pressure !== was) this.#onChange?.(h);
    return h;
  }

  /**
   * Reads the disk and refuses a new sandbox below the floor.
   * @throws SpaceError NODE_DISK_FULL (details: freeBytes, floorBytes).
   */
  async admit(): Promise<void> {
    const h = await this.sample().catch(() => null);
    if (!h?.pressure) return;
    const floor = floorBytes(h.totalBytes, this.#reserve);
    throw new SpaceError(
      'NODE_DISK_FULL',
      `the node's state disk has ${gib(h.freeBytes)} free, under its ${gib(floor)} floor: it takes no new sandboxes until space is freed`,
      { freeBytes: h.freeBytes, floorBytes: floor },
    );
  }
}
