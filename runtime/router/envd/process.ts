/**
 * envd's `process.Process` service (as the E2B SDK calls it; docs/e2b.md) on SPACE commands.
 *
 * Which command a pid names is asked of the sandbox's agent (`GET …/commands?pid=`), never kept
 * in this process: any router replica serves Start, Connect, SendInput, CloseStdin, SendSignal
 * and List for any command, whichever replica started it.
 *
 * Streams follow the SDK's contract: a `start` event first, then `data`, then exactly one `end`.
 * Connect replays the command's output from its start (SPACE spools it), then follows it live.
 */
import type { MessageInitShape } from '@bufbuild/protobuf';
import { Code, ConnectError, type ConnectRouter, type HandlerContext } from '@connectrpc/connect';
import { createParser } from 'eventsource-parser';
import type { CommandSummary } from '../../core/data-plane.ts';
import { Process, type ProcessEventSchema, type ProcessSelector, Signal } from './gen/process/process_pb.js';
import { ENVD_USERS, envdPath } from './paths.ts';
import { connectErrorOfBody, sandboxPath, type Target, target, type Upstream, userOf } from './upstream.ts';

/** One message of a Start or Connect stream (both carry a single `ProcessEvent`). */
type EventMessage = { event: MessageInitShape<typeof ProcessEventSchema> };

/**
 * The `end` event of a SPACE exit record: exit code (-1 when killed by a signal), `exited`,
 * Go-style `status` text as envd writes it, and `error` for a non-zero end. Pure.
 */
export function endEvent(x: {
  exitCode: number | null;
  signal: string | null;
  error?: string;
}): EventMessage {
  const exitCode = x.exitCode ?? -1;
  const status = x.signal
    ? `signal: ${x.signal.replace(/^SIG/, '').toLowerCase()}`
    : `exit status ${exitCode}`;
  return {
    event: {
      event: {
        case: 'end',
        value: {
          exitCode,
          exited: x.exitCode !== null,
          status,
          ...(exitCode !== 0 ? { error: x.error ?? status } : {}),
        },
      },
    },
  };
}

