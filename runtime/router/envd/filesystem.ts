/**
 * envd's `filesystem.Filesystem` service (shared/reference/e2b-protocol.md §2.4, §2.5) on the
 * agent's file routes. EntryInfo follows envd: absolute paths, permission bits only in `mode`,
 * Go `FileMode.String()` text in `permissions`, a symlink typed as its target.
 */
import { create } from '@bufbuild/protobuf';
import { timestampFromMs } from '@bufbuild/protobuf/wkt';
import type { ConnectRouter } from '@connectrpc/connect';
import type { FileStat } from '../../core/guest-protocol.ts';
import { type EntryInfo, EntryInfoSchema, Filesystem, FileType } from './gen/filesystem/filesystem_pb.js';
import { envdPath } from './paths.ts';
import { connectErrorOfBody, sandboxPath, target, type Upstream } from './upstream.ts';

/** `-rw-r--r--` / `drwxr-xr-x` for a type and permission bits. Pure. */
export function modeText(type: string, mode: number): string {
  return (
    (type === 'dir' ? 'd' : '-') +
    [6, 3, 0].map((s) => ['r', 'w', 'x'].map((c, i) => (mode & ((4 >> i) << s) ? c : '-')).join('')).join('')
  );
}

/** envd's EntryInfo of a SPACE FileStat. Pure. */
export function entryOf(f: FileStat): EntryInfo {
  const kind = f.type === 'symlink' ? (f.target?.type ?? 'other') : f.type;
  return create(EntryInfoSchema, {
    name: f.name,
    type: kind === 'dir' ? FileType.DIRECTORY : kind === 'file' ? FileType.FILE : FileType.UNSPECIFIED,
    path: f.path,
    size: BigInt(f.size),
    mode: f.mode & 0o777,
    permissions: modeText(kind, f.mode),
    owner: 'user',
    group: 'user',
    modifiedTime: timestampFromMs(f.mtimeMs),
    ...(f.type === 'symlink' && f.target ? { symlinkTarget: f.target.path } : {}),
  });
}

/** The Filesystem service's handlers over `up`. */
export function filesystemService(up: Upstream) {
  const q = (path: string) => `?path=${encodeURIComponent(envdPath(path))}`;
  return (router: ConnectRouter) =>
    router.service(Filesystem, {
      async stat(req, ctx) {
        const t = target(ctx);
        return {
          entry: entryOf(await up.json<FileStat>(t, 'GET', `${sandboxPath(t)}/fs/stat${q(req.path)}`)),
        };
      },
      async listDir(req, ctx) {
        const t = target(ctx);
        const out = await up.json<{ entries: FileStat[] }>(
          t,
          'GET',
          `${sandboxPath(t)}/fs/list${q(req.path)}`,
        );
        return { entries: out.entries.filter((f) => f.type !== 'other').map(entryOf) };
      },
      async makeDir(req, ctx) {
        const t = target(ctx);
        const f = await up.json<FileStat>(t, 'POST', `${sandboxPath(t)}/fs/mkdir`, {
          path: envdPath(req.path),
          parents: true,
        });
        return { entry: entryOf(f) };
      },
      async remove(req, ctx) {
        const t = target(ctx);
        const res = await up.request(t, 'DELETE', `${sandboxPath(t)}/fs${q(req.path)}&recursive=true`);
        const text = await res.body.text();
        // envd: removing what is not there is not an error (§2.4)
        if (res.statusCode >= 400 && res.statusCode !== 404) throw connectErrorOfBody(res.statusCode, text);
        return {};
      },
    });
}
