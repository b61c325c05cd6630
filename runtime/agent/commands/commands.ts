/**
 * Commands on the node: starts a process in the guest and pumps its output frames into the
 * command's spool file. Reading from the guest is paced by the spool's writes, so TCP
 * backpressure reaches the guest, which pauses the child's pipes: memory stays bounded end to end.
 * A dropped guest connection is resumed at the exact frame offset already spooled.
 */
import { mkdir, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Logger } from 'pino';
import type { AgentCommandRequest, PtySize } from '../../core/agent-protocol.ts';
import { SpaceError } from '../../core/errors.ts';
import { FRAME_EXIT, type ProcessExit, type ProcessStartRequest } from '../../core/guest-protocol.ts';
import { F } from '../../core/log-fields.ts';
import { inChildSpan } from '../../core/tracing.ts';
import type { GuestClient } from '../guest-client.ts';
import { diskFullError } from '../host/durable-file.ts';
import { encodeFrame, FRAME_TRUNCATED, FrameSplitter, Spool } from './spool.ts';

/** Abort reason that stops spooling without ending the command (agent restart with `keep`). */
export const DETACH = 'detach';

/** Reconnects to a guest output stream before declaring the command lost. */
const MAX_RECONNECTS = 5;

/**
 * What a command was started as, kept with it (and in its record on disk) so it can be listed and
 * found by pid from any router replica: the agent is the one place that knows (E2B `Process.List`,
 * selectors by pid or tag).
 */
export interface CommandConfig {
  cmd: string;
  args: string[];
  env: Record<string, string>;
  cwd?: string;
  tag?: string;
  /** Set when it runs on a pseudo-terminal (its size at start). */
  pty?: PtySize;
}

/** A command the agent started, with its spool. */
export interface Command {
  id: string;
  sandboxId: string;
  pid: number;
  startedAt: number;
  config: CommandConfig;
  spool: Spool;
  /** Set once the exit frame is spooled. */
  exit: ProcessExit | null;
  /** Resolves when the output pump ends. */
  done: Promise<void>;
  /** Stops pumping (sandbox destroyed). */
  abort: AbortController;
}

/** Start options as the agent's internal route receives them. */
export interface StartCommand {
  commandId: string;
  cmd: string;
  args: string[];
  shell: boolean;
  env: Record<string, string>;
  cwd?: string;
  user: 'user' | 'root';
  stdin?: boolean | string;
  timeoutMs?: number;
  tag?: string;
  pty?: PtySize;
}

/** The listed configuration of a start request. Pure. */
export function commandConfig(r: StartCommand): CommandConfig {
  return {
    cmd: r.cmd,
    args: r.args,
    env: r.env,
    ...(r.cwd !== undefined ? { cwd: r.cwd } : {}),
    ...(r.tag !== undefined ? { tag: r.tag } : {}),
    ...(r.pty ? { pty: r.pty } : {}),
  };
}

/**
 * The start options of command `commandId` from a request body shaped like
 * {@link AgentCommandRequest} (the API's dispatch and the data plane's direct start): only the
 * fields a start reads, so extra fields a newer sender adds never reach the guest. Pure.
 */
export function startOptions(commandId: string, b: Omit<AgentCommandRequest, 'commandId'>): StartCommand {
  return {
    commandId,
    cmd: b.cmd,
    args: b.args,
    shell: b.shell,
    env: b.env,
    cwd: b.cwd,
    user: b.user,
    stdin: b.stdin,
    timeoutMs: b.timeoutMs,
    tag: b.tag,
    pty: b.pty,
  };
}

/** Starts a command in the guest and begins spooling its output under `dir`. */
export async function startCommand(o: {
  guest: GuestClient;
  sandboxId: string;
  dir: string;
  req: StartCommand;
  spoolLimitBytes: number;
  log: Logger;
}): Promise<Command> {
  const r = o.req;
  const start: ProcessStartRequest = {
    cmd: r.cmd,
    args: r.args,
    shell: r.shell,
    env: r.env,
    cwd: r.cwd,
    user: r.user,
    // a terminal's input is always open: it is how keys reach it
    stdin: r.pty !== undefined || (r.stdin !== undefined && r.stdin !== false),
    timeoutMs: r.timeoutMs,
    tag: r.commandId,
    ...(r.pty ? { pty: r.pty } : {}),
  };
  // before the guest starts anything: a disk with no room refuses the command (NODE_DISK_FULL)
  const spool = await mkdir(o.dir, { recursive: true })
    .then(() => Spool.open(join(o.dir, `${r.commandId}.out`)))
    .catch((err: unknown) => {
      throw diskFullError(err, 'a command’s output file');
    });
  // the guest daemon's spawn inside the sandbox: under gVisor most of a command's start
  const info = await inChildSpan('agent.guest.spawn', {}, () => o.guest.start(start)).catch(
    async (err: unknown) => {
      await spool.close().catch(() => {});
      await rm(spool.path, { force: true }).catch(() => {});
      throw err;
    },
  );
  if (typeof r.stdin === 'string') {
    // initial stdin then EOF; a process that already exited makes this a no-op
    try {
      if (r.stdin.length > 0) await o.guest.writeStdin(info.pid, Buffer.from(r.stdin));
      await o.guest.closeStdin(info.pid);
    } catch (err) {
      if (!(err instanceof SpaceError && err.code === 'PROCESS_EXITED')) throw err;
    }
  }
  const abort = new AbortController();
  const cmd: Command = {
    id: r.commandId,
    sandboxId: o.sandboxId,
    pid: info.pid,
    startedAt: Date.now(),
    config: commandConfig(r),
    spool,
    exit: null,
    abort,
    done: Promise.resolve(),
  };
  const log = o.log.child({ [F.commandId]: r.commandId, pid: info.pid });
  cmd.done = pump(o.guest, cmd, o.spoolLimitBytes, log);
  return cmd;
}

