/**
 * The image smoke's whole-node check (scripts/image-smoke.ts): the API and the agent started from
 * the image, the agent on the **qemu** driver without KVM (TCG), and one real sandbox created
 * through the API and a command run in it. The agent's container starts empty (no cache, no
 * state) and with no apt lists and template builds off, so the sandbox boots only from what the
 * image baked in (`/usr/lib/space`: guest kernel, base template).
 *
 * Everything runs in a network namespace this check makes (`space-smoke-<pid>`), reached from the
 * host over a veth pair of its own (a /30 in 10.253.0.0/16): the agent's nftables table and its
 * sandboxes' namespaces and links stay out of the host's network. Redis runs in it on loopback.
 * Each container gets the capabilities the agent uses (network and namespace administration);
 * it is stopped through a file in the shared volume (its wrapper polls for it), so nothing is
 * left running. Needs root, buildah, iproute2 and redis-server on the host.
 */
import { execFileSync, spawn } from 'node:child_process';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { outputBytes, readEvents, type SseEvent } from '../runtime/cli/sse.ts';

/** Capabilities the agent's container needs (netns, veth/tap, nftables, mounts for `ip netns`, the device nodes a template's /dev holds when copied into a VM's root image). */
const AGENT_CAPS = 'CAP_NET_ADMIN,CAP_SYS_ADMIN,CAP_NET_RAW,CAP_SYS_PTRACE,CAP_DAC_OVERRIDE,CAP_MKNOD';

/** A command started in a working container of `image`, inside netns `ns`, stopped by `stop()`. */
interface Started {
  /** Output so far (stdout and stderr). */
  output(): string;
  /** Writes the stop file and waits for the container to end (at most 30 s, then kills buildah). */
  stop(): Promise<void>;
}

function startInImage(
  image: string,
  isolation: string,
  ns: string,
  shared: string,
  name: string,
  argv: string[],
  env: Record<string, string>,
  caps?: string,
): Started {
  const ctr = execFileSync('buildah', ['from', '--pull=false', image], { encoding: 'utf8' })
    .trim()
    .split('\n')
    .pop()!;
  const stopFile = `stop-${name}`;
  // ends when the command does or when the stop file appears (then TERM, as a node's init would)
  const wrapper = `"$@" & p=$!; while kill -0 $p 2>/dev/null && [ ! -e /shared/${stopFile} ]; do sleep 0.3; done; kill -TERM $p 2>/dev/null; wait $p`;
  const child = spawn(
    'ip',
    [
      'netns',
      'exec',
      ns,
      'buildah',
      'run',
      '--isolation',
      isolation,
      ...(caps ? ['--cap-add', caps] : []),
      ...Object.entries(env).flatMap(([k, v]) => ['--env', `${k}=${v}`]),
      '--volume',
      `${shared}:/shared`,
      ctr,
      '--',
      'timeout',
      '--kill-after=10',
      '600',
      'bash',
      '-c',
      wrapper,
      'bash',
      ...argv,
    ],
    { stdio: ['ignore', 'pipe', 'pipe'] },
  );
  let output = '';
  child.stdout.on('data', (d: Buffer) => (output += d.toString()));
  child.stderr.on('data', (d: Buffer) => (output += d.toString()));
  const closed = new Promise<void>((r) => child.on('close', () => r()));
  return {
    output: () => output,
    async stop() {
      writeFileSync(join(shared, stopFile), '');
      const late = await Promise.race([closed.then(() => false), sleep(30_000).then(() => true)]);
      if (late) child.kill('SIGKILL');
      await closed;
      execFileSync('buildah', ['rm', ctr], { stdio: 'ignore' });
    },
  };
}

/** Waits until `re` matches `s.output()` (at most `seconds`). @throws with the output tail. */
async function waitFor(s: Started, re: RegExp, seconds: number, what: string): Promise<void> {
  for (let i = 0; i < seconds * 4; i++) {
    if (re.test(s.output())) return;
    await sleep(250);
  }
  throw new Error(`${what}: no ${re} in ${seconds} s:\n${s.output().slice(-3000)}`);
}

/**
 * Runs the check; returns undefined when a sandbox booted under qemu from the image ran `echo`
 * and `uname -r` printed the baked guest kernel's release, else the problem (with log tails).
 * `keys` holds `signing.pem` and `verify.pem`.
 */
