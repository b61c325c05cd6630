/**
 * Host commands of the agent's hot paths (network setup and teardown, runsc, mounts), run by a
 * helper process so that spawning never blocks the agent's event loop.
 *
 * Why: Node spawns by forking, and the fork runs on the event loop. The fork copies the page tables
 * of the process that forks, so it costs more the larger that process is. A warm slot takes ~14
 * commands to make and a teardown ~7. During a 32-way create burst the agent spent ~7 ms per spawn
 * (~2.4 s in all), and claims and dispatches queued behind that time. The helper
 * (host-exec-helper.ts) is a bare Node process; it forks instead, and the agent only writes a line
 * and reads one back.
 *
 * {@link hostExec} resolves and rejects like `promisify(execFile)`: `{ stdout, stderr }`, or an Error
 * carrying `code` (exit status, or Node's error code such as `ENOENT`), `signal`, `killed`,
 * `stdout` and `stderr`. If the helper cannot be started, the command runs in this process instead.
 * If the helper dies, the commands it was running fail with code `EHELPER` (whether they ran is not
 * known), and the next command starts a new helper.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { type HostExecReply, type HostExecRequest, runHostRequest } from './host-exec-helper.ts';

/** Options of one host command (the subset of execFile's the agent uses, plus `input` and `outputFile`). */
export interface HostExecOptions {
  /** Sends `killSignal` after this many ms. */
  timeout?: number;
  /** Signal of the timeout (default SIGTERM). */
  killSignal?: NodeJS.Signals;
  /** Largest stdout or stderr kept, bytes (default 1 MiB); more fails the command. */
  maxBuffer?: number;
  /** Written to the command's stdin, then closed. */
  input?: string;
  /** Environment of the command (default: the agent's). */
  env?: NodeJS.ProcessEnv;
  /** Append stdout and stderr to this file instead of capturing them. */
  outputFile?: string;
}

/** What a command printed (empty strings with `outputFile`). */
export interface HostExecOutput {
  stdout: string;
  stderr: string;
}

/** A command that failed: execFile's error shape. */
export interface HostExecError extends Error {
  /** Exit status, or a Node error code (`ENOENT`, `ERR_CHILD_PROCESS_STDIO_MAXBUFFER`, `EHELPER`). */
  code?: number | string;
  signal: string | null;
  killed: boolean;
  stdout: string;
  stderr: string;
  /** The command line, for messages. */
  cmd: string;
}

const HELPER = fileURLToPath(new URL('./host-exec-helper.ts', import.meta.url));

type Pending = { resolve: (r: HostExecReply) => void; cmd: string };

/**
 * One helper process and the commands it is running. Started on first use; not restarted until a
 * command needs it.
 */
export class HostExecutor {
  #child: ChildProcess | null = null;
  #broken = false;
  readonly #pending = new Map<number, Pending>();
  #nextId = 1;
  #buffer = '';

  /** Runs `file args` (no shell); see the module doc for results and errors. */
  async run(file: string, args: readonly string[], o: HostExecOptions = {}): Promise<HostExecOutput> {
    const req: HostExecRequest = {
      id: this.#nextId++,
      file,
      args: [...args],
      ...(o.input !== undefined ? { input: o.input } : {}),
      ...(o.timeout ? { timeoutMs: o.timeout } : {}),
      ...(o.killSignal ? { killSignal: o.killSignal } : {}),
      ...(o.maxBuffer ? { maxBufferBytes: o.maxBuffer } : {}),
      ...(o.env ? { env: definedEnv(o.env) } : {}),
      ...(o.outputFile ? { outputFile: o.outputFile } : {}),
    };
    const cmd = [file, ...args].join(' ');
    const child = this.#broken ? null : this.#helper();
    const reply = child
      ? await new Promise<HostExecReply>((resolve) => {
          this.#pending.set(req.id, { resolve, cmd });
          this.#refWhileBusy();
          child.stdin!.write(`${JSON.stringify(req)}\n`);
        })
      : await runHostRequest(req);
    if (reply.exitCode === 0 && !reply.errno) return { stdout: reply.stdout, stderr: reply.stderr };
    throw toError(cmd, reply);
  }

