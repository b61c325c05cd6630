/**
 * The host command helper: a small process the agent starts once (see host-exec.ts) to spawn its
 * short host commands (`ip`, `nft`, `runsc`, `mount`, `cp`). Spawning forks the spawning process,
 * and a fork's cost grows with the page tables it copies: measured on the agent during a 32-way
 * create burst, the agent (RSS ~220 MB) spent ~7 ms of its event loop per spawn, ~2.4 s in all, while
 * claims waited. This process holds only Node and this file (RSS ~40 MB), and its forks block
 * nobody's requests.
 *
 * Protocol (stdin → stdout, one JSON object per line): a {@link HostExecRequest} in, a
 * {@link HostExecReply} with the same `id` out, in completion order. The helper exits once its stdin
 * closes and its last command has ended. It imports nothing but Node's own modules, so it starts in
 * tens of ms and stays small.
 */
import { execFile, spawn } from 'node:child_process';
import { closeSync, openSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

/** One command to run. */
export interface HostExecRequest {
  /** Request id, echoed in the reply. */
  id: number;
  /** Executable (looked up on PATH) and its arguments; no shell. */
  file: string;
  args: string[];
  /** Written to the command's stdin, which is then closed. */
  input?: string;
  /** Sends `killSignal` after this many ms (execFile's `timeout`); absent or 0: none. */
  timeoutMs?: number;
  /** Signal of the timeout (default SIGTERM). */
  killSignal?: NodeJS.Signals;
  /** Largest stdout or stderr kept, bytes (execFile's `maxBuffer`; default 1 MiB); more fails the command. */
  maxBufferBytes?: number;
  /** Environment of the command (default: the helper's, which is the agent's). */
  env?: Record<string, string>;
  /** Appends the command's stdout and stderr to this file instead of returning them (a detaching start's console). */
  outputFile?: string;
}

/** How a command ended. */
export interface HostExecReply {
  id: number;
  stdout: string;
  stderr: string;
  /** Exit status; null when it did not exit on its own (signal) or never started. */
  exitCode: number | null;
  /** Signal that ended it, if any. */
  signal: string | null;
  /** True when the helper killed it for passing `timeoutMs`. */
  killed: boolean;
  /** Node's error code when it could not run or its output passed the limit (`ENOENT`, `ERR_CHILD_PROCESS_STDIO_MAXBUFFER`). */
  errno?: string;
  /** Node's error message on any failure. */
  message?: string;
}

/** Runs one request to its end; never rejects (a failure is in the reply). */
export function runHostRequest(req: HostExecRequest): Promise<HostExecReply> {
  return req.outputFile ? runToFile(req, req.outputFile) : runCaptured(req);
}

function runCaptured(req: HostExecRequest): Promise<HostExecReply> {
  return new Promise((resolve) => {
    const child = execFile(
      req.file,
      req.args,
      {
        encoding: 'utf8',
        timeout: req.timeoutMs ?? 0,
        killSignal: req.killSignal ?? 'SIGTERM',
        maxBuffer: req.maxBufferBytes ?? 1024 * 1024,
        ...(req.env ? { env: req.env } : {}),
      },
      (err, stdout, stderr) => {
        if (!err) {
          resolve({ id: req.id, stdout, stderr, exitCode: 0, signal: null, killed: false });
          return;
        }
        const code = (err as { code?: unknown }).code;
        resolve({
          id: req.id,
          stdout,
          stderr,
          exitCode: typeof code === 'number' ? code : null,
          signal: err.signal ?? null,
          killed: err.killed ?? false,
          ...(typeof code === 'string' ? { errno: code } : {}),
          message: err.message,
        });
      },
    );
    // a command that exits without reading its input must not fail the helper (EPIPE)
    child.stdin?.on('error', () => {});
    if (req.input !== undefined) child.stdin?.end(req.input);
    else child.stdin?.end();
  });
}

function runToFile(req: HostExecRequest, path: string): Promise<HostExecReply> {
  return new Promise((resolve) => {
    const failed = (err: NodeJS.ErrnoException) =>
      resolve({
        id: req.id,
        stdout: '',
        stderr: '',
        exitCode: null,
        signal: null,
        killed: false,
        ...(err.code ? { errno: err.code } : {}),
        message: err.message,
      });
    let fd: number;
    try {
      fd = openSync(path, 'a');
    } catch (err) {
      failed(err as NodeJS.ErrnoException);
      return;
    }
    let killed = false;
    let timer: NodeJS.Timeout | undefined;
    try {
      const child = spawn(req.file, req.args, {
        stdio: ['ignore', fd, fd],
        ...(req.env ? { env: req.env } : {}),
      });
      if (req.timeoutMs) {
        timer = setTimeout(() => {
          killed = true;
          child.kill(req.killSignal ?? 'SIGTERM');
        }, req.timeoutMs);
      }
      child.on('error', (err) => {
        clearTimeout(timer);
        failed(err);
      });
      child.on('close', (code, signal) => {
        clearTimeout(timer);
        resolve({
          id: req.id,
          stdout: '',
          stderr: '',
          exitCode: code,
          signal,
          killed,
          ...(code === 0 ? {} : { message: `${req.file} exited with ${code ?? signal}` }),
        });
      });
    } finally {
      closeSync(fd); // the child holds its own copy
    }
  });
}

/** Serves requests on stdin until it closes (the process's entry point). */
function serve(): void {
  const lines = createInterface({ input: process.stdin, crlfDelay: Number.POSITIVE_INFINITY });
  lines.on('line', (line) => {
    let req: HostExecRequest;
    try {
      req = JSON.parse(line) as HostExecRequest;
    } catch {
      process.stderr.write(`host-exec-helper: ignored a line that is not JSON: ${line.slice(0, 200)}\n`);
      return;
    }
    void runHostRequest(req).then((reply) => process.stdout.write(`${JSON.stringify(reply)}\n`));
  });
  // the agent has gone: no one reads the replies; the commands under way finish on their own
  process.stdout.on('error', () => {});
}

if (process.argv[1] === fileURLToPath(import.meta.url)) serve();
