/**
 * Output of the CLI: machine JSON on stdout (`--json`) or human text, coded errors on stderr, and the
 * small pure parsers/formatters the commands share (K=V pairs, tables, sizes, exit codes).
 */
import { constants } from 'node:os';

/**
 * Exit codes the CLI keeps for itself, so they never pass for a command's own (R16). As with
 * `docker run`: 125 when the CLI failed (bad flags, an unreachable API, a refused key, an unknown
 * sandbox — the message on stderr says which), 126 when the command could not be invoked, 127 when
 * it was not found. Every other code of `space exec` is the command's own; 124 a timeout; 128+n a
 * signal.
 */
export const EXIT_CLI_FAILED = 125;
/** Exit code of a usage error (bad flags or arguments). */
export const EXIT_USAGE = EXIT_CLI_FAILED;
/** Exit code of every other error of the CLI itself. */
export const EXIT_ERROR = EXIT_CLI_FAILED;

/**
 * An error the CLI reports as `error CODE: message` (or as `{ error: { code, message, details } }`
 * with `--json`). `code` is the server's stable error code when the error came from SPACE, or a
 * CLI code (`UNREACHABLE`, `USAGE`, `PREREQUISITES`, …) otherwise.
 */
export class CliError extends Error {
  readonly code: string;
  readonly details: Record<string, unknown> | undefined;
  readonly exitCode: number;
  /** One extra line for humans (not part of the JSON body's message). */
  readonly hint: string | undefined;

  constructor(
    code: string,
    message: string,
    opts: { details?: Record<string, unknown>; exitCode?: number; hint?: string; cause?: unknown } = {},
  ) {
    super(message, { cause: opts.cause });
    this.name = 'CliError';
    this.code = code;
    this.details = opts.details;
    this.exitCode = opts.exitCode ?? EXIT_ERROR;
    this.hint = opts.hint;
  }

  toBody(): { error: { code: string; message: string; details?: Record<string, unknown> } } {
    return {
      error: { code: this.code, message: this.message, ...(this.details ? { details: this.details } : {}) },
    };
  }
}

/** A usage error (exit code 2). */
export function usageError(message: string): CliError {
  return new CliError('USAGE', message, { exitCode: EXIT_USAGE });
}

/** Any thrown value as a CliError (unexpected ones become INTERNAL). */
export function toCliError(err: unknown): CliError {
  if (err instanceof CliError) return err;
  if (err instanceof Error) return new CliError('INTERNAL', err.message, { cause: err });
  return new CliError('INTERNAL', String(err));
}

/** The text `error CODE: message` (+ hint line) a human sees for `err`. */
export function formatError(err: CliError): string {
  return `error ${err.code}: ${err.message}` + (err.hint ? `\n${err.hint}` : '');
}

/** Writes `err` to stderr in the chosen format; returns the exit code to use. */
export function reportError(err: unknown, json: boolean): number {
  const e = toCliError(err);
  process.stderr.write(json ? `${JSON.stringify(e.toBody())}\n` : `${formatError(e)}\n`);
  return e.exitCode;
}

const stdoutGone: (() => Promise<unknown>)[] = [];

/**
 * Registers what to do when the reader of stdout goes away (EPIPE), before the CLI exits with 141
 * as a shell would report SIGPIPE: `space exec … | head -1` passes the broken pipe on to the
 * command in the sandbox instead of leaving it running.
 * @returns a function that unregisters it.
 */
export function onStdoutGone(fn: () => Promise<unknown>): () => void {
  stdoutGone.push(fn);
  return () => {
    const i = stdoutGone.indexOf(fn);
    if (i >= 0) stdoutGone.splice(i, 1);
  };
}

/** Runs what {@link onStdoutGone} registered, for at most `timeoutMs` (never throws). */
export async function runStdoutGone(timeoutMs = 3000): Promise<void> {
  await Promise.race([
    Promise.allSettled(stdoutGone.map((fn) => fn())),
    new Promise((r) => setTimeout(r, timeoutMs).unref()),
  ]);
}

/** Writes one JSON document (pretty, one trailing newline) to stdout. */
export function printJson(value: unknown): void {
  process.stdout.write(`${JSON.stringify(value, null, 2)}\n`);
}

/** Writes one line to stdout. */
export function println(line = ''): void {
  process.stdout.write(`${line}\n`);
}

/** Writes one line to stderr (progress, notes). */
export function note(line: string): void {
  process.stderr.write(`${line}\n`);
}

/** Parses `KEY=VALUE` (the value may contain `=`, may be empty). Throws a usage error. */
export function parseKeyValue(text: string, what = 'pair'): [string, string] {
  const i = text.indexOf('=');
  if (i <= 0) throw usageError(`${what} must look like KEY=VALUE, got "${text}"`);
  return [text.slice(0, i), text.slice(i + 1)];
}

