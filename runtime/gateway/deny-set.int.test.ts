/**
 * E14 against the real kernel: a local route the node gains while the deny set runs is denied as
 * soon as the kernel reports it (long before the periodic refresh, set to a minute here), and its
 * removal gives the addresses back. The routes are on `lo`, in 192.88.99.0/24 (the retired 6to4
 * relay range, RFC 7526), so no packet leaves the host.
 */
import { execFile } from 'node:child_process';
import { randomInt } from 'node:crypto';
import { promisify } from 'node:util';
import { afterAll, describe, expect, it } from 'vitest';
import { LiveDenySet } from './deny-set.ts';

const run = promisify(execFile);
/** A /28 of 192.88.99.0/24 the attack suite does not use (it takes .64/28). */
const RANGE = `192.88.99.${16 * randomInt(8, 15)}/28`;
const INSIDE = RANGE.replace(/\d+\/28$/, (d) => String(Number.parseInt(d, 10) + 5));
const set = new LiveDenySet({ configured: [], nodeCidrs: [], nodeCidrsFile: '', refreshMs: 60_000 });

afterAll(async () => {
  set.stop();
  await run('ip', ['route', 'del', 'local', RANGE, 'dev', 'lo']).catch(() => {});
});

/** Polls `ok` every 20 ms for at most `ms`; returns its last value. */
async function within(ms: number, ok: () => boolean): Promise<boolean> {
  const end = Date.now() + ms;
  while (!ok() && Date.now() < end) await new Promise((r) => setTimeout(r, 20));
  return ok();
}

describe('LiveDenySet E14: local routes at run time, real kernel', () => {
  it('denies a local route added after start once the kernel reports it, and forgets it once removed', async () => {
    await set.start();
    expect(set.deniedBy(INSIDE)).toBeUndefined();
    await run('ip', ['route', 'add', 'local', RANGE, 'dev', 'lo']);
    // bounded by the route event, not the minute-long refresh period
    expect(await within(5000, () => set.deniedBy(INSIDE) !== undefined)).toBe(true);
    expect(set.deniedBy(INSIDE)).toBe(`node:${RANGE}`);
    await run('ip', ['route', 'del', 'local', RANGE, 'dev', 'lo']);
    expect(await within(5000, () => set.deniedBy(INSIDE) === undefined)).toBe(true);
  });
});
