/**
 * Processes the guest runs: spawn (user, cwd, env, shell, stdin, timeout), output framing with
 * backpressure, stdin writes, signals to the process group, exit reporting and record retention.
 *
 * Every process is the leader of its own process group (`detached: true` → setsid), so signals
 * reach the whole group with `process.kill(-pid, sig)`. A timeout, SIGKILL, SIGTERM and shutdown
 * reach further: every process the command started, also those that left its group or session
 * (`tree.ts`, R11). Orphans are reaped by PID 1 (tini) — nothing here relies on anything else.
 */

import { type ChildProcess, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { stat, writeFile } from 'node:fs/promises';
import type { IncomingMessage } from 'node:http';
import { constants as osConstants } from 'node:os';
import { posix } from 'node:path';
import type { Readable, Writable } from 'node:stream';
import { SpaceError } from '../core/errors.ts';
import type { ProcessExit, ProcessInfo, ProcessStartRequest } from '../core/guest-protocol.ts';
import { isObject, parseEnv } from './http.ts';
import { errorFields, type Logger } from './log.ts';
import { chooseOomVictim, type OomVictim } from './oom.ts';
import { OutputStream } from './output.ts';
import { PTY_PYTHON, parsePtySize, ptyArgv, resizeLine } from './pty.ts';
import { COMMAND_MARKER_ENV, signalCommand } from './tree.ts';
import type { Identity } from './users.ts';

/**
 * After the group leader exits, how long (ms, counted only while its pipes are being read) the guest
 * waits for the pipes to close. Children that still hold them (`sh -c 'python3 -m http.server &'`)
 * are background processes: after this grace the command is over — its stream ends with the
 * leader's exit — and they keep running (R12). Their later output is read and discarded, so they
 * never block on a full pipe or die of a broken one. They end with the sandbox, or when they exit;
 * a timeout or signal that hits the command *while it runs* still reaches its whole group, and a
 * timeout, SIGKILL or SIGTERM everything it started (R11).
 */
export const LEADER_EXIT_GRACE_MS = 100;
/** Signals sent to every process a command started (R11); others go to its process group only. */
const TREE_SIGNALS: ReadonlySet<string> = new Set(['SIGKILL', 'SIGTERM']);
/** How long a record stays after its exit frame was fully delivered. */
export const DELIVERED_RECORD_TTL_MS = 60_000;
/** How long a record of an exited process whose output nobody finished reading stays. */
export const UNREAD_RECORD_TTL_MS = 30 * 60_000;
/** PATH given to processes unless the sandbox or the process sets one (Debian's default). */
export const DEFAULT_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';
/** Largest timeoutMs honoured exactly (setTimeout's limit, ~24.8 days); larger values are clamped. */
const MAX_TIMER_MS = 2_147_483_647;
/** Ids given to processes that could not start: above the kernel's largest pid (2^22). */
const FIRST_FAILED_ID = 4_194_304 + 1;

export interface ProcessManagerOptions {
  /** The unprivileged default user. */
  user: Identity;
  /** The root account (used when `user: 'root'`). */
  root: Identity;
  /** Default working directory (the user's home). */
  home: string;
  /** Whether the daemon may change uid/gid (it runs as root). */
  canSwitchUser: boolean;
  log: Logger;
  /** Override of {@link DELIVERED_RECORD_TTL_MS} (tests). */
  deliveredTtlMs?: number;
  /**
   * Set each command's `oom_score_adj` to 0: the daemon runs protected from the guest kernel's OOM
   * killer (-1000, a VM's init sets it) and its children inherit that (see {@link oomProtected}).
   */
  resetOomScore?: boolean;
}

/**
 * Whether this process runs out of the OOM killer's reach (`/proc/self/oom_score_adj` below 0):
 * its commands must then be given 0 again. False where it cannot be read.
 */
export function oomProtected(procSelf = '/proc/self'): boolean {
  try {
    return Number(readFileSync(`${procSelf}/oom_score_adj`, 'utf8').trim()) < 0;
  } catch {
    return false;
  }
}

function processExited(message: string): SpaceError {
  return new SpaceError('PROCESS_EXITED', message);
}

/** Validated form of a start request. */
interface StartSpec {
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

function bad(message: string): SpaceError {
  return new SpaceError('BAD_REQUEST', message);
}

function parseStart(body: unknown, home: string): StartSpec {
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
function spawnFailure(
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

/** One process the guest runs or ran. */
export class ManagedProcess {
  readonly pid: number;
  readonly tag: string | undefined;
  readonly cmd: string;
  readonly args: string[];
  readonly startedAt: number;
  readonly output: OutputStream;
  /** Value of `SPACE_COMMAND` in the command's environment (see tree.ts). */
  readonly marker: string;
  exit: ProcessExit | undefined;
  #child: ChildProcess | undefined;
  #stdin: Writable | null = null;
  /** fd 3 of a PTY helper: resize lines (pty.ts); null without a terminal. */
  #control: Writable | null = null;
  #stdinClosed = true;
  #stdinQueue: Promise<void> = Promise.resolve();
  #pipes: Readable[] = [];
  #openPipes = 0;
  #leaderExit: { code: number | null; signal: string | null } | undefined;
  #timedOut = false;
  /** One of its processes was killed to free the sandbox's memory (oom.ts). */
  #oomKilled = false;
  #timeoutTimer: NodeJS.Timeout | undefined;
  #graceTimer: NodeJS.Timeout | undefined;
  /** The leader exited and background processes hold the pipes: the command is over (R12). */
  #backgrounded = false;
  #retentionTimer: NodeJS.Timeout | undefined;
  readonly #forget: (p: ManagedProcess) => void;

  constructor(
    pid: number,
    spec: StartSpec,
    forget: (p: ManagedProcess) => void,
    deliveredTtlMs: number,
    marker = '',
  ) {
    this.pid = pid;
    this.marker = marker;
    this.tag = spec.tag;
    this.cmd = spec.cmd;
    this.args = spec.args;
    this.startedAt = Date.now();
    this.#forget = forget;
    this.output = new OutputStream({
      onPause: () => this.#setReading(false),
      onResume: () => this.#setReading(true),
      onDelivered: () => this.#retain(deliveredTtlMs),
    });
  }

  get running(): boolean {
    return this.exit === undefined;
  }

  info(): ProcessInfo {
    return {
      pid: this.pid,
      ...(this.tag !== undefined ? { tag: this.tag } : {}),
      cmd: this.cmd,
      args: this.args,
      startedAt: this.startedAt,
      running: this.running,
      ...(this.exit ? { exit: this.exit } : {}),
    };
  }

  /** Records a process that could not start: a stderr frame with the reason, then the exit frame. */
  failed(exitCode: number, message: string): void {
    this.exit = { exitCode, signal: null, timedOut: false, error: message };
    this.#retain(UNREAD_RECORD_TTL_MS);
    this.output.stderr(Buffer.from(message + '\n'));
    this.output.finish(this.exit);
  }

  /**
   * Sets the terminal size of a PTY process.
   * @throws SpaceError BAD_REQUEST without a terminal, PROCESS_EXITED once it exited.
   */
  resize(cols: number, rows: number): void {
    if (!this.#control) throw bad('the process has no terminal');
    if (!this.running || this.#control.destroyed) throw processExited('the process has exited');
    this.#control.write(resizeLine(cols, rows));
  }

  /** Takes over a spawned child. */
  adopt(child: ChildProcess, timeoutMs: number): void {
    this.#child = child;
    const control = child.stdio[3];
    if (control && 'write' in control) {
      this.#control = control;
      control.on('error', () => {});
    }
    if (child.stdin) {
      this.#stdin = child.stdin;
      this.#stdinClosed = false;
      // EPIPE and friends when the child closes its stdin; writes see them through their callbacks.
      child.stdin.on('error', () => {
        this.#stdinClosed = true;
      });
    }
    for (const [pipe, frame] of [
      [child.stdout, 'stdout'],
      [child.stderr, 'stderr'],
    ] as const) {
      if (!pipe) continue;
      this.#pipes.push(pipe);
      this.#openPipes++;
      pipe.on('data', (data: Buffer) => {
        if (this.#backgrounded) return; // the command is over: background output goes nowhere
        if (frame === 'stdout') this.output.stdout(data);
        else this.output.stderr(data);
      });
      pipe.on('error', () => {});
      pipe.on('close', () => {
        this.#openPipes--;
        this.#settle();
      });
    }
    child.on('exit', (code, signal) => {
      this.#leaderExit = { code, signal };
      if (this.#timeoutTimer) clearTimeout(this.#timeoutTimer);
      this.exit = {
        exitCode: code,
        signal,
        timedOut: this.#timedOut,
        ...(this.#oomKilled ? { oomKilled: true } : {}),
      };
      this.#retain(UNREAD_RECORD_TTL_MS); // also bounds a record whose paused output nobody reads
      this.#closeStdin();
      this.#settle();
    });
    if (timeoutMs > 0) {
      this.#timeoutTimer = setTimeout(() => {
        this.#timedOut = true;
        this.killCommand('SIGKILL');
      }, timeoutMs);
    }
  }

  /**
   * Notes that `victim`, one of this command's processes, was killed to free memory: its exit
   * says `oomKilled`, and its stderr gets a line that says which process died and why.
   */
  markOomKilled(victim: Pick<OomVictim, 'pid' | 'comm' | 'rssBytes'>): void {
    this.#oomKilled = true;
    if (this.exit || this.#backgrounded) return;
    const mib = (victim.rssBytes / 2 ** 20).toFixed(0);
    this.output.stderr(
      Buffer.from(
        `space: killed ${victim.comm || 'a process'} (pid ${victim.pid}, ${mib} MiB): the sandbox ran out of memory\n`,
      ),
    );
  }

  /** Sends `signal` to the whole process group (no-op once it is gone). */
  killGroup(signal: NodeJS.Signals): void {
    try {
      process.kill(-this.pid, signal);
    } catch {
      // ESRCH: the group is already gone.
    }
  }

  /**
   * Sends `signal` to the group at once, then to every other process the command started (its
   * descendants and whatever carries its marker: setsid, setpgid, double forks) — see tree.ts.
   * SIGKILL sweeps until none is left. Fire and forget: never throws.
   */
  killCommand(signal: NodeJS.Signals): void {
    this.killGroup(signal);
    if (this.#child === undefined) return;
    void signalCommand(this.pid, this.marker, signal);
  }

  /** Whether any member of the group may still be alive (leader running or pipes still open). */
  get active(): boolean {
    return this.#child !== undefined && (this.#leaderExit === undefined || this.#openPipes > 0);
  }

  signal(name: string): void {
    if (!Object.hasOwn(osConstants.signals, name)) throw bad(`unknown signal ${JSON.stringify(name)}`);
    if (!this.running) throw processExited('the process has exited');
    if (TREE_SIGNALS.has(name)) this.killCommand(name as NodeJS.Signals);
    else this.killGroup(name as NodeJS.Signals);
  }

  /** Writes a request body to stdin with backpressure; resolves once it is flushed to the pipe. */
  async writeStdin(req: IncomingMessage): Promise<void> {
    const prev = this.#stdinQueue;
    let release = () => {};
    this.#stdinQueue = new Promise((resolve) => {
      release = resolve;
    });
    await prev;
    try {
      await this.#writeBody(req);
    } finally {
      release();
    }
  }

  async #writeBody(req: IncomingMessage): Promise<void> {
    let failure: SpaceError | null = null;
    let lastWrite: Promise<Error | null | undefined> = Promise.resolve(null);
    for await (const chunk of req) {
      if (failure) continue; // keep draining the body so the error answer can be sent
      const stdin = this.#stdin;
      if (!stdin || this.#stdinClosed || !this.running || stdin.destroyed) {
        failure = processExited(
          this.#stdin ? 'stdin is closed or the process has exited' : 'stdin is not open',
        );
        continue;
      }
      let ok = true;
      lastWrite = new Promise((resolve) => {
        ok = stdin.write(chunk as Buffer, resolve);
      });
      if (!ok) await waitDrain(stdin);
    }
    if (failure) throw failure;
    const stdin = this.#stdin;
    if (!stdin || this.#stdinClosed || stdin.destroyed) {
      throw processExited(this.#stdin ? 'stdin is closed or the process has exited' : 'stdin is not open');
    }
    const err = await lastWrite;
    if (err) throw processExited('the process closed its stdin');
  }

  /** Closes stdin (EOF for the child). Idempotent. */
  async closeStdin(): Promise<void> {
    const prev = this.#stdinQueue;
    await prev;
    this.#closeStdin();
  }

  #closeStdin(): void {
    this.#stdinClosed = true;
    const stdin = this.#stdin;
    if (!stdin || stdin.destroyed || stdin.writableEnded) return;
    if (this.running) stdin.end();
    else stdin.destroy();
  }

  /**
   * Kills the group, closes the pipes and cuts any consumer (forgetting, pid reuse). Background
   * processes of a command that is over are left running with their pipes drained, unless `force`
   * (the guest shutting down).
   */
  dispose(kill = true, force = false): void {
    const keepBackground = this.#backgrounded && !force;
    if (kill && force) this.killCommand('SIGKILL');
    else if (kill && this.active && !keepBackground) this.killGroup('SIGKILL');
    if (!keepBackground) for (const pipe of this.#pipes) pipe.destroy();
    this.#stdin?.destroy();
    this.#control?.destroy();
    if (this.#timeoutTimer) clearTimeout(this.#timeoutTimer);
    if (this.#graceTimer) clearTimeout(this.#graceTimer);
    if (this.#retentionTimer) clearTimeout(this.#retentionTimer);
    this.output.dispose();
  }

  #setReading(on: boolean): void {
    if (this.#backgrounded) return; // always drained
    for (const pipe of this.#pipes) {
      if (on) pipe.resume();
      else pipe.pause();
    }
    if (on) this.#armGrace();
    else if (this.#graceTimer) {
      clearTimeout(this.#graceTimer);
      this.#graceTimer = undefined;
    }
  }

  /** Ends the stream once the leader exited and both pipes closed; else arms the grace timer. */
  #settle(): void {
    if (this.#leaderExit === undefined || this.output.finished) return;
    if (this.#openPipes > 0) {
      this.#armGrace();
      return;
    }
    if (this.#graceTimer) clearTimeout(this.#graceTimer);
    this.#graceTimer = undefined;
    this.#retain(UNREAD_RECORD_TTL_MS);
    this.output.finish(this.exit!);
  }

  /** See {@link LEADER_EXIT_GRACE_MS}. The timer only runs while the pipes are being read. */
  #armGrace(): void {
    if (this.#leaderExit === undefined || this.#openPipes === 0 || this.output.paused || this.#graceTimer)
      return;
    this.#graceTimer = setTimeout(() => {
      this.#graceTimer = undefined;
      if (this.#openPipes === 0) return;
      this.#backgrounded = true;
      for (const pipe of this.#pipes) pipe.resume();
      this.#retain(UNREAD_RECORD_TTL_MS);
      this.output.finish(this.exit!);
    }, LEADER_EXIT_GRACE_MS);
  }

  #retain(ms: number): void {
    if (this.#retentionTimer) clearTimeout(this.#retentionTimer);
    this.#retentionTimer = setTimeout(() => this.#forget(this), ms);
    this.#retentionTimer.unref();
  }
}

function waitDrain(stream: Writable): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      stream.off('drain', done);
      stream.off('close', done);
      stream.off('error', done);
      resolve();
    };
    stream.on('drain', done);
    stream.on('close', done);
    stream.on('error', done);
  });
}

/** All processes of the sandbox, keyed by pid. */
export class ProcessManager {
  readonly #opts: ProcessManagerOptions;
  readonly #processes = new Map<number, ManagedProcess>();
  #sandboxEnv: Record<string, string> = {};
  #nextFailedId = FIRST_FAILED_ID;

  constructor(opts: ProcessManagerOptions) {
    this.#opts = opts;
  }

  get #deliveredTtl(): number {
    return this.#opts.deliveredTtlMs ?? DELIVERED_RECORD_TTL_MS;
  }

  /** POST /init: sandbox-wide env defaults for later processes. */
  init(body: unknown): void {
    if (!isObject(body)) throw bad('body must be a json object');
    this.#sandboxEnv = parseEnv(body.env, 'env');
  }

  get(pid: number): ManagedProcess {
    const p = this.#processes.get(pid);
    if (!p) throw new SpaceError('COMMAND_NOT_FOUND', `no process ${pid}`, { pid });
    return p;
  }

  /**
   * The out-of-memory kill (oom.ts): SIGKILLs the process holding the most memory, never PID 1 or
   * this daemon, and marks the command it belongs to (by its marker, else its ancestry). Resolves
   * with the victim, or undefined when no process but the daemon is left.
   */
  async oomKill(procRoot = '/proc'): Promise<OomVictim | undefined> {
    const victim = await chooseOomVictim(new Set([process.pid]), procRoot);
    if (!victim) return undefined;
    try {
      process.kill(victim.pid, 'SIGKILL');
    } catch {
      return undefined; // it exited meanwhile: its memory is free already
    }
    const owner = [...this.#processes.values()].find(
      (p) =>
        p.running &&
        ((victim.marker !== undefined && p.marker === victim.marker) || victim.lineage.includes(p.pid)),
    );
    owner?.markOomKilled(victim);
    this.#opts.log('warn', 'process killed: out of memory', {
      pid: victim.pid,
      comm: victim.comm,
      rssBytes: victim.rssBytes,
      ...(owner?.tag !== undefined ? { tag: owner.tag } : {}),
    });
    return victim;
  }

  list(): ProcessInfo[] {
    return [...this.#processes.values()].map((p) => p.info());
  }

  /** Starts a process (one that cannot start is still recorded, with its error). */
  async start(body: unknown): Promise<ManagedProcess> {
    const spec = parseStart(body, this.#opts.home);
    const { log } = this.#opts;
    const who = spec.user === 'root' ? this.#opts.root : this.#opts.user;
    const marker = randomBytes(8).toString('hex');
    const env: Record<string, string> = {
      PATH: DEFAULT_PATH,
      HOME: who.home,
      USER: who.name,
      LOGNAME: who.name,
      SHELL: who.shell,
      ...this.#sandboxEnv,
      ...spec.env,
      [COMMAND_MARKER_ENV]: marker,
    };
    const cwdError =
      (await stat(spec.cwd).then(
        (s) => (s.isDirectory() ? undefined : 'ENOTDIR'),
        (err: NodeJS.ErrnoException) => err.code ?? 'EACCES',
      )) ??
      // the child changes directory before it drops to the user's ids: check with the user's
      // rights, or `cwd: /root` would start as `user` and fail on everything after (R15)
      (this.#opts.canSwitchUser && who.uid !== 0 && !(await canEnter(spec.cwd, who)) ? 'EACCES' : undefined);
    if (cwdError) return this.#failed(spec, ...spawnFailure(spec.cwd, cwdError, 'cwd'));

    const direct = spec.shell ? '/bin/sh' : spec.cmd;
    const directArgv = spec.shell ? ['-c', spec.cmd] : spec.args;
    // on a terminal, the PTY helper runs in the command's place and execs it (pty.ts)
    const file = spec.pty ? PTY_PYTHON : direct;
    const argv = spec.pty ? ptyArgv(spec.pty.cols, spec.pty.rows, direct, directArgv) : directArgv;
    const ids = this.#opts.canSwitchUser ? { uid: who.uid, gid: who.gid } : {};
    let child: ChildProcess;
    try {
      child = spawn(file, argv, {
        cwd: spec.cwd,
        env,
        ...ids,
        detached: true,
        stdio: spec.pty ? ['pipe', 'pipe', 'pipe', 'pipe'] : [spec.stdin ? 'pipe' : 'ignore', 'pipe', 'pipe'],
      });
    } catch (err) {
      return this.#failed(spec, ...spawnFailure(file, (err as NodeJS.ErrnoException).code, 'cmd', spec));
    }
    if (child.pid === undefined) {
      const err = await new Promise<NodeJS.ErrnoException>((resolve) => child.once('error', resolve));
      return this.#failed(spec, ...spawnFailure(file, err.code, 'cmd', spec));
    }
    child.on('error', (err) => log('warn', 'child error', { pid: child.pid, ...errorFields(err) }));
    const pid = child.pid;
    // inherited -1000 from the protected daemon: the command is the OOM killer's to pick again. A
    // process it forks in the microseconds before this write keeps -1000 (a known window)
    // (not awaited: the child's exit must find its listeners, attached below, in this same tick)
    if (this.#opts.resetOomScore)
      void writeFile(`/proc/${pid}/oom_score_adj`, '0').catch((err: unknown) =>
        log('warn', 'oom_score_adj not reset', { pid, ...errorFields(err) }),
      );
    // An old record whose pid the kernel reused: its group is gone, so only drop it (never signal -pid).
    this.#processes.get(pid)?.dispose(false);
    const p = new ManagedProcess(pid, spec, (gone) => this.#drop(gone), this.#deliveredTtl, marker);
    this.#processes.set(pid, p);
    p.adopt(child, spec.timeoutMs);
    log('info', 'process started', { pid, cmd: spec.cmd, user: who.name, tag: spec.tag });
    child.on('exit', (code, signal) => log('info', 'process exited', { pid, code, signal }));
    return p;
  }

  /** Kills every process group (background ones too) and cuts every consumer. */
  shutdown(): void {
    for (const p of this.#processes.values()) p.dispose(true, true);
  }

  #failed(spec: StartSpec, exitCode: number, message: string): ManagedProcess {
    const id = this.#nextFailedId++;
    const p = new ManagedProcess(id, spec, (gone) => this.#drop(gone), this.#deliveredTtl);
    this.#processes.set(id, p);
    p.failed(exitCode, message);
    this.#opts.log('info', 'process failed to start', { pid: id, cmd: spec.cmd, exitCode, message });
    return p;
  }

  #drop(p: ManagedProcess): void {
    if (this.#processes.get(p.pid) === p) this.#processes.delete(p.pid);
    p.dispose();
  }
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