/**
 * Continues spooling a command after an agent restart, from the guest-stream offset equal to the
 * spool's size (spooled frames are byte-identical to the guest's, until a truncation frame).
 */
export function resumePump(guest: GuestClient, cmd: Command, limit: number, log: Logger): Promise<void> {
  return pump(guest, cmd, limit, log.child({ [F.commandId]: cmd.id, pid: cmd.pid }), cmd.spool.size);
}

/** Whether `err` is the spool's refusal for a full disk (see Spool.append). */
function diskFull(err: unknown): err is SpaceError {
  return err instanceof SpaceError && err.code === 'NODE_DISK_FULL';
}

/**
 * Ends the command's log with `exit`: on disk when there is room, else kept in memory (readers
 * still get it). Never throws.
 */
async function endLog(cmd: Command, exit: ProcessExit, log: Logger): Promise<void> {
  const frame = encodeFrame(FRAME_EXIT, Buffer.from(JSON.stringify(exit)));
  try {
    await cmd.spool.append(frame);
    await cmd.spool.finish();
  } catch (err) {
    log.error({ err }, 'the exit of a command could not be spooled; readers get it from memory');
    await cmd.spool.failWith(frame);
  }
}

/**
 * Copies the command's output from the guest into its spool until its exit frame. Never rejects:
 * a disk with no room for the output (NODE_DISK_FULL) ends the command (its process is killed,
 * so nothing runs unobserved) with an exit that says so; the sandbox and the agent go on.
 */
async function pump(guest: GuestClient, cmd: Command, limit: number, log: Logger, from = 0): Promise<void> {
  const splitter = new FrameSplitter();
  splitter.consumed = from;
  let truncated = false;
  let failures = 0;
  let full: SpaceError | null = null;
  while (!cmd.exit && !cmd.abort.signal.aborted && !full) {
    try {
      const stream = await guest.output(cmd.pid, splitter.consumed, cmd.abort.signal);
      for await (const chunk of stream) {
        for (const f of splitter.push(chunk as Buffer)) {
          if (f.type === FRAME_EXIT) {
            const exit = JSON.parse(f.raw.subarray(5).toString('utf8')) as ProcessExit;
            await cmd.spool.append(f.raw).catch(async (err: unknown) => {
              if (!diskFull(err)) throw err;
              await cmd.spool.failWith(f.raw); // the exit is known: readers get it from memory
            });
            cmd.exit = exit;
            continue;
          }
          if (cmd.spool.size + f.raw.length > limit) {
            if (!truncated) {
              truncated = true;
              log.warn({ limit }, 'command output over the spool limit; dropping the rest');
              await cmd.spool.append(
                encodeFrame(FRAME_TRUNCATED, Buffer.from(JSON.stringify({ droppedAfter: cmd.spool.size }))),
              );
            }
            continue;
          }
          await cmd.spool.append(f.raw);
        }
        failures = 0;
      }
    } catch (err) {
      if (cmd.abort.signal.aborted) break;
      if (diskFull(err)) {
        full = err;
        break;
      }
      failures += 1;
      log.warn({ err, failures }, 'guest output stream broke; resuming');
      if (failures > MAX_RECONNECTS) break;
      await sleep(100 * failures);
    }
  }
  if (cmd.abort.signal.reason === DETACH) {
    // the agent is stopping and leaving the sandbox running: the next agent resumes this spool
    return;
  }
  if (full && !cmd.exit) {
    log.error(
      { err: full, spooled: cmd.spool.size },
      'node disk full: command output cannot be kept; ending it',
    );
    // its output has nowhere to go: the process is ended rather than left running unobserved
    await guest.signal(cmd.pid, 'SIGKILL').catch(() => {});
    cmd.exit = {
      exitCode: null,
      signal: 'SIGKILL',
      timedOut: false,
      errorCode: 'NODE_DISK_FULL',
      error: `the node's disk is full: output after byte ${cmd.spool.size} could not be kept, so the command was killed`,
    };
    await endLog(cmd, cmd.exit, log);
  } else if (!cmd.exit) {
    cmd.exit = {
      exitCode: null,
      signal: 'SIGKILL',
      timedOut: false,
      errorCode: 'SANDBOX_NOT_RUNNING',
      error: 'the sandbox ended or its guest was lost',
    };
    await endLog(cmd, cmd.exit, log);
  } else if (!cmd.spool.closed) {
    await cmd.spool.finish();
  }
  log.info({ exit: cmd.exit }, 'command ended');
}
