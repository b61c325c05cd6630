/**
 * File metadata: the store on its own (identity = real path + mtime + size, the bounds), then
 * through a real guest daemon (upload header, stat, list, rename, rewrite, watch entries).
 */
import { execFileSync } from 'node:child_process';
import type { Stats } from 'node:fs';
import {
  appendFileSync,
  chmodSync,
  mkdtempSync,
  renameSync,
  rmSync,
  statSync,
  symlinkSync,
  unlinkSync,
  utimesSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { FILE_METADATA_HEADER, type FileStat } from '../core/guest-protocol.ts';
import { FileMetadataStore } from './file-metadata.ts';
import { call, type Guest, openWatch, q, startGuest } from './test-harness.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
/** A Stats with only what the store reads (mtime, size). */
const fake = (mtimeMs: number, size = 1) => ({ mtimeMs, size }) as Stats;

describe('file metadata store', () => {
  it('a file replaced at its path (another mtime) does not show the old file’s metadata', () => {
    const s = new FileMetadataStore();
    s.set('/a', fake(1000.5), { k: 'v' });
    expect(s.of('/a', fake(1000.5))).toEqual({ k: 'v' });
    expect(s.of('/b', fake(1000.5))).toBeUndefined();
    expect(s.of('/a', fake(2000.25))).toBeUndefined();
    expect(s.of('/a', fake(1000.5, 2))).toBeUndefined(); // same mtime, other size
    // a lookup never changes the store: the entry waits for a sweep (an upload may be mid-rename)
    expect(s.of('/a', fake(1000.5))).toEqual({ k: 'v' });
  });

  it('set replaces (empty = none) and can be undone; moved carries trees; removed drops them', () => {
    const s = new FileMetadataStore();
    s.set('/a', fake(1), { k: 'v' });
    const one = s.bytes;
    const undo = s.set('/a', fake(2), {});
    expect([s.of('/a', fake(1)), s.of('/a', fake(2)), s.bytes, s.files]).toEqual([
      undefined,
      undefined,
      0,
      0,
    ]);
    undo();
    expect([s.of('/a', fake(1)), s.bytes]).toEqual([{ k: 'v' }, one]);
    // an undo after another upload set the path since changes nothing
    const late = s.set('/a', fake(7), { first: '1' });
    s.set('/a', fake(8), { second: '2' });
    late();
    expect(s.of('/a', fake(8))).toEqual({ second: '2' });
    s.set('/a', fake(1), { k: 'v' });
    s.set('/d/x', fake(3), { x: '1' });
    s.set('/d/sub/y', fake(4), { y: '2' });
    s.set('/dd', fake(5), { z: '3' }); // a sibling whose name starts like the directory's
    s.set('/e', fake(6), { e: 'replaced by the move' });
    s.moved('/d', '/e');
    expect([s.of('/e/x', fake(3)), s.of('/e/sub/y', fake(4)), s.of('/d/x', fake(3))]).toEqual([
      { x: '1' },
      { y: '2' },
      undefined,
    ]);
    expect(s.of('/e', fake(6))).toBeUndefined();
    expect(s.of('/dd', fake(5))).toEqual({ z: '3' });
    s.removed('/e');
    expect([s.files, s.of('/dd', fake(5))]).toEqual([2, { z: '3' }]);
    s.removed('/a');
    s.removed('/dd');
    expect([s.files, s.bytes]).toEqual([0, 0]);
  });

  it('when full, a sweep drops entries whose path lost its file, then uploads are refused', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'space-meta-'));
    try {
      const big = { k: 'v'.repeat(900) };
      const paths = ['a', 'b', 'c'].map((n) => join(dir, n));
      // room for two entries (their size depends on the temp dir's path length)
      const probe = new FileMetadataStore();
      probe.set(paths[0]!, fake(1), big);
      const s = new FileMetadataStore({ bytes: Math.floor(probe.bytes * 2.5) });
      for (const p of paths) writeFileSync(p, p);
      for (const p of paths.slice(0, 2)) {
        await s.makeRoom(p, big);
        s.set(p, statSync(p), big);
      }
      await expect(s.makeRoom(paths[2]!, big)).rejects.toMatchObject({ code: 'BAD_REQUEST' });
      // both files are still where they were: nothing was dropped
      expect(s.of(paths[0]!, statSync(paths[0]!))).toEqual(big);
      // an upload without metadata needs no room
      await s.makeRoom(paths[2]!, {});
      unlinkSync(paths[0]!);
      await s.makeRoom(paths[2]!, big);
      s.set(paths[2]!, statSync(paths[2]!), big);
      expect(s.of(paths[1]!, statSync(paths[1]!))).toEqual(big);
      expect(s.of(paths[2]!, statSync(paths[2]!))).toEqual(big);
      expect(s.files).toBe(2);
      expect(s.bytes).toBeLessThanOrEqual(probe.bytes * 2.5);
      // replacing what a path holds needs no more room than it frees
      await s.makeRoom(paths[1]!, big);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('concurrent uploads into a full store share one sweep and keep the count exact', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'space-meta-'));
    try {
      const s = new FileMetadataStore({ files: 3 });
      const paths = ['a', 'b', 'c'].map((n) => join(dir, n));
      for (const p of paths) {
        writeFileSync(p, p);
        s.set(p, statSync(p), { k: p });
      }
      for (const p of paths) unlinkSync(p);
      // three uploads at once, each finding the store full of stale entries
      await Promise.all(['x', 'y', 'z'].map((n) => s.makeRoom(join(dir, n), { k: n })));
      expect([s.files, s.bytes]).toEqual([0, 0]);
      // the file count is a bound of its own
      const live = ['p', 'q', 'r'].map((n) => join(dir, n));
      for (const p of live) {
        writeFileSync(p, p);
        s.set(p, statSync(p), { k: 'v' });
      }
      await expect(s.makeRoom(join(dir, 'more'), { k: 'v' })).rejects.toThrow(/at most 3 files/);
      await s.makeRoom(live[0]!, { k: 'replaced' });
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

let g: Guest;
beforeAll(async () => {
  g = await startGuest();
});
afterAll(async () => {
  await g?.stop();
});

const meta = (m: Record<string, string>) => ({ [FILE_METADATA_HEADER]: JSON.stringify(m) });
const statOf = async (path: string) => (await call(g, 'GET', `/fs/stat?path=${q(path)}`)).json() as FileStat;

describe('guest file metadata (PUT /files header)', () => {
  it('an upload’s metadata shows in its answer, stat and list, and follows renames', async () => {
    const w = await call(
      g,
      'PUT',
      `/files?path=${q('m/one.txt')}`,
      'one',
      meta({ author: 'ann', 'a b': 'x y' }),
    );
    expect(w.status).toBe(200);
    expect((w.json() as FileStat).metadata).toEqual({ author: 'ann', 'a b': 'x y' });
    expect((await statOf('m/one.txt')).metadata).toEqual({ author: 'ann', 'a b': 'x y' });
    const list = (await call(g, 'GET', '/fs/list?path=m')).json() as { entries: FileStat[] };
    expect(list.entries.map((e) => [e.name, e.metadata])).toEqual([
      ['one.txt', { author: 'ann', 'a b': 'x y' }],
    ]);
    // a rename through the file API carries it, the file's own and a directory's
    const moved = await call(g, 'POST', '/fs/rename', { from: 'm/one.txt', to: 'm/sub/two.txt' });
    expect((moved.json() as FileStat).metadata).toEqual({ author: 'ann', 'a b': 'x y' });
    await call(g, 'POST', '/fs/rename', { from: 'm/sub', to: 'm/moved' });
    expect((await statOf('m/moved/two.txt')).metadata).toEqual({ author: 'ann', 'a b': 'x y' });
    // a move behind the file API's back (a command's mv) does not
    renameSync(join(g.home, 'm/moved/two.txt'), join(g.home, 'm/three.txt'));
    expect(await statOf('m/three.txt')).not.toHaveProperty('metadata');
    // nor does a new file at the old path show it
    writeFileSync(join(g.home, 'm/moved/two.txt'), 'another file');
    utimesSync(join(g.home, 'm/moved/two.txt'), new Date(), new Date(Date.now() + 60_000));
    expect(await statOf('m/moved/two.txt')).not.toHaveProperty('metadata');
  });

  it('an upload without the header leaves none; a write from inside the sandbox drops it', async () => {
    await call(g, 'PUT', `/files?path=${q('m/re.txt')}`, 'v1', meta({ v: '1' }));
    const again = await call(g, 'PUT', `/files?path=${q('m/re.txt')}`, 'v2');
    expect(again.json()).not.toHaveProperty('metadata');
    expect(await statOf('m/re.txt')).not.toHaveProperty('metadata');
    await call(g, 'PUT', `/files?path=${q('m/app.txt')}`, 'v1', meta({ v: '1' }));
    // chmod keeps it; a write (its mtime set apart explicitly: timestamps may be coarse) drops it
    chmodSync(join(g.home, 'm/app.txt'), 0o600);
    expect((await statOf('m/app.txt')).metadata).toEqual({ v: '1' });
    appendFileSync(join(g.home, 'm/app.txt'), 'more');
    utimesSync(join(g.home, 'm/app.txt'), new Date(), new Date(Date.now() + 60_000));
    expect(await statOf('m/app.txt')).not.toHaveProperty('metadata');
  });

  it('a symlink shows what it resolves to’s metadata; a delete forgets it', async () => {
    await call(g, 'PUT', `/files?path=${q('m/target')}`, 't', meta({ t: '1' }));
    symlinkSync(join(g.home, 'm/target'), join(g.home, 'm/link'));
    expect(await statOf('m/link')).toMatchObject({ type: 'symlink', metadata: { t: '1' } });
    const list = (await call(g, 'GET', '/fs/list?path=m')).json() as { entries: FileStat[] };
    expect(list.entries.find((e) => e.name === 'link')?.metadata).toEqual({ t: '1' });
    // a copy with the same mtime to the nanosecond (`cp -p`), moved to the path once the
    // original is deleted, shows nothing: the delete forgot the metadata, not just the mtime
    execFileSync('cp', ['-p', join(g.home, 'm/target'), join(g.home, 'm/copy')]);
    expect((await call(g, 'DELETE', `/fs?path=${q('m/target')}`)).status).toBe(204);
    renameSync(join(g.home, 'm/copy'), join(g.home, 'm/target'));
    expect(await statOf('m/link')).not.toHaveProperty('metadata');
  });

  it('refuses bad metadata with 400 BAD_REQUEST and leaves the previous file as it was', async () => {
    await call(g, 'PUT', `/files?path=${q('m/keep.txt')}`, 'kept', meta({ ok: 'yes' }));
    const bad = [
      'not json',
      '["a"]',
      JSON.stringify({ k: 1 }),
      JSON.stringify({ '': 'v' }),
      JSON.stringify({ ['k'.repeat(247)]: 'v' }),
      JSON.stringify({ k: 'v'.repeat(4096) }),
      JSON.stringify({ k: 'tab\there' }),
    ];
    for (const h of bad) {
      const r = await call(g, 'PUT', `/files?path=${q('m/keep.txt')}`, 'replaced', {
        [FILE_METADATA_HEADER]: h,
      });
      expect(r.status, h.slice(0, 30)).toBe(400);
      expect((r.json() as { error: { code: string } }).error.code).toBe('BAD_REQUEST');
    }
    expect((await call(g, 'GET', `/files?path=${q('m/keep.txt')}`)).body.toString()).toBe('kept');
    expect((await statOf('m/keep.txt')).metadata).toEqual({ ok: 'yes' });
    // the largest set envd allows: one key of 246 bytes, Σ (9 + key + value) = 4096
    const max = { ['k'.repeat(246)]: 'v'.repeat(4096 - 9 - 246) };
    expect((await call(g, 'PUT', `/files?path=${q('m/max.txt')}`, 'x', meta(max))).status).toBe(200);
  });
});

describe('guest watch entries (entries=1)', () => {
  it('events carry the entry (with its metadata) only when asked; a remove carries none', async () => {
    await call(g, 'POST', '/fs/mkdir', { path: 'w', parents: true });
    const dir = join(g.home, 'w');
    const withEntries = openWatch(g, `path=${q(dir)}&entries=1&networkMounts=1`);
    const plain = openWatch(g, `path=${q(dir)}`);
    await Promise.all([withEntries.started, plain.started]);
    await call(g, 'PUT', `/files?path=${q('w/e.txt')}`, 'abc', meta({ x: 'y' }));
    await call(g, 'DELETE', `/fs?path=${q('w/e.txt')}`);
    const until = Date.now() + 10_000;
    const has = (w: typeof plain, t: string) => w.events.some((e) => e.type === t);
    while (Date.now() < until && !(has(withEntries, 'remove') && has(plain, 'remove'))) await sleep(50);
    withEntries.stop();
    plain.stop();
    const created = withEntries.events.find((e) => e.type === 'create' || e.type === 'write');
    expect(created?.entry).toMatchObject({
      name: 'e.txt',
      path: join(dir, 'e.txt'),
      size: 3,
      metadata: { x: 'y' },
    });
    expect(withEntries.events.find((e) => e.type === 'remove')).toEqual({ type: 'remove', name: 'e.txt' });
    expect(plain.events.length).toBeGreaterThan(0);
    expect(plain.events.filter((e) => e.entry)).toEqual([]);
  });
});
