/**
 * envd's `filesystem.Filesystem` service (as the E2B SDK calls it; docs/e2b.md) on the
 * agent's file routes. EntryInfo follows envd: absolute paths, permission bits only in `mode`,
 * Go `FileMode.String()` text in `permissions`, a symlink typed as its target.
 */
import { create, type MessageInitShape } from '@bufbuild/protobuf';
import { timestampFromMs } from '@bufbuild/protobuf/wkt';
import { Code, ConnectError, type ConnectRouter, type HandlerContext } from '@connectrpc/connect';
import type { FileStat, WatchEvent } from '../../core/guest-protocol.ts';
import {
  type EntryInfo,
  EntryInfoSchema,
  EventType,
  Filesystem,
  FileType,
  type WatchDirResponseSchema,
} from './gen/filesystem/filesystem_pb.js';
import { ENVD_USERS, envdPath } from './paths.ts';
import { connectErrorOfBody, sandboxPath, target, type Upstream, userOf } from './upstream.ts';

/** envd's EventType of a SPACE watch event (§2.5). */
const EVENT_TYPES = {
  create: EventType.CREATE,
  write: EventType.WRITE,
  remove: EventType.REMOVE,
  rename: EventType.RENAME,
  chmod: EventType.CHMOD,
} as const satisfies Record<Exclude<WatchEvent['type'], 'start'>, EventType>;

/** `-rw-r--r--` / `drwxr-xr-x` for a type and permission bits. Pure. */
export function modeText(type: string, mode: number): string {
  return (
    (type === 'dir' ? 'd' : '-') +
    [6, 3, 0].map((s) => ['r', 'w', 'x'].map((c, i) => (mode & ((4 >> i) << s) ? c : '-')).join('')).join('')
  );
}

/**
 * envd's EntryInfo of a SPACE FileStat. Pure. A symlink is reported as envd does (its entry is
 * the link's `lstat` with the target's type): `type` and `mode` of what it resolves to (a dangling
 * one: unspecified type, mode 0, and its own path as `symlinkTarget`), `size` of the link itself
 * (the length of what it points to), `permissions` the link's own Go text (`Lrwxrwxrwx`).
 */
export function entryOf(f: FileStat): EntryInfo {
  const link = f.type === 'symlink';
  const kind = link ? (f.target?.type ?? 'other') : f.type;
  const mode = link ? (f.target ? (f.target.mode ?? f.mode) : 0) : f.mode;
  return create(EntryInfoSchema, {
    name: f.name,
    type: kind === 'dir' ? FileType.DIRECTORY : kind === 'file' ? FileType.FILE : FileType.UNSPECIFIED,
    path: f.path,
    size: BigInt(f.size),
    mode: mode & 0o777,
    permissions: link ? `L${modeText('file', f.mode).slice(1)}` : modeText(kind, f.mode),
    owner: 'user',
    group: 'user',
    modifiedTime: timestampFromMs(f.mtimeMs),
    ...(link ? { symlinkTarget: f.target?.path ?? f.path } : {}),
    // envd ≥ 0.6.2: the file's metadata (its `user.e2b.*` xattrs there, kept by the guest here)
    ...(f.metadata ? { metadata: f.metadata } : {}),
  });
}

/**
 * Most entries one ListDir answers (a deep listing of a big tree would otherwise cost the router
 * one agent call per directory and memory without bound); more is ResourceExhausted.
 */
export const MAX_LIST_ENTRIES = 10_000;

