/**
 * A template's start command and ready check (`startCmd`, `readyCmd`/`readyPort`, `startUser`,
 * `readyTimeoutSec`): what a definition may say (validated at load by templates.ts), and the
 * {@link TemplateStart} the instance factory runs on every instance it boots.
 */
import type { SpaceError } from '../../core/errors.ts';

/**
 * A template's start command and ready check (E2B's `setStartCmd(startCmd, readyCmd)`): a process
 * started with every instance booted from the template, which must be ready before the instance
 * is used (a warm slot, a template snapshot, a cold create). See {@link templateStart}.
 */
export interface TemplateStartFields {
  /** Shell script (`/bin/sh -c`) started in the background; its output goes to {@link START_LOG}. */
  startCmd?: string;
  /** Who runs the start and ready commands: `user` (default) or `root`. */
  startUser?: 'user' | 'root';
  /** Shell script run until it exits 0 (every {@link READY_POLL_MS}); needs `startCmd`. */
  readyCmd?: string;
  /** Instead of `readyCmd`: ready once something accepts TCP connections on 127.0.0.1:<port>. */
  readyPort?: number;
  /** How long the start may take to be ready, seconds (default 60, at most 600). */
  readyTimeoutSec?: number;
}

/** Where the start command's stdout and stderr go inside the sandbox (appended). */
export const START_LOG = '/tmp/space-start.log';
/** Pause between two runs of a template's ready check, ms. */
export const READY_POLL_MS = 200;
/** Default and longest wait for a template's start to be ready, seconds. */
export const READY_TIMEOUT_SEC = { default: 60, max: 600 } as const;

/** A template's start, as the instance factory runs it (built from the definition by {@link templateStart}). */
export interface TemplateStart {
  /** Shell script started in the background. */
  cmd: string;
  user: 'user' | 'root';
  /** Shell script that exits 0 once the start is ready. */
  readyCmd: string;
  /** Longest wait for ready, ms. */
  readyTimeoutMs: number;
}

/**
 * The start of a definition, or undefined when it declares none. A `readyPort` becomes a ready
 * command that opens a TCP connection with bash's `/dev/tcp` (bash is in every Debian tree); no
 * ready check at all means ready once the start command was started. Pure.
 */
export function templateStart(d: TemplateStartFields): TemplateStart | undefined {
  if (d.startCmd === undefined) return undefined;
  const readyCmd =
    d.readyCmd ?? (d.readyPort !== undefined ? `bash -c ': </dev/tcp/127.0.0.1/${d.readyPort}'` : 'true');
  return {
    cmd: d.startCmd,
    user: d.startUser ?? 'user',
    readyCmd,
    readyTimeoutMs: (d.readyTimeoutSec ?? READY_TIMEOUT_SEC.default) * 1000,
  };
}

/**
 * Refuses start settings that cannot work (`bad` makes the error, naming the template).
 * @throws SpaceError from `bad`.
 */
export function validateStart(d: TemplateStartFields, bad: (why: string) => SpaceError): void {
  const script = (v: unknown) => typeof v === 'string' && v.trim() !== '' && !v.includes('\0');
  if (d.startCmd !== undefined && !script(d.startCmd)) throw bad('"startCmd" must be a shell script');
  if (d.readyCmd !== undefined && !script(d.readyCmd)) throw bad('"readyCmd" must be a shell script');
  if (
    d.readyPort !== undefined &&
    !(Number.isInteger(d.readyPort) && d.readyPort >= 1 && d.readyPort <= 65535)
  )
    throw bad('"readyPort" must be a TCP port');
  if (d.readyCmd !== undefined && d.readyPort !== undefined)
    throw bad('"readyCmd" and "readyPort" exclude each other');
  if (d.startUser !== undefined && d.startUser !== 'user' && d.startUser !== 'root')
    throw bad('"startUser" must be "user" or "root"');
  if (
    d.readyTimeoutSec !== undefined &&
    !(
      typeof d.readyTimeoutSec === 'number' &&
      d.readyTimeoutSec > 0 &&
      d.readyTimeoutSec <= READY_TIMEOUT_SEC.max
    )
  )
    throw bad(`"readyTimeoutSec" must be in (0, ${READY_TIMEOUT_SEC.max}]`);
  const needsStart = ['readyCmd', 'readyPort', 'startUser', 'readyTimeoutSec'] as const;
  if (d.startCmd === undefined && needsStart.some((k) => d[k] !== undefined))
    throw bad('a ready check or start setting needs "startCmd"');
}
