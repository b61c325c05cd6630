/**
 * Processes the guest runs: spawn (user, cwd, env, shell, stdin, timeout), output framing with
 * backpressure, stdin writes, signals to the process group, exit reporting and record retention.
 *
 * Every process is the leader of its own process group (`detached: true` → setsid), so signals
 * reach the whole group with `process.kill(-pid, sig)`. A timeout, SIGKILL, SIGTERM and shutdown
 * reach further: every process the command started, also those that left its group or session
 * (`tree.ts`, R11). Orphans are reaped by PID 1 (tini) — nothing here relies on anything else.
 *
 * This module owns the table of a sandbox's processes ({@link ProcessManager}: start, lookup,
 * listing, the out-of-memory kill, shutdown); one process's life is `managed-process.ts`, the
 * start request's validation and failure wording `process-start.ts`.
 */

import { type ChildProcess, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { stat, writeFile } from 'node:fs/promises';
import { SpaceError } from '../core/errors.ts';
import type { ProcessInfo } from '../core/guest-protocol.ts';
import { isObject, parseEnv } from './http.ts';
import { errorFields, type Logger } from './log.ts';
import { DELIVERED_RECORD_TTL_MS, ManagedProcess } from './managed-process.ts';
import { chooseOomVictim, type OomVictim } from './oom.ts';
import { bad, canEnter, parseStart, type StartSpec, spawnFailure } from './process-start.ts';
import { PTY_PYTHON, ptyArgv } from './pty.ts';
import { COMMAND_MARKER_ENV } from './tree.ts';
import type { Identity } from './users.ts';

/** PATH given to processes unless the sandbox or the process sets one (Debian's default). */
export const DEFAULT_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';
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
