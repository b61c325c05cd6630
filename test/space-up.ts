/**
 * `space up` as a child process for whole-CLI tests: free ports, the test's Redis, the caller's
 * environment (SPACE_HOME, network pool, …); resolves once it prints "SPACE is running".
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { once } from 'node:events';
import { join } from 'node:path';
import { freePort } from './redis-server.ts';

/** The `space` entry point. */
export const SPACE = join(import.meta.dirname, '..', 'runtime', 'cli', 'space.ts');

/** A running `space up`. */
export interface SpaceUp {
  proc: ChildProcess;
  routerPort: number;
  /** Everything it printed so far (stdout and stderr). */
  output(): string;
  /** SIGINT (never SIGKILL: the agent must destroy its sandboxes), then waits for the exit. */
  stop(): Promise<void>;
}

/**
 * Starts `space up --redis-url <redisUrl> [...extra]` with `env`.
 * @throws Error with its output when it exits or is not running after 180 s.
 */
export async function startSpaceUp(
  env: NodeJS.ProcessEnv,
  redisUrl: string,
  extra: string[] = [],
): Promise<SpaceUp> {
  const [apiPort, agentPort, routerPort] = [await freePort(), await freePort(), await freePort()];
  const proc = spawn(
    process.execPath,
    [
      SPACE,
      'up',
      '--api-port',
      String(apiPort),
      '--agent-port',
      String(agentPort),
      '--router-port',
      String(routerPort),
      '--redis-url',
      redisUrl,
      ...extra,
    ],
    { env, stdio: ['ignore', 'pipe', 'pipe'] },
  );
  let output = '';
  proc.stdout?.on('data', (d: Buffer) => (output += d.toString()));
  proc.stderr?.on('data', (d: Buffer) => (output += d.toString()));
  const deadline = Date.now() + 180_000;
  while (!output.includes('SPACE is running')) {
    if (proc.exitCode !== null || Date.now() > deadline)
      throw new Error(`space up did not start:\n${output}`);
    await new Promise((r) => setTimeout(r, 200));
  }
  return {
    proc,
    routerPort,
    output: () => output,
    async stop() {
      if (proc.exitCode === null && proc.signalCode === null) {
        proc.kill('SIGINT');
        await once(proc, 'exit');
      }
    },
  };
}
