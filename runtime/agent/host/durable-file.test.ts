import { mkdtemp, readdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { SpaceError } from '../../core/errors.ts';
import {
  causedByDiskFull,
  diskFullError,
  isDiskFull,
  readJsonFile,
  writeFileAtomic,
} from './durable-file.ts';

describe('durable state files', () => {
  let dir: string;
  beforeEach(async () => {
    dir = await mkdtemp(join(tmpdir(), 'space-durable-'));
  });
  afterEach(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it('replaces a file whole, mode 0600, leaving no temporary file beside it', async () => {
    const p = join(dir, 'sandbox.json');
    await writeFileAtomic(p, JSON.stringify({ a: 1 }));
    await writeFileAtomic(p, JSON.stringify({ a: 2 }));
    await writeFileAtomic(p, JSON.stringify({ a: 3 }));
    expect(JSON.parse(await readFile(p, 'utf8'))).toEqual({ a: 3 });
    expect((await stat(p)).mode & 0o777).toBe(0o600);
    expect(await readdir(dir)).toEqual(['sandbox.json']);
    // without the fsyncs: replaced whole all the same
    await writeFileAtomic(p, JSON.stringify({ a: 4 }), { sync: false });
    expect(JSON.parse(await readFile(p, 'utf8'))).toEqual({ a: 4 });
    expect((await stat(p)).mode & 0o777).toBe(0o600);
    expect(await readdir(dir)).toEqual(['sandbox.json']);
  });

  it('a write that cannot complete leaves the old content and no temporary file', async () => {
    const p = join(dir, 'sandbox.json');
    await writeFileAtomic(p, '{"old":true}');
    await expect(writeFileAtomic(join(dir, 'missing', 'x.json'), '{}')).rejects.toThrow();
    // a non-empty folder at the target: the rename fails after the temporary file was written
    await expect(writeFileAtomic(dir, '{}')).rejects.toThrow();
    expect(await readFile(p, 'utf8')).toBe('{"old":true}');
    // a write that fails after the file was opened (here: data the write refuses): the target was
    // never opened for writing, so its content stays, in the same file (a rename replaces the inode)
    const ino = (await stat(p)).ino;
    await expect(writeFileAtomic(p, 42 as unknown as string)).rejects.toThrow();
    expect(await readFile(p, 'utf8')).toBe('{"old":true}');
    expect((await stat(p)).ino).toBe(ino);
    await writeFileAtomic(p, '{"new":true}');
    expect((await stat(p)).ino).not.toBe(ino);
    expect((await readdir(dir)).filter((n) => n.includes('.tmp-'))).toEqual([]);
    const base = dir.split('/').pop()!;
    expect((await readdir(tmpdir())).filter((n) => n.startsWith(`.${base}.tmp-`))).toEqual([]);
  });

  it.each([
    ['empty', ''],
    ['torn', '{"req":{"sandboxId":"sbx_1","templ'],
    ['not an object', '42'],
  ])('reading a %s file quarantines it and says why', async (_kind, text) => {
    const p = join(dir, 'sandbox.json');
    await writeFile(p, text);
    const r = await readJsonFile(p);
    expect(r.ok).toBe(false);
    if (r.ok || r.missing) throw new Error('expected a quarantined file');
    expect(r.reason).not.toBe('');
    expect(r.quarantined).toMatch(/sandbox\.json\.bad-\d+$/);
    expect(await readFile(r.quarantined!, 'utf8')).toBe(text);
    // the next read finds nothing to trip on
    expect(await readJsonFile(p)).toEqual({ ok: false, missing: true });
  });

  it('reads a whole file', async () => {
    const p = join(dir, 'x.json');
    await writeFileAtomic(p, '{"a":[1]}');
    expect(await readJsonFile(p)).toEqual({ ok: true, value: { a: [1] } });
  });

  it('ENOSPC and EDQUOT become NODE_DISK_FULL (507, retryable); other errors pass through', () => {
    for (const code of ['ENOSPC', 'EDQUOT']) {
      const err = Object.assign(new Error(code), { code });
      expect(isDiskFull(err)).toBe(true);
      const mapped = diskFullError(err, 'a test');
      expect(mapped).toBeInstanceOf(SpaceError);
      expect((mapped as SpaceError).code).toBe('NODE_DISK_FULL');
    }
    const other = Object.assign(new Error('EACCES'), { code: 'EACCES' });
    expect(diskFullError(other, 'a test')).toBe(other);
    // a driver's error around the disk's
    const wrapped = new SpaceError('DRIVER_FAILED', 'create failed', undefined, {
      cause: Object.assign(new Error('ENOSPC'), { code: 'ENOSPC' }),
    });
    expect(causedByDiskFull(wrapped)).toBe(true);
    expect(causedByDiskFull(new SpaceError('DRIVER_FAILED', 'x', undefined, { cause: other }))).toBe(false);
  });
});