export async function smokeQemuSandbox(
  image: string,
  isolation: string,
  keys: string,
): Promise<string | undefined> {
  const n = process.pid % 16384;
  const ns = `space-smoke-${process.pid}`;
  const hostIf = `ssm${n}h`;
  const nsIf = `ssm${n}n`;
  const sub = `10.253.${n >> 6}.${(n & 63) * 4}`;
  const parts = sub.split('.').map(Number);
  const hostAddr = `${parts[0]}.${parts[1]}.${parts[2]}.${parts[3]! + 1}`;
  const nsAddr = `${parts[0]}.${parts[1]}.${parts[2]}.${parts[3]! + 2}`;
  const ip = (...args: string[]) => execFileSync('ip', args, { stdio: 'pipe' });
  const started: Started[] = [];
  let redis: ReturnType<typeof spawn> | undefined;
  ip('netns', 'add', ns);
  try {
    ip('link', 'add', hostIf, 'type', 'veth', 'peer', 'name', nsIf);
    ip('link', 'set', nsIf, 'netns', ns);
    ip('addr', 'add', `${hostAddr}/30`, 'dev', hostIf);
    ip('link', 'set', hostIf, 'up');
    ip('-n', ns, 'addr', 'add', `${nsAddr}/30`, 'dev', nsIf);
    ip('-n', ns, 'link', 'set', nsIf, 'up');
    ip('-n', ns, 'link', 'set', 'lo', 'up');
    redis = spawn(
      'ip',
      [
        'netns',
        'exec',
        ns,
        'redis-server',
        '--bind',
        '127.0.0.1',
        '--port',
        '6379',
        '--save',
        '',
        '--appendonly',
        'no',
      ],
      { stdio: 'ignore' },
    );
    const api = startInImage(image, isolation, ns, keys, 'api', ['node', 'runtime/api/server.ts'], {
      SPACE_API_HOST: '0.0.0.0',
      SPACE_API_PORT: '8080',
      SPACE_REDIS_URL: 'redis://127.0.0.1:6379',
      SPACE_SIGNING_KEY_FILE: '/shared/signing.pem',
      SPACE_BOOTSTRAP_API_KEY_FILE: '/shared/api-key',
      SPACE_LOG_LEVEL: 'warn',
    });
    started.push(api);
    const agent = startInImage(
      image,
      isolation,
      ns,
      keys,
      'agent',
      // buildah mounts /proc/sys read-only; the deployments run the agent privileged (podman
      // --privileged, a privileged pod), where it is writable: sysctl in sandbox namespaces
      ['sh', '-c', 'mount -o remount,rw /proc/sys && exec tini -s -- node runtime/agent/server.ts'],
      {
        SPACE_DRIVER: 'qemu',
        SPACE_KVM: 'off',
        SPACE_NODE_ID: 'smoke',
        SPACE_AGENT_HOST: '0.0.0.0',
        SPACE_AGENT_PORT: '8081',
        SPACE_AGENT_URL: `http://${nsAddr}:8081`,
        SPACE_REDIS_URL: 'redis://127.0.0.1:6379',
        SPACE_VERIFY_KEY_FILE: '/shared/verify.pem',
        SPACE_WARM_POOL_SIZE: '0',
        SPACE_BUILD_TEMPLATES: 'off',
        SPACE_AGENT_ON_SHUTDOWN: 'destroy',
        SPACE_NETWORK_POOL: '10.77.0.0/16',
        SPACE_LOG_LEVEL: 'info',
      },
      AGENT_CAPS,
    );
    started.push(agent);
    // before it is ready the agent snapshots the template once: a TCG boot, minutes on a loaded host
    await waitFor(agent, /"templates":\["base"\],"msg":"agent ready"/, 420, 'agent');
    for (let i = 0; i < 120 && !existsSync(join(keys, 'api-key')); i++) await sleep(250);
    const key = readFileSync(join(keys, 'api-key'), 'utf8').trim();
    const apiUrl = `http://${nsAddr}:8080`;
    const call = async (method: string, path: string, body?: unknown) => {
      const res = await fetch(new URL(path, apiUrl), {
        method,
        headers: {
          authorization: `Bearer ${key}`,
          ...(body === undefined ? {} : { 'content-type': 'application/json' }),
        },
        body: body === undefined ? undefined : JSON.stringify(body),
      });
      const text = await res.text();
      return { status: res.status, body: (text ? JSON.parse(text) : {}) as Record<string, unknown> };
    };
    const created = await call('POST', '/v1/sandboxes', { template: 'base' });
    if (created.status !== 202) return `create: ${created.status} ${JSON.stringify(created.body)}`;
    const sandbox = (created.body['sandbox'] as { id: string }).id;
    const operation = (created.body['operation'] as { id: string }).id;
    let state = '';
    let error: unknown;
    // a TCG boot of the guest and its daemon takes tens of seconds on a loaded 2-core host
    for (let i = 0; i < 96 && state !== 'succeeded' && state !== 'failed'; i++) {
      const op = await call('GET', `/v1/operations/${operation}?waitMs=5000`);
      state = String(op.body['state']);
      error = op.body['error'];
    }
    if (state !== 'succeeded')
      return `create ${state || 'unfinished'}: ${JSON.stringify(error)}\nagent:\n${agent.output().slice(-3000)}`;
    const cmd = await call('POST', `/v1/sandboxes/${sandbox}/commands`, {
      cmd: 'sh',
      args: ['-c', 'echo hello-from-qemu; uname -r'],
    });
    if (cmd.status !== 201) return `exec: ${cmd.status} ${JSON.stringify(cmd.body)}`;
    const stream = cmd.body['stream'] as { url: string; token: string };
    // the CLI's reader: the stream up to its exit event
    const events: SseEvent[] = [];
    for await (const e of readEvents({ url: stream.url, token: stream.token })) events.push(e);
    const stdout = events
      .filter((e) => e.event === 'stdout')
      .map((e) => outputBytes(e).toString())
      .join('');
    const exit = events.find((e) => e.event === 'exit');
    await call('DELETE', `/v1/sandboxes/${sandbox}`);
    const kernel = /"dev\.space\.guest-kernel": "linux-image-([^_"]+)_/.exec(
      execFileSync('buildah', ['inspect', image], { encoding: 'utf8' }),
    )?.[1];
    if (!/hello-from-qemu/.test(stdout) || !exit || (kernel && !stdout.includes(kernel)))
      return `command output ${JSON.stringify(stdout)} (exit ${exit?.data}); expected hello-from-qemu and ${kernel}`;
    console.log(`     sandbox ${sandbox} under qemu (TCG): ${stdout.trim().replaceAll('\n', ' | ')}`);
    return undefined;
  } finally {
    for (const s of started.reverse()) await s.stop().catch(() => {});
    redis?.kill();
    try {
      ip('link', 'del', hostIf);
    } catch {}
    ip('netns', 'del', ns);
  }
}
