/**
 * `space exec <id> -- <cmd> [args…]`: starts a command, streams its stdout/stderr bytes to ours
 * (binary-safe, resuming a dropped stream), optionally pipes our stdin to it, forwards Ctrl-C once,
 * and exits with the command's exit code (signal → 128 + n, timed out → 124).
 */
import { once } from 'node:events';
import type { Command } from 'commander';
import { DataPlane } from './client.ts';
import { apiClient, isJson, retryForMs } from './context.ts';
import {
  CliError,
  type CommandExit,
  collectKeyValue,
  exitCodeOf,
  note,
  onStdoutGone,
  parsePositiveInt,
  printJson,
  usageError,
} from './output.ts';
import { outageNotes, outputBytes, readEvents } from './sse.ts';

interface ExecOptions {
  env?: Record<string, string>;
  cwd?: string;
  root?: boolean;
  timeout?: number;
  interactive?: boolean;
  shell?: boolean;
}

interface StartResponse {
  command: { id: string; sandboxId: string; pid: number };
  stream: { url: string; token: string; expiresAt: string };
}

/** The request body of `POST /v1/sandboxes/:id/commands` for these words and options. Pure. */
export function commandBody(words: string[], o: ExecOptions): Record<string, unknown> {
  if (words.length === 0)
    throw usageError('give the command to run after --, e.g. space exec <id> -- ls -la');
  const body: Record<string, unknown> = o.shell
    ? { cmd: words.join(' '), shell: true }
    : { cmd: words[0], args: words.slice(1) };
  if (o.env && Object.keys(o.env).length) body['env'] = o.env;
  if (o.cwd) body['cwd'] = o.cwd;
  if (o.root) body['user'] = 'root';
  if (o.timeout) body['timeoutMs'] = o.timeout;
  if (o.interactive) body['stdin'] = true;
  return body;
}

/** Writes with backpressure. */
async function write(stream: NodeJS.WriteStream, buf: Buffer): Promise<void> {
  if (!stream.write(buf)) await once(stream, 'drain');
}

/** Pipes our stdin to the command, then closes its stdin at EOF. */
async function pumpStdin(dp: DataPlane, stop: AbortSignal): Promise<void> {
  try {
    for await (const chunk of process.stdin) {
      if (stop.aborted) return;
      await dp.call('POST', '/stdin', { body: chunk as Buffer, signal: stop });
    }
    if (!stop.aborted) await dp.call('POST', '/stdin/close', { signal: stop });
  } catch (err) {
    if (stop.aborted) return;
    if (err instanceof CliError && err.code === 'PROCESS_EXITED') return; // it stopped reading: fine
    note(`space: stdin: ${err instanceof Error ? err.message : String(err)}`);
  }
}

export function registerExec(program: Command): void {
  program
    .command('exec')
    .description('run a command in a sandbox and stream its output; exits with the command’s exit code')
    .argument('<id>', 'sandbox id')
    .argument('<command...>', 'program and arguments, after --')
    .option('-e, --env <K=V>', 'environment variable (repeatable)', collectKeyValue('--env'))
    .option('--cwd <dir>', 'working directory (default: the user’s home)')
    .option('--root', 'run as root instead of the sandbox user')
    .option(
      '--timeout <ms>',
      'kill the command after this many ms (exit code 124)',
      parsePositiveInt('--timeout'),
    )
    .option('-i, --interactive', 'pipe stdin to the command (closed at EOF); without it stdin is closed')
    .option('--shell', 'run the words as one /bin/sh -c script')
    .addHelpText(
      'after',
      `
Output bytes go to stdout/stderr unchanged. Ctrl-C sends SIGINT to the command; a second Ctrl-C exits.
With --json, prints one object at the end: { commandId, exitCode, signal, timedOut, stdout,
stdoutEncoding, stderr, stderrEncoding }: each stream as text ("utf8") when its bytes are valid
UTF-8, else as "base64" — the bytes are always exactly what the command wrote.
Exit status: the command's own; 124 timeout; 128+n killed by signal n; 125 the CLI itself failed
(bad flags, API unreachable, key refused, unknown sandbox).

Examples:
  space exec sbx_123 -- sh -c 'echo hello; exit 3'      # prints hello, exits 3
  space exec sbx_123 --cwd /tmp -e DEBUG=1 -- ls -la
  tar c src | space exec sbx_123 -i -- tar x -C /home/user
  space exec sbx_123 --json -- uname -a`,
    )
    .action(async (id: string, words: string[], o: ExecOptions, cmd: Command) => {
      process.exitCode = await runExec(cmd, id, words, o);
    });
}

