/**
 * The guest's watch on a network file system, as envd: refused unless the call allows network
 * mounts. Needs FUSE (`/dev/fuse`, `fusermount`) and bindfs (installed by .ci/run) for a real
 * FUSE mount, so it is an int test.
 */
import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { call, type Guest, openWatch, q, startGuest } from './test-harness.ts';

let g: Guest;
beforeAll(async () => {
  g = await startGuest();
});
afterAll(async () => {
  await g?.stop();
});

describe('guest watch on network mounts', () => {
  it('refuses a directory on a network file system (FUSE here) unless networkMounts=1, as envd', async () => {
    const base = mkdtempSync(join(tmpdir(), 'space-fuse-'));
    const [src, mnt] = [join(base, 'src'), join(base, 'mnt')];
    mkdirSync(src);
    mkdirSync(mnt);
    // bindfs (scripts/host-deps.sh): a FUSE mirror of src
    execFileSync('bindfs', [src, mnt]);
    try {
      const refused = await call(g, 'GET', `/fs/watch?path=${q(mnt)}`);
      expect(refused.status).toBe(400);
      expect(refused.json()).toMatchObject({
        error: { code: 'BAD_REQUEST', message: /network file system/ },
      });
      const allowed = openWatch(g, `path=${q(mnt)}&networkMounts=1`);
      await allowed.started;
      allowed.stop();
      // the same directory off the FUSE mount is watched without asking
      const local = openWatch(g, `path=${q(src)}`);
      await local.started;
      local.stop();
    } finally {
      // lazily: the daemon may still be closing the watch it held there
      execFileSync('fusermount', ['-uz', mnt]);
      rmSync(base, { recursive: true, force: true });
    }
  });
});