/**
 * Commander collector for repeatable `--flag K=V` options.
 * Throws a usage error when a key comes twice with two values (none is silently dropped).
 */
export function collectKeyValue(what: string) {
  return (value: string, previous: Record<string, string> | undefined): Record<string, string> => {
    const [k, v] = parseKeyValue(value, what);
    // never silently the last one (R26): a key given twice must mean one value
    if (previous && Object.hasOwn(previous, k) && previous[k] !== v) {
      throw usageError(`${what} gives ${k} twice (${previous[k]} and ${v}); give each key once`);
    }
    return { ...(previous ?? {}), [k]: v };
  };
}

/** Commander parser for a positive integer option. */
export function parsePositiveInt(what: string) {
  return (value: string): number => {
    if (!/^[0-9]+$/.test(value) || Number(value) < 1)
      throw usageError(`${what} must be a positive integer, got "${value}"`);
    return Number(value);
  };
}

/** Commander parser for an integer ≥ 0 (e.g. `--auto-pause 0` = never). */
export function parseNonNegativeInt(what: string) {
  return (value: string): number => {
    const n = Number(value);
    if (!/^\d+$/.test(value.trim()) || !Number.isSafeInteger(n)) {
      throw usageError(`${what} takes a whole number ≥ 0; got "${value}"`);
    }
    return n;
  };
}

/** Commander parser for a positive number option (e.g. fractional vCPUs). */
export function parsePositiveNumber(what: string) {
  return (value: string): number => {
    const n = Number(value);
    if (value.trim() === '' || !Number.isFinite(n) || n <= 0) {
      throw usageError(`${what} must be a positive number, got "${value}"`);
    }
    return n;
  };
}

/** `{ a: '1', b: 'x y' }` → `a=1&b=x+y` (the API's `metadata` query value, before URL encoding). */
export function metadataQuery(metadata: Record<string, string>): string {
  return new URLSearchParams(Object.entries(metadata)).toString();
}

/** Renders rows as left-aligned columns separated by two spaces (no trailing spaces). */
export function table(header: string[], rows: string[][]): string {
  const all = [header, ...rows];
  const widths = header.map((_, i) => Math.max(...all.map((r) => (r[i] ?? '').length)));
  return all
    .map((r) =>
      r
        .map((cell, i) => (i === r.length - 1 ? cell : cell.padEnd(widths[i] ?? 0)))
        .join('  ')
        .trimEnd(),
    )
    .join('\n');
}

/** Bytes for humans: `512 B`, `1.5 KiB`, `20.0 MiB`. */
export function formatBytes(n: number): string {
  if (n < 1024) return `${n} B`;
  const units = ['KiB', 'MiB', 'GiB', 'TiB'];
  let v = n;
  let u = -1;
  while (v >= 1024 && u < units.length - 1) {
    v /= 1024;
    u++;
  }
  return `${v.toFixed(1)} ${units[u]}`;
}

/** Time from `now` to `iso` for humans: `5s ago`, `in 4m`, `2h ago`, `3d ago`. */
export function formatRelative(iso: string, now = Date.now()): string {
  const t = Date.parse(iso);
  if (Number.isNaN(t)) return iso;
  const d = t - now;
  const a = Math.abs(d) / 1000;
  const s =
    a < 60
      ? `${Math.round(a)}s`
      : a < 3600
        ? `${Math.round(a / 60)}m`
        : a < 86400
          ? `${Math.round(a / 3600)}h`
          : `${Math.round(a / 86400)}d`;
  return d >= 0 ? `in ${s}` : `${s} ago`;
}

/** Permission bits as `rwxr-xr-x` with a type letter in front. */
export function formatMode(type: string, mode: number): string {
  const t = type === 'dir' ? 'd' : type === 'symlink' ? 'l' : type === 'file' ? '-' : '?';
  const bits = 'rwxrwxrwx';
  let out = '';
  for (let i = 0; i < 9; i++) out += mode & (1 << (8 - i)) ? bits[i] : '-';
  return t + out;
}

/** The end of a command as the data plane reports it (`exit` event). */
export interface CommandExit {
  exitCode: number | null;
  signal: string | null;
  timedOut: boolean;
  error?: string;
}

/**
 * The CLI's exit code for a finished command, as a shell would report it: timed out → 124; exit
 * code → itself (the guest reports a command it could not start as 127, not found, or 126, not
 * runnable, as shells do); killed by a signal → 128 + its number; anything else →
 * {@link EXIT_CLI_FAILED}.
 */
export function exitCodeOf(e: CommandExit): number {
  if (e.timedOut) return 124;
  if (e.exitCode !== null && e.exitCode !== undefined) return e.exitCode;
  if (e.signal) {
    const n = (constants.signals as Record<string, number | undefined>)[e.signal];
    return 128 + (n ?? 0);
  }
  return EXIT_ERROR;
}
