/**
 * A template's start command and ready check, run on an instance the factory booted (factory.ts):
 * the start command goes into the background (its output appended to `START_LOG` inside the
 * sandbox, so it never blocks on a pipe nobody reads), then the ready command runs every
 * `READY_POLL_MS` until it exits 0. A template snapshot is taken from an instance that passed
 * this, so restored instances and warm slots made from it are ready already.
 */
import { SpaceError } from '../../core/errors.ts';
import {
  FRAME_EXIT,
  FRAME_HEADER_BYTES,
  FRAME_STDERR,
  FRAME_STDOUT,
  type ProcessExit,
  type ProcessStartRequest,
} from '../../core/guest-protocol.ts';
import { FrameSplitter } from '../commands/spool.ts';
import type { GuestClient } from '../guest-client.ts';
import { READY_POLL_MS, START_LOG, type TemplateStart } from '../image/templates.ts';

/** Longest single run of the ready command, ms (it is run again until the start's deadline). */
const READY_RUN_MAX_MS = 10_000;
/** Bytes of output kept for an error message. */
const TAIL_BYTES = 2048;

/** How one run of a command in the guest ended, and the tail of what it printed. */
export interface GuestRun {
  exit: ProcessExit;
  /** The last {@link TAIL_BYTES} of stdout and stderr, interleaved as printed (UTF-8). */
  output: string;
}

/**
 * Runs `req` in the guest to its exit, keeping the tail of its output.
 * @throws SpaceError GUEST_UNAVAILABLE (or the guest's own coded error) when it cannot be run.
 */
export async function runInGuest(guest: GuestClient, req: ProcessStartRequest): Promise<GuestRun> {
  const { pid } = await guest.start(req);
  const body = await guest.output(pid, 0);
  const split = new FrameSplitter();
  let tail = Buffer.alloc(0);
  let exit: ProcessExit | undefined;
  for await (const chunk of body) {
    for (const f of split.push(chunk as Buffer)) {
      const payload = f.raw.subarray(FRAME_HEADER_BYTES);
      if (f.type === FRAME_EXIT) exit = JSON.parse(payload.toString('utf8')) as ProcessExit;
      else if (f.type === FRAME_STDOUT || f.type === FRAME_STDERR) {
        tail = Buffer.concat([tail, payload]);
        if (tail.length > TAIL_BYTES) tail = tail.subarray(tail.length - TAIL_BYTES);
      }
    }
    if (exit) break;
  }
  body.destroy();
  if (!exit)
    throw new SpaceError('GUEST_UNAVAILABLE', `the guest's output of process ${pid} ended without its exit`);
  return { exit, output: tail.toString('utf8') };
}

/**
 * Starts `start` on the instance behind `guest` and waits until its ready command exits 0.
 * @throws SpaceError TEMPLATE_START_FAILED when the start command cannot be started or the ready
 *   check does not pass within `start.readyTimeoutMs` (the message has the ready command's last
 *   output and the tail of the start command's log); GUEST_UNAVAILABLE when the guest stops answering.
 *   The caller destroys the instance.
 */
export async function startTemplate(
  guest: GuestClient,
  template: string,
  start: TemplateStart,
  o: { pollMs?: number; now?: () => number } = {},
): Promise<void> {
  const now = o.now ?? Date.now;
  const deadline = now() + start.readyTimeoutMs;
  const failed = (why: string, extra: Record<string, unknown>) =>
    new SpaceError('TEMPLATE_START_FAILED', `template ${template}: ${why}`, { template, ...extra });
  // `exec` keeps the subshell's pid; `&` leaves it running once sh exits (the guest reads the
  // leader's pipes only: nothing holds them, so the command is over at once and the server stays)
  const launched = await runInGuest(guest, {
    cmd: `(${start.cmd}\n) </dev/null >>${START_LOG} 2>&1 &`,
    shell: true,
    user: start.user,
    // no timeoutMs: a timeout reaches every process the command started, the server too
  });
  if (launched.exit.exitCode !== 0) {
    throw failed(
      `the start command could not be started (exit ${launched.exit.exitCode}): ${launched.output}`,
      {
        exit: launched.exit,
      },
    );
  }
  let last: GuestRun | undefined;
  for (;;) {
    const left = deadline - now();
    last = await runInGuest(guest, {
      cmd: start.readyCmd,
      shell: true,
      user: start.user,
      timeoutMs: Math.max(1, Math.min(READY_RUN_MAX_MS, left)),
    });
    if (last.exit.exitCode === 0) return;
    if (now() + (o.pollMs ?? READY_POLL_MS) >= deadline) break;
    await new Promise((r) => setTimeout(r, o.pollMs ?? READY_POLL_MS));
  }
  const log = await startLogTail(guest);
  const how = last.exit.timedOut ? 'timed out' : `exited ${last.exit.exitCode ?? last.exit.signal}`;
  throw failed(
    `not ready after ${start.readyTimeoutMs / 1000} s: the ready check ${how}` +
      `${last.output.trim() ? ` (${last.output.trim()})` : ''}; the start command's log ends: ${log.trim() || '(empty)'}`,
    { readyExit: last.exit, startLog: log },
  );
}

/** The last {@link TAIL_BYTES} of the start command's log ('' when it cannot be read). */
async function startLogTail(guest: GuestClient): Promise<string> {
  try {
    const run = await runInGuest(guest, {
      cmd: `tail -c ${TAIL_BYTES} ${START_LOG}`,
      shell: true,
      user: 'root',
      timeoutMs: 5_000,
    });
    return run.output;
  } catch {
    return '';
  }
}
