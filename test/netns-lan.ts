/**
 * A private network of network namespaces on a bridge, and `redis-cli` inside them: what the
 * Sentinel int tests of both deployment modes stand their servers on.
 */
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';

const run = promisify(execFile);

/**
 * `redis-cli --raw <args>` in namespace `ns` against `host:port` with `password`: its trimmed
 * stdout, or '' when it fails (a server that is down answers nothing) or takes over 10 s (a host
 * that does not answer at all).
 */
export async function redisCliIn(
  ns: string,
  password: string,
  host: string,
  port: number,
  ...args: string[]
): Promise<string> {
  const { stdout } = await run(
    'ip',
    ['netns', 'exec', ns, 'redis-cli', '-h', host, '-p', String(port), '--raw', ...args],
    { env: { ...process.env, REDISCLI_AUTH: password }, timeout: 10_000, killSignal: 'SIGKILL' },
  ).catch((e: { stdout?: string }) => ({ stdout: e.stdout ?? '' }));
  return stdout.trim();
}

/**
 * Makes namespace `hub` with bridge `br0` and joins each member's namespace to it by a veth
 * (`eth0` inside with `addr`/24, `p<last 7 of ns>` in the hub), loopback up. Each namespace is
 * pushed onto `cleanups` (a deletion) as soon as it exists, so a failure half-way leaves none.
 */
export async function bridgedLan(
  hub: string,
  members: readonly { readonly ns: string; readonly addr: string }[],
  cleanups: (() => Promise<unknown>)[],
): Promise<void> {
  await run('ip', ['netns', 'add', hub]);
  cleanups.push(() => run('ip', ['netns', 'del', hub]));
  await run('ip', ['-n', hub, 'link', 'add', 'br0', 'type', 'bridge']);
  await run('ip', ['-n', hub, 'link', 'set', 'br0', 'up']);
  for (const { ns, addr } of members) {
    await run('ip', ['netns', 'add', ns]);
    cleanups.push(() => run('ip', ['netns', 'del', ns]));
    const peer = `p${ns.slice(-7)}`;
    await run('ip', ['-n', ns, 'link', 'add', 'eth0', 'type', 'veth', 'peer', 'name', peer, 'netns', hub]);
    await run('ip', ['-n', hub, 'link', 'set', peer, 'master', 'br0', 'up']);
    await run('ip', ['-n', ns, 'addr', 'add', `${addr}/24`, 'dev', 'eth0']);
    await run('ip', ['-n', ns, 'link', 'set', 'eth0', 'up']);
    await run('ip', ['-n', ns, 'link', 'set', 'lo', 'up']);
  }
}
