/**
 * What a process start request may be, before anything is spawned: {@link parseStart} validates the
 * body of `POST /processes` (guest-protocol.ts `ProcessStartRequest`) into a {@link StartSpec} or
 * throws BAD_REQUEST; {@link canEnter} judges a working directory as the user's rights would; and
 * {@link spawnFailure} words a start that failed as a shell would (127 not found, 126 not
 * executable), for the record a process that could not start still gets.
 */
import { stat } from 'node:fs/promises';
import { posix } from 'node:path';
import { SpaceError } from '../core/errors.ts';
import type { ProcessStartRequest } from '../core/guest-protocol.ts';
import { isObject, parseEnv } from './http.ts';
import { PTY_PYTHON, parsePtySize } from './pty.ts';
import type { Identity } from './users.ts';

/** Largest timeoutMs honoured exactly (setTimeout's limit, ~24.8 days); larger values are clamped. */
const MAX_TIMER_MS = 2_147_483_647;

/** Validated form of a start request. */
export interface StartSpec {
  cmd: string;
  args: string[];
  shell: boolean;
  env: Record<string, string>;
  cwd: string;
  user: 'user' | 'root';
  stdin: boolean;
  timeoutMs: number;
  tag: string | undefined;
  pty: { cols: number; rows: number } | undefined;
}

/** A BAD_REQUEST error with `message`. */
export function bad(message: string): SpaceError {
  return new SpaceError('BAD_REQUEST', message);
}

/**
 * The validated start request `body`: `cwd` resolved against `home`, `args` dropped for a shell
 * command, `timeoutMs` floored and clamped to {@link MAX_TIMER_MS} (0 = none).
 * @throws SpaceError BAD_REQUEST naming the first field that is wrong.
 */
export function parseStart(body: unknown, home: string): StartSpec {
  if (!isObject(body)) throw bad('body must be a json object');
  const { cmd, args, shell, env, cwd, user, stdin, timeoutMs, tag, pty } = body as {
    [K in keyof ProcessStartRequest]?: unknown;
  };
  if (typeof cmd !== 'string' || cmd === '') throw bad('cmd must be a non-empty string');
  if (cmd.includes('\0')) throw bad('cmd must not contain nul bytes');
  if (args !== undefined && (!Array.isArray(args) || !args.every((a) => typeof a === 'string'))) {
    throw bad('args must be an array of strings');
  }
  const argv = (args ?? []) as string[];
  if (argv.some((a) => a.includes('\0'))) throw bad('args must not contain nul bytes');
  if (shell !== undefined && typeof shell !== 'boolean') throw bad('shell must be a boolean');
  if (cwd !== undefined && (typeof cwd !== 'string' || cwd === '' || cwd.includes('\0'))) {
    throw bad('cwd must be a non-empty string without nul bytes');
  }
  if (user !== undefined && user !== 'user' && user !== 'root') throw bad('user must be "user" or "root"');
  if (stdin !== undefined && typeof stdin !== 'boolean') throw bad('stdin must be a boolean');
  if (
    timeoutMs !== undefined &&
    (typeof timeoutMs !== 'number' || !Number.isFinite(timeoutMs) || timeoutMs < 0)
  ) {
    throw bad('timeoutMs must be a non-negative number');
  }
  if (tag !== undefined && typeof tag !== 'string') throw bad('tag must be a string');
  return {
    cmd,
    args: shell ? [] : argv,
    shell: shell === true,
    env: parseEnv(env, 'env'),
    cwd: posix.resolve(home, (cwd as string | undefined) ?? '.'),
    user: user ?? 'user',
    stdin: stdin === true,
    timeoutMs: Math.min(Math.floor((timeoutMs as number | undefined) ?? 0), MAX_TIMER_MS),
    tag,
    pty: pty === undefined ? undefined : parsePtySize(pty),
  };
}

/** Exit code and message for a spawn failure, as a shell would report it. */
export function spawnFailure(
  cmd: string,
  code: string | undefined,
  what: 'cmd' | 'cwd',
  spec?: Pick<StartSpec, 'pty'>,
): [number, string] {
  const exitCode = code === 'ENOENT' ? 127 : 126;
  if (spec?.pty && what === 'cmd' && code === 'ENOENT') {
    return [exitCode, `a terminal (pty) needs ${PTY_PYTHON} in the sandbox's template, and it has none`];
  }
  if (what === 'cwd') {
    const why =
      code === 'ENOENT'
        ? 'no such directory'
        : code === 'ENOTDIR'
          ? 'not a directory'
          : code === 'EACCES'
            ? 'permission denied'
            : code;
    return [exitCode, `cannot use working directory ${cmd}: ${why}`];
  }
  if (code === 'ENOENT') return [exitCode, `${cmd}: command not found`];
  if (code === 'EACCES') return [exitCode, `${cmd}: permission denied (or not an executable file)`];
  if (code === 'EISDIR') return [exitCode, `${cmd}: is a directory`];
  return [exitCode, `${cmd}: cannot execute (${code ?? 'unknown error'})`];
}

/**
 * Whether `who` may enter directory `dir`: search (x) permission on it and on every directory
 * above it, judged from the mode bits as the kernel does for owner, group and others (primary
 * group only; POSIX ACLs are not consulted).
 */
export async function canEnter(dir: string, who: Pick<Identity, 'uid' | 'gid'>): Promise<boolean> {
  let path = posix.resolve(dir);
  for (;;) {
    const st = await stat(path).catch(() => null);
    if (!st) return false;
    const bit = st.uid === who.uid ? 0o100 : st.gid === who.gid ? 0o010 : 0o001;
    if ((st.mode & bit) === 0) return false;
    if (path === '/') return true;
    path = posix.dirname(path);
  }
}
