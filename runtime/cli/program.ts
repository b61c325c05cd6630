/**
 * The `space` program: global options, every command, and how a run ends (exit codes, error output).
 * Machine output with `--json` on stdout; errors on stderr as `error CODE: message` (or the JSON
 * error body with `--json`); exit 1 on errors, 2 on usage errors.
 */
import { Command, CommanderError } from 'commander';
import { packageVersion } from '../core/build-version.ts';
import { registerBackup } from './backup.ts';
import { registerBench } from './bench.ts';
import { DEFAULT_RETRY_FOR_SEC } from './context.ts';
import { registerDoctor } from './doctor.ts';
import { registerE2b } from './e2b.ts';
import { registerExec } from './exec.ts';
import { registerFiles } from './files.ts';
import { registerKeys } from './keys.ts';
import { registerOps } from './ops.ts';
import { EXIT_USAGE, parseNonNegativeInt, reportError, runStdoutGone } from './output.ts';
import { registerSandbox } from './sandbox.ts';
import { registerTemplate } from './template.ts';
import { registerUp } from './up.ts';
import { registerUsage } from './usage.ts';

/** True when `--json` is among the options (before any `--`). */
export function wantsJson(argv: string[]): boolean {
  const end = argv.indexOf('--');
  return (end === -1 ? argv : argv.slice(0, end)).includes('--json');
}

/** The program with every command registered (no parsing). */
export function buildProgram(json = false): Command {
  const program = new Command('space');
  program
    .description('SPACE: self-hosted sandboxes for AI agents')
    .version(packageVersion(), '-V, --version', 'print the version')
    .option('--json', 'machine-readable output on stdout (errors as JSON on stderr)')
    .option(
      '--api-url <url>',
      'API endpoint (default: $SPACE_API_URL, $SPACE_HOME/local.json, http://127.0.0.1:8080)',
    )
    .option('--api-key <key>', 'API key (default: $SPACE_API_KEY, then $SPACE_HOME/api-key)')
    .option(
      '--retry-for <sec>',
      `how long API calls wait out retryable refusals such as TEMPLATE_NOT_READY, noting each wait on stderr (default ${DEFAULT_RETRY_FOR_SEC}; 0: never)`,
      parseNonNegativeInt('--retry-for'),
    )
    .exitOverride()
    .configureOutput({
      outputError: (str, write) => {
        if (!json) return write(str);
        const message = str.trim().replace(/^error:\s*/, '');
        write(`${JSON.stringify({ error: { code: 'USAGE', message } })}\n`);
      },
    })
    .showHelpAfterError('(run with --help for usage)')
    .addHelpText(
      'after',
      `
Environment:
  SPACE_HOME      where the local stack keeps keys, logs and Redis data (default ~/.space)
  SPACE_API_URL   API endpoint;  SPACE_API_KEY  API key

Examples:
  space up                                           # local stack in the foreground (root)
  id=$(space sandbox create --template base)
  space exec $id -- sh -c 'echo hello; exit 3'       # prints hello, exits 3
  space files put $id ./script.py /home/user/script.py
  space exec $id -- python3 /home/user/script.py
  space sandbox rm $id
  space teams create other && space keys create --name agent --team other`,
    );
  registerUp(program);
  registerSandbox(program);
  registerExec(program);
  registerFiles(program);
  registerOps(program);
  registerUsage(program);
  registerKeys(program);
  registerE2b(program);
  registerTemplate(program);
  registerDoctor(program);
  registerBench(program);
  registerBackup(program);
  return program;
}

/** Runs the CLI with `argv` (process.argv) and exits the process with its exit code. */
export async function main(argv: string[] = process.argv): Promise<never> {
  const json = wantsJson(argv.slice(2));
  process.stdout.on('error', (err: NodeJS.ErrnoException) => {
    // reader went away, like a shell's SIGPIPE: tell a running command first (exec), then leave
    if (err.code === 'EPIPE') void runStdoutGone().then(() => process.exit(141));
    else throw err;
  });
  let code = 0;
  try {
    await buildProgram(json).parseAsync(argv);
    code = typeof process.exitCode === 'number' ? process.exitCode : 0;
  } catch (err) {
    if (err instanceof CommanderError) {
      code = ['commander.helpDisplayed', 'commander.version'].includes(err.code) ? 0 : EXIT_USAGE;
    } else if ((err as NodeJS.ErrnoException).code === 'EPIPE') {
      await runStdoutGone(); // a write saw the broken pipe first: same as the stdout listener
      code = 141;
    } else {
      code = reportError(err, json);
    }
  }
  // let stdout drain (pipes), then leave even if idle keep-alive sockets remain
  await new Promise<void>((r) => process.stdout.write('', () => r()));
  process.exit(code);
}