/** The Filesystem service's handlers over `up`. */
export function filesystemService(up: Upstream) {
  /** The absolute path of a request path for the call's user (relative = under their home). */
  const abs = (path: string, ctx: HandlerContext) => envdPath(path, ENVD_USERS[userOf(ctx)]);
  const q = (path: string, ctx: HandlerContext) => `?path=${encodeURIComponent(abs(path, ctx))}`;
  return (router: ConnectRouter) =>
    router.service(Filesystem, {
      async stat(req, ctx) {
        const t = target(ctx);
        return {
          entry: entryOf(await up.json<FileStat>(t, 'GET', `${sandboxPath(t)}/fs/stat${q(req.path, ctx)}`)),
        };
      },
      async listDir(req, ctx) {
        const t = target(ctx);
        // envd: depth 0 means 1; deeper levels walk real directories (never a symlink's), each
        // entry followed by what is under it, as Go's WalkDir does
        const depth = req.depth || 1;
        const entries: EntryInfo[] = [];
        const walk = async (path: string, level: number): Promise<void> => {
          const out = await up.json<{ entries: FileStat[] }>(
            t,
            'GET',
            `${sandboxPath(t)}/fs/list?path=${encodeURIComponent(path)}`,
          );
          for (const f of out.entries) {
            if (f.type === 'other') continue;
            if (entries.length >= MAX_LIST_ENTRIES) {
              throw new ConnectError(
                `more than ${MAX_LIST_ENTRIES} entries under ${abs(req.path, ctx)} at depth ${depth}: list with a smaller depth`,
                Code.ResourceExhausted,
              );
            }
            entries.push(entryOf(f));
            if (f.type === 'dir' && level < depth) await walk(f.path, level + 1);
          }
        };
        await walk(abs(req.path, ctx), 1);
        return { entries };
      },
      async makeDir(req, ctx) {
        const t = target(ctx);
        // envd: an existing directory is AlreadyExists (the SDK answers false), anything else
        // there is InvalidArgument (§2.4)
        const existing = await up
          .json<FileStat>(t, 'GET', `${sandboxPath(t)}/fs/stat${q(req.path, ctx)}`)
          .catch((err: unknown) => {
            if (err instanceof ConnectError && err.code === Code.NotFound) return null;
            throw err;
          });
        if (existing) {
          const dir = existing.type === 'dir' || existing.target?.type === 'dir';
          throw new ConnectError(
            `${existing.path} already exists${dir ? '' : ' and is not a directory'}`,
            dir ? Code.AlreadyExists : Code.InvalidArgument,
          );
        }
        const f = await up.json<FileStat>(t, 'POST', `${sandboxPath(t)}/fs/mkdir`, {
          path: abs(req.path, ctx),
          parents: true,
        });
        return { entry: entryOf(f) };
      },
      async move(req, ctx) {
        const t = target(ctx);
        const f = await up.json<FileStat>(t, 'POST', `${sandboxPath(t)}/fs/rename`, {
          from: abs(req.source, ctx),
          to: abs(req.destination, ctx),
        });
        return { entry: entryOf(f) };
      },
      async *watchDir(req, ctx): AsyncGenerator<MessageInitShape<typeof WatchDirResponseSchema>> {
        const t = target(ctx);
        // envd ≥ 0.6.3 `includeEntry`: events carry the entry; ≥ 0.6.4 `allowNetworkMounts`
        const flags =
          `&recursive=${req.recursive}&entries=${req.includeEntry}` +
          `&networkMounts=${req.allowNetworkMounts}`;
        const res = await up.request(
          t,
          'GET',
          `${sandboxPath(t)}/fs/watch${q(req.path, ctx)}${flags}`,
          undefined,
          ctx.signal,
        );
        if (res.statusCode !== 200) throw connectErrorOfBody(res.statusCode, await res.body.text());
        const decoder = new TextDecoder();
        let buf = '';
        try {
          for await (const chunk of res.body) {
            buf += decoder.decode(chunk as Buffer, { stream: true });
            for (let i = buf.indexOf('\n'); i >= 0; i = buf.indexOf('\n')) {
              const line = buf.slice(0, i);
              buf = buf.slice(i + 1);
              if (!line) continue;
              const e = JSON.parse(line) as WatchEvent;
              if (e.type === 'start') {
                yield { event: { case: 'start', value: {} } };
              } else {
                yield {
                  event: {
                    case: 'filesystem',
                    value: {
                      name: e.name ?? '',
                      type: EVENT_TYPES[e.type],
                      ...(e.entry ? { entry: entryOf(e.entry) } : {}),
                    },
                  },
                };
              }
            }
          }
        } finally {
          res.body.destroy();
        }
        throw new ConnectError(
          'the watch ended: the sandbox stopped or its directory went away',
          Code.Unavailable,
        );
      },
      async remove(req, ctx) {
        const t = target(ctx);
        const res = await up.request(t, 'DELETE', `${sandboxPath(t)}/fs${q(req.path, ctx)}&recursive=true`);
        const text = await res.body.text();
        // envd: removing what is not there is not an error (§2.4)
        if (res.statusCode >= 400 && res.statusCode !== 404) throw connectErrorOfBody(res.statusCode, text);
        return {};
      },
    });
}
