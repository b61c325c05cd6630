/**
 * File metadata: the store on its own (identity = device + inode + mtime, the bound), then through
 * a real guest daemon (upload header, stat, list, rename, rewrite, watch entries).
 */
import { execFileSync } from 'node:child_process';
import type { Stats } from 'node:fs';
import {
  appendFileSync,
  linkSync,
  mkdirSync,
  mkdtempSync,
  rmSync,
  statSync,
  unlinkSync,
  writeFileSync,
} from 'node:fs';
import { request as httpRequest } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { FILE_METADATA_HEADER, type FileStat, type WatchEvent } from '../core/guest-protocol.ts';
import { FileMetadataStore } from './file-metadata.ts';
import { AUTH, call, type Guest, q, startGuest } from './test-harness.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
/** A Stats with only what the store reads (device, inode, mtime). */
const fake = (ino: number, mtimeMs: number) => ({ dev: 1, ino, mtimeMs }) as Stats;

describe('file metadata store', () => {
  it('an inode reused by a new file (another mtime) does not show the old file’s metadata', () => {
    const s = new FileMetadataStore();
    s.set('/a', fake(7, 1000.5), { k: 'v' });
    expect(s.of(fake(7, 1000.5))).toEqual({ k: 'v' });
    expect(s.of(fake(8, 1000.5))).toBeUndefined();
    expect(s.of(fake(7, 2000.25))).toBeUndefined();
    // and the stale entry is gone for good, its bytes given back
    expect(s.of(fake(7, 1000.5))).toBeUndefined();
    expect(s.bytes).toBe(0);
  });

  it('an empty set removes the metadata; forget and moved keep the byte count right', () => {
    const s = new FileMetadataStore();
    s.set('/a', fake(1, 1), { k: 'v' });
    const one = s.bytes;
    expect(one).toBeGreaterThan(2);
    s.set('/a', fake(1, 1), {});
    expect([s.of(fake(1, 1)), s.bytes]).toEqual([undefined, 0]);
    s.set('/a', fake(1, 1), { k: 'v' });
    s.moved('/longer/name', fake(1, 1));
    expect(s.bytes).toBe(one + '/longer/name'.length - '/a'.length);
    expect(s.of(fake(1, 1))).toEqual({ k: 'v' });
    s.forget(fake(1, 1));
    expect(s.bytes).toBe(0);
  });

  it('when full, drops entries whose file left its path, then refuses with BAD_REQUEST', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'space-meta-'));
    try {
      const big = { k: 'v'.repeat(900) };
      const s = new FileMetadataStore(2500); // room for two entries of ~1 KiB
      const paths = ['a', 'b', 'c'].map((n) => join(dir, n));
      for (const p of paths) writeFileSync(p, p);
      for (const p of paths.slice(0, 2)) {
        await s.reserve(p, big);
        s.set(p, statSync(p), big);
      }
      await expect(s.reserve(paths[2]!, big)).rejects.toMatchObject({ code: 'BAD_REQUEST' });
      // both files are still where they were: nothing was dropped
      expect(s.of(statSync(paths[0]!))).toEqual(big);
      unlinkSync(paths[0]!);
      await s.reserve(paths[2]!, big);
      s.set(paths[2]!, statSync(paths[2]!), big);
      expect(s.of(statSync(paths[1]!))).toEqual(big);
      expect(s.of(statSync(paths[2]!))).toEqual(big);
      expect(s.bytes).toBeLessThanOrEqual(2500);
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
    // through the file API and behind its back (mv = rename(2)): the inode keeps it
    const moved = await call(g, 'POST', '/fs/rename', { from: 'm/one.txt', to: 'm/sub/two.txt' });
    expect((moved.json() as FileStat).metadata).toEqual({ author: 'ann', 'a b': 'x y' });
    const { renameSync } = await import('node:fs');
    renameSync(join(g.home, 'm/sub/two.txt'), join(g.home, 'm/three.txt'));
    expect((await statOf('m/three.txt')).metadata).toEqual({ author: 'ann', 'a b': 'x y' });
  });

  it('an upload without the header leaves none; a write from inside the sandbox drops it', async () => {
    await call(g, 'PUT', `/files?path=${q('m/re.txt')}`, 'v1', meta({ v: '1' }));
    const again = await call(g, 'PUT', `/files?path=${q('m/re.txt')}`, 'v2');
    expect(again.json()).not.toHaveProperty('metadata');
    expect(await statOf('m/re.txt')).not.toHaveProperty('metadata');
    await call(g, 'PUT', `/files?path=${q('m/app.txt')}`, 'v1', meta({ v: '1' }));
    await sleep(5); // a later mtime, on file systems with coarse timestamps too
    appendFileSync(join(g.home, 'm/app.txt'), 'more');
    expect(await statOf('m/app.txt')).not.toHaveProperty('metadata');
  });

  it('removing one hard link keeps the metadata of the other', async () => {
    await call(g, 'PUT', `/files?path=${q('m/h1')}`, 'h', meta({ h: '1' }));
    linkSync(join(g.home, 'm/h1'), join(g.home, 'm/h2'));
    expect((await call(g, 'DELETE', `/fs?path=${q('m/h1')}`)).status).toBe(204);
    expect((await statOf('m/h2')).metadata).toEqual({ h: '1' });
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

/** Opens a watch and collects its events until `stop()`. */
function watch(query: string): { events: WatchEvent[]; stop: () => void; started: Promise<void> } {
  const events: WatchEvent[] = [];
  let buf = '';
  let started!: () => void;
  const ready = new Promise<void>((r) => {
    started = r;
  });
  const req = httpRequest(`${g.base}/fs/watch?${query}`, { agent: false, headers: AUTH }, (res) => {
    res.on('data', (c: Buffer) => {
      buf += c.toString();
      for (let i = buf.indexOf('\n'); i >= 0; i = buf.indexOf('\n')) {
        const e = JSON.parse(buf.slice(0, i)) as WatchEvent;
        buf = buf.slice(i + 1);
        if (e.type === 'start') started();
        else events.push(e);
      }
    });
    res.on('error', () => {});
  });
  req.on('error', () => {});
  req.end();
  return { events, stop: () => req.destroy(), started: ready };
}

describe('guest watch entries (entries=1)', () => {
  it('events carry the entry (with its metadata) only when asked; a remove carries none', async () => {
    await call(g, 'POST', '/fs/mkdir', { path: 'w', parents: true });
    const dir = join(g.home, 'w');
    const withEntries = watch(`path=${q(dir)}&entries=1&networkMounts=1`);
    const plain = watch(`path=${q(dir)}`);
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
      const allowed = watch(`path=${q(mnt)}&networkMounts=1`);
      await allowed.started;
      allowed.stop();
      // the same directory off the FUSE mount is watched without asking
      const local = watch(`path=${q(src)}`);
      await local.started;
      local.stop();
    } finally {
      execFileSync('fusermount', ['-u', mnt]);
      rmSync(base, { recursive: true, force: true });
    }
  });
});
