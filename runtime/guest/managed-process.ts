/**
 * One process the guest runs or ran ({@link ManagedProcess}): its output pipes framed into an
 * `OutputStream` with backpressure, the leader's exit and the grace after it (background processes
 * left running, R12), its timeout, stdin writes in order, signals (to the group, or to every process
 * the command started for SIGKILL/SIGTERM, `tree.ts`, R11), a PTY's resize, the OOM mark, and how
 * long its record is kept once it exited. The table of all of them is `processes.ts`.
 */
import type { ChildProcess } from 'node:child_process';
import type { IncomingMessage } from 'node:http';
import { constants as osConstants } from 'node:os';
import type { Duplex, Readable, Writable } from 'node:stream';
import { SpaceError } from '../core/errors.ts';
import type { ProcessExit, ProcessInfo } from '../core/guest-protocol.ts';
import type { OomVictim } from './oom.ts';
import { OutputStream } from './output.ts';
import { bad, type StartSpec } from './process-start.ts';
import { parseResizeAck, resizeLine } from './pty.ts';
import { signalCommand } from './tree.ts';

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
/** How long a resize waits for the PTY helper to say the size is set, ms. */
export const RESIZE_ANSWER_MS = 10_000;

function processExited(message: string): SpaceError {
  return new SpaceError('PROCESS_EXITED', message);
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
  /** fd 3 of a PTY helper: resize lines out, their answers in (pty.ts); null without a terminal. */
  #control: Duplex | null = null;
  /** Resizes sent and not yet answered, by sequence number. */
  readonly #resizes = new Map<
    number,
    { resolve: () => void; reject: (e: Error) => void; timer: NodeJS.Timeout }
  >();
  #resizeSeq = 0;
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
   * Sets the terminal size of a PTY process; resolves once the helper has set it (TIOCSWINSZ done,
   * SIGWINCH sent), so whatever the caller does next sees the new size.
   * @throws SpaceError BAD_REQUEST without a terminal or for a size the terminal refused,
   *   PROCESS_EXITED once it exited (also while waiting), SANDBOX_BUSY when the helper has not
   *   answered within {@link RESIZE_ANSWER_MS} (it is blocked writing output nobody reads).
   */
  resize(cols: number, rows: number): Promise<void> {
    const control = this.#control;
    if (!control) throw bad('the process has no terminal');
    if (!this.running || control.destroyed) throw processExited('the process has exited');
    const seq = ++this.#resizeSeq;
    return new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.#resizes.delete(seq);
        reject(
          new SpaceError(
            'SANDBOX_BUSY',
            `the terminal did not take its new size within ${RESIZE_ANSWER_MS} ms (is its output being read?)`,
          ),
        );
      }, RESIZE_ANSWER_MS);
      this.#resizes.set(seq, { resolve, reject, timer });
      control.write(resizeLine(cols, rows, seq));
    });
  }

  /** Settles the resize an answer line of the helper names. */
  #answered(line: string): void {
    const ack = parseResizeAck(line);
    const waiting = ack && this.#resizes.get(ack.seq);
    if (!ack || !waiting) return;
    this.#resizes.delete(ack.seq);
    clearTimeout(waiting.timer);
    if (ack.ok) waiting.resolve();
    else waiting.reject(bad('the terminal refused that size'));
  }

  /** Fails every resize still waiting (the helper or the process is gone). */
  #failResizes(): void {
    for (const [seq, w] of this.#resizes) {
      this.#resizes.delete(seq);
      clearTimeout(w.timer);
      w.reject(processExited('the process exited before its terminal took the new size'));
    }
  }

  /** Takes over a spawned child. */
  adopt(child: ChildProcess, timeoutMs: number): void {
    this.#child = child;
    const control = child.stdio[3];
    if (control && 'write' in control && 'on' in control) {
      const duplex = control as Duplex;
      this.#control = duplex;
      duplex.on('error', () => {});
      let pending = '';
      duplex.setEncoding('utf8');
      duplex.on('data', (text: string) => {
        pending += text;
        for (let nl = pending.indexOf('\n'); nl >= 0; nl = pending.indexOf('\n')) {
          this.#answered(pending.slice(0, nl));
          pending = pending.slice(nl + 1);
        }
        if (pending.length > 4096) pending = ''; // never a resize answer: not kept
      });
      duplex.on('close', () => this.#failResizes());
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
      this.#failResizes();
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
    this.#failResizes();
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