  /** Process id of the helper while one runs (for tests and diagnostics). */
  get helperPid(): number | undefined {
    return this.#child?.pid;
  }

  /** Closes the helper's stdin; it exits once its commands have ended. Pending commands still resolve. */
  close(): void {
    this.#child?.stdin?.end();
    this.#child = null;
  }

  #helper(): ChildProcess | null {
    if (this.#child) return this.#child;
    let child: ChildProcess;
    try {
      child = spawn(process.execPath, [HELPER], { stdio: ['pipe', 'pipe', 'inherit'] });
    } catch {
      this.#broken = true; // e.g. EAGAIN: run in this process from now on
      return null;
    }
    this.#child = child;
    this.#buffer = '';
    child.stdout!.setEncoding('utf8');
    child.stdout!.on('data', (chunk: string) => this.#onData(chunk));
    child.stdin!.on('error', () => {}); // reported through 'exit'
    child.on('error', () => {
      // could not start (ENOENT, EACCES): nothing was sent to it yet that it will answer
      if (this.#child === child) this.#child = null;
      this.#broken = true;
      this.#failPending(`host command helper could not start`);
    });
    child.on('exit', (code, signal) => {
      if (this.#child === child) this.#child = null;
      this.#failPending(`host command helper exited (${signal ?? code}) while running it`);
    });
    child.unref();
    (child.stdout as unknown as { unref?: () => void }).unref?.();
    (child.stdin as unknown as { unref?: () => void }).unref?.();
    return child;
  }

  /** The helper keeps this process alive only while it runs commands for it. */
  #refWhileBusy(): void {
    const out = this.#child?.stdout as unknown as { ref?: () => void; unref?: () => void } | undefined;
    if (this.#pending.size > 0) out?.ref?.();
    else out?.unref?.();
  }

  #onData(chunk: string): void {
    this.#buffer += chunk;
    for (let nl = this.#buffer.indexOf('\n'); nl >= 0; nl = this.#buffer.indexOf('\n')) {
      const line = this.#buffer.slice(0, nl);
      this.#buffer = this.#buffer.slice(nl + 1);
      let reply: HostExecReply;
      try {
        reply = JSON.parse(line) as HostExecReply;
      } catch {
        continue;
      }
      const p = this.#pending.get(reply.id);
      if (!p) continue;
      this.#pending.delete(reply.id);
      this.#refWhileBusy();
      p.resolve(reply);
    }
  }

  #failPending(message: string): void {
    const all = [...this.#pending.entries()];
    this.#pending.clear();
    for (const [id, p] of all)
      p.resolve({
        id,
        stdout: '',
        stderr: '',
        exitCode: null,
        signal: null,
        killed: false,
        errno: 'EHELPER',
        message,
      });
  }
}

function definedEnv(env: NodeJS.ProcessEnv): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(env)) if (v !== undefined) out[k] = v;
  return out;
}

function toError(cmd: string, r: HostExecReply): HostExecError {
  const err = new Error(
    r.message && r.errno ? `${r.message}: ${cmd}` : `Command failed: ${cmd}\n${r.stderr}`,
  ) as HostExecError;
  err.code = r.errno ?? r.exitCode ?? undefined;
  err.signal = r.signal;
  err.killed = r.killed;
  err.stdout = r.stdout;
  err.stderr = r.stderr;
  err.cmd = cmd;
  return err;
}

/** The agent's executor (one helper per agent process). */
export const hostExecutor = new HostExecutor();

/** Runs a host command through {@link hostExecutor}; drop-in for `promisify(execFile)`. */
export function hostExec(
  file: string,
  args: readonly string[],
  o?: HostExecOptions,
): Promise<HostExecOutput> {
  return hostExecutor.run(file, args, o);
}