/** The Process service's handlers over `up`. */
export function processService(up: Upstream) {
  /**
   * The command a selector names (pid or tag), newest first when a pid was reused; `all` also
   * finds ended commands (their spooled output can still be replayed).
   * @throws ConnectError NotFound (the SDK's `kill` then answers false), InvalidArgument.
   */
  async function commandOf(
    t: Target,
    sel: ProcessSelector | undefined,
    all = false,
  ): Promise<CommandSummary> {
    const s = sel?.selector;
    const query =
      s?.case === 'pid'
        ? `pid=${s.value}`
        : s?.case === 'tag'
          ? `tag=${encodeURIComponent(s.value)}`
          : undefined;
    if (!query) throw new ConnectError('process selector (pid or tag) is required', Code.InvalidArgument);
    const out = await up.json<{ commands: CommandSummary[] }>(
      t,
      'GET',
      `${sandboxPath(t)}/commands?${query}${all ? '&all=true' : ''}`,
    );
    const found = out.commands[0];
    if (!found) {
      throw new ConnectError(`process with ${s?.case} ${String(s?.value)} not found`, Code.NotFound);
    }
    return found;
  }

  /**
   * The command's events as envd messages: `start`, its output from the beginning, `end`. A PTY
   * command's output (SPACE stdout) is envd's `pty` data.
   */
  async function* events(t: Target, cmd: { id: string; pid: number; pty?: unknown }, ctx: HandlerContext) {
    yield { event: { event: { case: 'start', value: { pid: cmd.pid } } } } satisfies EventMessage;
    const res = await up.request(
      t,
      'GET',
      `${sandboxPath(t)}/commands/${cmd.id}/events`,
      undefined,
      ctx.signal,
    );
    if (res.statusCode !== 200) throw connectErrorOfBody(res.statusCode, await res.body.text());
    const pending: { event: string; data: string }[] = [];
    const parser = createParser({
      onEvent: (e) => pending.push({ event: e.event ?? 'message', data: e.data }),
    });
    const decoder = new TextDecoder();
    try {
      for await (const chunk of res.body) {
        parser.feed(decoder.decode(chunk as Buffer, { stream: true }));
        for (const e of pending.splice(0)) {
          if (e.event === 'stdout' || e.event === 'stderr') {
            const bytes = Buffer.from((JSON.parse(e.data) as { data: string }).data, 'base64');
            const output = cmd.pty && e.event === 'stdout' ? ('pty' as const) : e.event;
            yield {
              event: { event: { case: 'data', value: { output: { case: output, value: bytes } } } },
            } satisfies EventMessage;
          } else if (e.event === 'exit') {
            const exit = JSON.parse(e.data) as Parameters<typeof endEvent>[0] & { errorCode?: string };
            // the sandbox ended under the command: E2B's edge cuts the stream (the SDK's
            // TimeoutError), it does not report an exit the process never made
            if (exit.errorCode === 'SANDBOX_NOT_RUNNING') {
              throw new ConnectError(
                exit.error ?? 'the sandbox ended while the command ran',
                Code.Unavailable,
              );
            }
            yield endEvent(exit);
            return;
          }
        }
      }
    } finally {
      res.body.destroy();
    }
    throw new ConnectError('the command stream ended without an exit', Code.Unavailable);
  }

  return (router: ConnectRouter) =>
    router.service(Process, {
      async *start(req, ctx) {
        const t = target(ctx);
        const p = req.process;
        if (!p?.cmd) throw new ConnectError('process.cmd is required', Code.InvalidArgument);
        // envd: a PTY without a size is 80×24 (the SDK always sends one)
        const pty = req.pty ? { cols: req.pty.size?.cols || 80, rows: req.pty.size?.rows || 24 } : undefined;
        const user = userOf(ctx);
        const timeoutMs = ctx.timeoutMs();
        const started = await up.json<{ commandId: string; pid: number }>(
          t,
          'POST',
          `${sandboxPath(t)}/commands`,
          {
            cmd: p.cmd,
            args: p.args,
            shell: false,
            env: p.envs,
            ...(p.cwd ? { cwd: envdPath(p.cwd, ENVD_USERS[user]) } : {}),
            user,
            stdin: req.stdin === true,
            ...(req.tag !== undefined ? { tag: req.tag } : {}),
            ...(pty ? { pty } : {}),
            ...(timeoutMs && timeoutMs > 0 ? { timeoutMs } : {}),
          },
        );
        yield* events(t, { id: started.commandId, pid: started.pid, pty }, ctx);
      },
      async *connect(req, ctx) {
        const t = target(ctx);
        const cmd = await commandOf(t, req.process, true);
        yield* events(t, cmd, ctx);
      },
      async list(_req, ctx) {
        const t = target(ctx);
        const out = await up.json<{ commands: CommandSummary[] }>(t, 'GET', `${sandboxPath(t)}/commands`);
        return {
          processes: out.commands.map((c) => ({
            pid: c.pid,
            ...(c.tag !== undefined ? { tag: c.tag } : {}),
            config: { cmd: c.cmd, args: c.args, envs: c.env, ...(c.cwd ? { cwd: c.cwd } : {}) },
          })),
        };
      },
      async sendSignal(req, ctx) {
        const t = target(ctx);
        const cmd = await commandOf(t, req.process);
        const signal = req.signal === Signal.SIGTERM ? 'SIGTERM' : 'SIGKILL';
        await up.json(t, 'POST', `${sandboxPath(t)}/commands/${cmd.id}/signal`, { signal });
        return {};
      },
      async sendInput(req, ctx) {
        const t = target(ctx);
        const cmd = await commandOf(t, req.process);
        const input = req.input?.input;
        if (input?.case !== 'stdin' && input?.case !== 'pty') {
          throw new ConnectError('input must be stdin or pty bytes', Code.InvalidArgument);
        }
        // both reach a PTY process's terminal; a plain process has no terminal to type into
        if (input.case === 'pty' && !cmd.pty) {
          throw new ConnectError('the process has no PTY: send stdin input', Code.InvalidArgument);
        }
        const res = await up.request(t, 'POST', `${sandboxPath(t)}/commands/${cmd.id}/stdin`, {
          raw: Buffer.from(input.value),
        });
        const text = await res.body.text();
        if (res.statusCode >= 400) throw connectErrorOfBody(res.statusCode, text);
        return {};
      },
      async closeStdin(req, ctx) {
        const t = target(ctx);
        const cmd = await commandOf(t, req.process);
        await up.json(t, 'POST', `${sandboxPath(t)}/commands/${cmd.id}/stdin/close`);
        return {};
      },
      async update(req, ctx) {
        const t = target(ctx);
        const cmd = await commandOf(t, req.process);
        const size = req.pty?.size;
        if (!size) return {}; // nothing to change
        await up.json(t, 'POST', `${sandboxPath(t)}/commands/${cmd.id}/resize`, {
          cols: size.cols,
          rows: size.rows,
        });
        return {};
      },
    });
}
