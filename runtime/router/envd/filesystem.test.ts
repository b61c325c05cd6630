import { describe, expect, it } from 'vitest';
import type { FileStat } from '../../core/guest-protocol.ts';
import { entryOf } from './filesystem.ts';
import { FileType } from './gen/filesystem/filesystem_pb.js';

const base = { name: 'big.lnk', path: '/home/user/big.lnk', mtimeMs: 0 } as const;

describe('entryOf: EntryInfo as envd reports it', () => {
  it('a file and a directory: their own type, bits and Go permission text', () => {
    const f = entryOf({ ...base, name: 'a', path: '/a', type: 'file', size: 3, mode: 0o100644 } as FileStat);
    expect([f.type, f.size, f.mode, f.permissions, f.symlinkTarget]).toEqual([
      FileType.FILE,
      3n,
      0o644,
      '-rw-r--r--',
      undefined,
    ]);
    const d = entryOf({ ...base, name: 'd', path: '/d', type: 'dir', size: 4096, mode: 0o755 });
    expect([d.type, d.mode, d.permissions]).toEqual([FileType.DIRECTORY, 0o755, 'drwxr-xr-x']);
  });

  it('a symlink: the target’s type and mode, the link’s own size and L-text, the resolved target', () => {
    const link: FileStat = {
      ...base,
      type: 'symlink',
      size: 7, // 'big.bin'
      mode: 0o777,
      target: { path: '/home/user/big.bin', type: 'file', size: 1_000_000, mode: 0o600 },
    };
    expect(entryOf(link)).toMatchObject({
      name: 'big.lnk',
      path: '/home/user/big.lnk',
      type: FileType.FILE,
      size: 7n,
      mode: 0o600,
      permissions: 'Lrwxrwxrwx',
      symlinkTarget: '/home/user/big.bin',
    });
    const toDir = entryOf({
      ...link,
      target: { path: '/home/user/d', type: 'dir', size: 4096, mode: 0o755 },
    });
    expect([toDir.type, toDir.mode]).toEqual([FileType.DIRECTORY, 0o755]);
    // a guest from before target.mode: the link's bits stand in
    const old = entryOf({ ...link, target: { path: '/home/user/big.bin', type: 'file', size: 1 } });
    expect(old.mode).toBe(0o777);
  });

  it('a dangling symlink: no type, mode 0, its own path as target (envd cannot resolve it either)', () => {
    const e = entryOf({ ...base, type: 'symlink', size: 7, mode: 0o777, target: null });
    expect([e.type, e.mode, e.size, e.symlinkTarget]).toEqual([
      FileType.UNSPECIFIED,
      0,
      7n,
      '/home/user/big.lnk',
    ]);
  });
});