async function runExec(cmd: Command, id: string, words: string[], o: ExecOptions): Promise<number> {
  const json = isJson(cmd);
  const api = apiClient(cmd);
  const started = await api.json<StartResponse>('POST', `/v1/sandboxes/${encodeURIComponent(id)}/commands`, {
    body: commandBody(words, o),
  });
  const eventsUrl = started.stream.url;
  const dp = new DataPlane(eventsUrl.replace(/\/events(\?.*)?$/, ''), started.stream.token);

  const stop = new AbortController();
  let interrupts = 0;
  const forward = (signal: 'SIGINT' | 'SIGTERM') => {
    dp.call('POST', '/signal', { body: { signal } }).catch((err: unknown) => {
      if (!(err instanceof CliError && err.code === 'PROCESS_EXITED')) {
        note(`space: could not send ${signal}: ${err instanceof Error ? err.message : String(err)}`);
      }
    });
  };
  const onSigint = () => {
    interrupts++;
    if (interrupts === 1) {
      if (process.stderr.isTTY) note('space: sent SIGINT to the command (Ctrl-C again to exit)');
      forward('SIGINT');
    } else {
      stop.abort();
      process.exit(130);
    }
  };
  const onSigterm = () => forward('SIGTERM');
  process.on('SIGINT', onSigint);
  process.on('SIGTERM', onSigterm);
  // `space exec … | head -1`: the command gets the broken pipe too, as it would locally
  const offPipe = onStdoutGone(() =>
    dp.call('POST', '/signal', { body: { signal: 'SIGPIPE' } }).catch(() => undefined),
  );

  const stdin = o.interactive ? pumpStdin(dp, stop.signal) : Promise.resolve();
  const out: Buffer[] = [];
  const err: Buffer[] = [];
  let exit: CommandExit | null = null;
  const retryFor = retryForMs(cmd);
  try {
    for await (const ev of readEvents({
      url: eventsUrl,
      token: started.stream.token,
      signal: stop.signal,
      // a router or agent restart (an upgrade roll) is waited out as long as API calls are
      retryForMs: retryFor,
      ...outageNotes(note, retryFor),
    })) {
      if (ev.event === 'stdout' || ev.event === 'stderr') {
        const bytes = outputBytes(ev);
        if (json) (ev.event === 'stdout' ? out : err).push(bytes);
        else await write(ev.event === 'stdout' ? process.stdout : process.stderr, bytes);
      } else if (ev.event === 'truncated') {
        note('space: the node dropped further output of this command (its output limit was reached)');
      } else if (ev.event === 'exit') {
        exit = JSON.parse(ev.data) as CommandExit;
      }
    }
  } finally {
    stop.abort();
    process.off('SIGINT', onSigint);
    process.off('SIGTERM', onSigterm);
    if (o.interactive) process.stdin.destroy();
  }
  await stdin;
  // (kept until here: a write that fails on a broken pipe leaves through the loop above, and the
  // CLI then still tells the command)
  offPipe();
  if (!exit) throw new CliError('STREAM_DROPPED', 'the event stream ended without an exit event');
  if (json) {
    printJson({
      commandId: started.command.id,
      exitCode: exit.exitCode,
      signal: exit.signal,
      timedOut: exit.timedOut,
      ...(exit.error ? { error: exit.error } : {}),
      ...exactText('stdout', Buffer.concat(out)),
      ...exactText('stderr', Buffer.concat(err)),
    });
  } else if (exit.timedOut && process.stderr.isTTY) {
    // (a start failure's message already arrived on stderr from the guest)
    note(`space: the command timed out${o.timeout ? ` after ${o.timeout} ms` : ''}`);
  } else if (exit.error && exit.exitCode === null) {
    // the sandbox ended under the command (a crash, a delete): say so, not just 137
    note(`space: ${exit.error} (space sandbox get ${id} says why)`);
  }
  return exitCodeOf(exit);
}

/**
 * `{ <name>: text, <name>Encoding: 'utf8' }` when `bytes` are valid UTF-8 (decoding and encoding
 * again gives the same bytes), else `{ <name>: base64, <name>Encoding: 'base64' }` (R17). Pure.
 */
export function exactText<N extends string>(name: N, bytes: Buffer): Record<N | `${N}Encoding`, string> {
  const text = bytes.toString('utf8');
  const exact = Buffer.from(text, 'utf8').equals(bytes);
  return {
    [name]: exact ? text : bytes.toString('base64'),
    [`${name}Encoding`]: exact ? 'utf8' : 'base64',
  } as Record<N | `${N}Encoding`, string>;
}
