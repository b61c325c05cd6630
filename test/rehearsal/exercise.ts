/**
 * What the rehearsal does with a deployment once it is up, as a platform team would: the `space`
 * CLI through the load-balancer stand-in (sandboxes on every node VM, a command in each, the
 * latency benchmark with `--target`, a node drained through the control plane), then a version bump applied as the stack applies it while
 * sandboxes stream a counter, checked line by line (nothing lost, nothing repeated), and with
 * several control VMs the one holding the Redis primary powered off while creates go on.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import type { NodeInfo } from '../../runtime/core/types.ts';
import { redisCliIn } from '../netns-lan.ts';
import { run } from './host.ts';

const CLI = fileURLToPath(new URL('../../runtime/cli/space.ts', import.meta.url));

/** Where the deployment answers and with which key. */
export interface Target {
  readonly apiUrl: string;
  readonly apiKey: string;
}

/** The `space` CLI's global flags for `t`, waiting out retryable refusals for `retryForSec`. */
function targetFlags(t: Target, retryForSec: number): string[] {
  return ['--api-url', t.apiUrl, '--api-key', t.apiKey, '--retry-for', String(retryForSec)];
}

/**
 * Runs `space --json <args>` against `t` and parses its stdout; the CLI retries refusals to retry
 * (503, 429) for `retryForSec`. Throws with the CLI's stderr.
 */
export async function space<T>(
  t: Target,
  args: readonly string[],
  timeoutMs = 600_000,
  retryForSec = 300,
): Promise<T> {
  const out = await run(process.execPath, [CLI, '--json', ...targetFlags(t, retryForSec), ...args], {
    timeoutMs,
  });
  return JSON.parse(out) as T;
}

/** The alive nodes the API knows (schedulable or not). */
export async function liveNodes(t: Target): Promise<NodeInfo[]> {
  const { nodes } = await space<{ nodes: NodeInfo[] }>(t, ['nodes']);
  return nodes.filter((n) => n.alive);
}

/** What {@link sandboxesOnEveryNode} found. */
export interface NodeRun {
  readonly node: string;
  readonly sandbox: string;
  /** The command's stdout (`uname -r` and a marker). */
  readonly output: string;
}

/**
 * Creates sandboxes until every one of `nodeCount` nodes holds one (at most `2 × nodeCount + 2`
 * creates: placement spreads, it is not told where), runs a command in one sandbox per node and
 * deletes them all. Throws when a node never got a sandbox or a command's output is wrong.
 */
export async function sandboxesOnEveryNode(
  t: Target,
  nodeCount: number,
  log: (line: string) => void,
): Promise<NodeRun[]> {
  const made: { id: string; nodeId: string | null }[] = [];
  const byNode = new Map<string, string>();
  try {
    for (let i = 0; i < 2 * nodeCount + 2 && byNode.size < nodeCount; i++) {
      const s = await space<{ id: string; nodeId: string | null }>(t, ['sandbox', 'create']);
      made.push(s);
      log(`sandbox ${s.id} on ${s.nodeId ?? '?'}`);
      if (s.nodeId && !byNode.has(s.nodeId)) byNode.set(s.nodeId, s.id);
    }
    if (byNode.size < nodeCount)
      throw new Error(`${made.length} creates reached ${byNode.size} of ${nodeCount} nodes`);
    const runs: NodeRun[] = [];
    for (const [node, sandbox] of byNode) {
      const r = await space<{ stdout: string; exitCode: number }>(t, [
        'exec',
        sandbox,
        '--',
        'sh',
        '-c',
        'uname -r; echo rehearsal-ok',
      ]);
      if (r.exitCode !== 0 || !r.stdout.includes('rehearsal-ok'))
        throw new Error(
          `exec in ${sandbox} on ${node}: exit ${r.exitCode}, stdout ${JSON.stringify(r.stdout)}`,
        );
      runs.push({ node, sandbox, output: r.stdout.trim() });
    }
    return runs;
  } finally {
    for (const s of made) await space(t, ['sandbox', 'rm', s.id]).catch(() => undefined);
  }
}

/** What {@link drainElsewhere} saw. */
export interface DrainRun {
  /** The node drained (`space nodes drain`), then undrained. */
  readonly node: string;
  /** The nodes the creates made while it was drained landed on. */
  readonly placedOn: string[];
}

/**
 * Drains node `node` through the control plane (`space nodes drain`, as before a VM is replaced),
 * makes `creates` sandboxes, deletes them and lifts the drain. Throws when one landed on the drained
 * node (the drain is lifted either way).
 */
export async function drainElsewhere(t: Target, node: string, creates: number): Promise<DrainRun> {
  await space(t, ['nodes', 'drain', node]);
  const made: { id: string; nodeId: string | null }[] = [];
  try {
    for (let i = 0; i < creates; i++) made.push(await space(t, ['sandbox', 'create']));
    const placedOn = made.map((s) => s.nodeId ?? '?');
    if (placedOn.includes(node))
      throw new Error(`a create landed on drained node ${node}: ${placedOn.join(', ')}`);
    return { node, placedOn };
  } finally {
    for (const s of made) await space(t, ['sandbox', 'rm', s.id]).catch(() => undefined);
    await space(t, ['nodes', 'undrain', node]);
  }
}

/** `space bench latency --target` with a small N; returns its JSON document. */
export async function benchLatency(t: Target, n: number): Promise<unknown> {
  return space(
    t,
    [
      'bench',
      'latency',
      '--target',
      t.apiUrl,
      '--n',
      String(n),
      '--concurrency',
      '1',
      '--no-floor',
      '--no-plot',
    ],
    30 * 60_000,
  );
}

/** Path inside a sandbox whose existence ends a {@link streamCounter} command. */
export const STOP_FILE = '/tmp/rehearsal-stop';

/** A command streaming a counter, one line per second, read through `space exec`. */
export interface CounterStream {
  readonly sandbox: string;
  /** Resolves when the client ended, with every stdout line it received. */
  readonly done: Promise<{ lines: string[]; exitCode: number | null; stderr: string }>;
  readonly child: ChildProcess;
}

/**
 * Starts a counter in `sandbox`: `0`, `1`, … one line per second until {@link STOP_FILE} exists,
 * then a last line `end <count>`; read by `space exec` (the CLI as users run it), so reconnects
 * across restarts of the API, router and agent are the CLI's own, waited out for up to
 * `retryForSec` in a row (`--retry-for`: under emulation a router or agent restart took minutes).
 */
export function streamCounter(t: Target, sandbox: string, retryForSec: number): CounterStream {
  const script = `i=0; while [ ! -e ${STOP_FILE} ]; do echo $i; i=$((i+1)); sleep 1; done; echo end $i`;
  const child = spawn(
    process.execPath,
    [CLI, ...targetFlags(t, retryForSec), 'exec', sandbox, '--', 'sh', '-c', script],
    { stdio: ['ignore', 'pipe', 'pipe'] },
  );
  let out = '';
  let err = '';
  child.stdout?.on('data', (d: Buffer) => {
    out += d.toString('utf8');
  });
  child.stderr?.on('data', (d: Buffer) => {
    err += d.toString('utf8');
  });
  const done = new Promise<{ lines: string[]; exitCode: number | null; stderr: string }>((resolve) => {
    child.on('close', (code) =>
      resolve({ lines: out.split('\n').filter((l) => l !== ''), exitCode: code, stderr: err }),
    );
  });
  return { sandbox, done, child };
}

/**
 * Compares a {@link streamCounter}'s received lines with `0 … count-1` (`count` from its `end`
 * line; null when that line never came, itself a loss). `lost`: numbers never received;
 * `repeated`: lines beyond the first of a number, lines out of order, and lines that are not a
 * number of the counter at all.
 */
export function counterDamage(lines: readonly string[]): {
  count: number | null;
  lost: number;
  repeated: number;
} {
  const endLine = lines.at(-1)?.match(/^end (\d+)$/);
  const received = endLine ? lines.slice(0, -1) : lines;
  // without its end line the counter's length is unknown: judge what came, and say so (count null)
  const count = endLine
    ? Number(endLine[1])
    : received.reduce((m, l) => (/^\d+$/.test(l) ? Math.max(m, Number(l) + 1) : m), 0);
  const seen = new Set<number>();
  let repeated = 0;
  let last = -1;
  for (const l of received) {
    const n = /^\d+$/.test(l) ? Number(l) : -1;
    if (n < 0 || n >= count || seen.has(n)) repeated++;
    else {
      seen.add(n);
      // delivered, but after a later line: the stream was replayed or reordered
      if (n < last) repeated++;
    }
    if (n >= 0) last = Math.max(last, n);
  }
  return { count: endLine ? count : null, lost: count - seen.size, repeated };
}

/** A control VM as the failover phase sees it. */
export interface ControlVm {
  readonly name: string;
  /** Private address: Redis on 6379, the API behind the load balancer. */
  readonly address: string;
  /** Pulls its plug (QEMU SIGKILL). */
  powerOff(): Promise<void>;
}

/** What {@link powerOffPrimary} measured; seconds from the power-off unless said. */
export interface FailoverRun {
  /** The control VM that held the Redis primary, powered off. */
  readonly poweredOff: string;
  /** The control VM whose Redis answered `ROLE` as the primary afterwards; null if none did. */
  readonly newPrimary: string | null;
  /** One create through the load balancer just before the power-off (s): a create's own cost here. */
  readonly preFaultCreateS: number;
  /** Until a surviving Redis answered `ROLE` as the primary (Sentinel's failover). */
  readonly newPrimaryS: number | null;
  /** Until the load balancer's health checks took the dead VM's API out of rotation. */
  readonly backendOutS: number | null;
  /** Until the first create through the load balancer succeeded. */
  readonly firstCreateS: number | null;
  /**
   * The measured failover plus a create: the later of `newPrimaryS` and `backendOutS`, plus two
   * `preFaultCreateS` (one attempt that started just before the platform recovered, one after).
   * Null when either was not seen.
   */
  readonly boundS: number | null;
  /** What each create attempt got: `ok`, or the CLI's error code (`CONTROL_PLANE_UNAVAILABLE`, …). */
  readonly attempts: Record<string, number>;
  /** The sandbox made before the power-off ran a command after it. */
  readonly survivorAnswered: boolean;
}

/** `ROLE` of the Redis at `address` (from inside the private network, with the password), or null. */
async function roleOf(namespace: string, address: string, password: string): Promise<string | null> {
  const out = await redisCliIn(namespace, password, address, 6379, 'ROLE');
  return out.split('\n')[0] || null;
}

/**
 * Issue 44's rehearsal: finds the control VM whose Redis is the primary (`ROLE`), makes one sandbox
 * and times it, pulls that VM's plug, then at once: watches the surviving Redis servers for a new
 * primary, the load balancer's rotation for the dead API, and tries a create through the load
 * balancer every 2 s (each attempt with no client-side retry, bounded by 120 s) until one succeeds
 * or `waitMs` passes. Then runs a command in the sandbox made before the fault and deletes what it
 * made. @throws Error when no control VM, or more than one, answers as the primary before the fault.
 */
export async function powerOffPrimary(
  t: Target,
  o: {
    readonly controls: readonly ControlVm[];
    readonly namespace: string;
    readonly redisPassword: string;
    /** The API backends in the load balancer's rotation (`address:port`). */
    readonly inRotation: () => string[];
    readonly apiPort: number;
    readonly waitMs: number;
    readonly log: (line: string) => void;
  },
): Promise<FailoverRun> {
  const roles = await Promise.all(o.controls.map((c) => roleOf(o.namespace, c.address, o.redisPassword)));
  const primaries = o.controls.filter((_, i) => roles[i] === 'master');
  if (primaries.length !== 1)
    throw new Error(`expected one primary among the control VMs, ROLE said: ${roles.join(', ')}`);
  const primary = primaries[0]!;
  const survivors = o.controls.filter((c) => c !== primary);
  const made: string[] = [];
  const c0 = Date.now();
  const survivor = (await space<{ id: string }>(t, ['sandbox', 'create', '--timeout', '3600'])).id;
  made.push(survivor);
  const preFaultCreateS = (Date.now() - c0) / 1000;
  o.log(
    `failover: ${primary.name} holds the primary; a create took ${preFaultCreateS.toFixed(1)} s; powering it off`,
  );
  try {
    const t0 = Date.now();
    const since = () => (Date.now() - t0) / 1000;
    await primary.powerOff();
    const deadline = t0 + o.waitMs;
    const watchPrimary = (async () => {
      while (Date.now() < deadline) {
        for (const c of survivors)
          if ((await roleOf(o.namespace, c.address, o.redisPassword)) === 'master')
            return { name: c.name, s: since() };
        await new Promise((r) => setTimeout(r, 1_000));
      }
      return null;
    })();
    const dead = `${primary.address}:${o.apiPort}`;
    const watchRotation = (async () => {
      while (Date.now() < deadline) {
        if (!o.inRotation().includes(dead)) return since();
        await new Promise((r) => setTimeout(r, 500));
      }
      return null;
    })();
    const attempts: Record<string, number> = {};
    let firstCreateS: number | null = null;
    while (Date.now() < deadline) {
      try {
        made.push((await space<{ id: string }>(t, ['sandbox', 'create'], 120_000, 0)).id);
        attempts['ok'] = (attempts['ok'] ?? 0) + 1;
        firstCreateS = since();
        break;
      } catch (err) {
        const code = /"code":"([A-Z_]+)"/.exec((err as Error).message)?.[1] ?? 'no answer';
        attempts[code] = (attempts[code] ?? 0) + 1;
        await new Promise((r) => setTimeout(r, 2_000));
      }
    }
    // the watchers get until the deadline to see what they wait for, if the create came first
    const [elected, backendOutS] = await Promise.all([watchPrimary, watchRotation]);
    o.log(
      `failover: new primary ${elected ? `${elected.name} after ${elected.s.toFixed(1)} s` : 'not seen'}; dead API out of rotation ${backendOutS === null ? 'not seen' : `after ${backendOutS.toFixed(1)} s`}; first create ${firstCreateS === null ? 'never' : `after ${firstCreateS.toFixed(1)} s`} (${JSON.stringify(attempts)})`,
    );
    const r = await space<{ stdout: string; exitCode: number }>(t, [
      'exec',
      survivor,
      '--',
      'echo',
      'still-here',
    ]).catch(() => null);
    const boundS =
      elected && backendOutS !== null ? Math.max(elected.s, backendOutS) + 2 * preFaultCreateS : null;
    return {
      poweredOff: primary.name,
      newPrimary: elected?.name ?? null,
      preFaultCreateS,
      newPrimaryS: elected?.s ?? null,
      backendOutS,
      firstCreateS,
      boundS,
      attempts,
      survivorAnswered: r?.exitCode === 0 && r.stdout.includes('still-here'),
    };
  } finally {
    for (const id of made) await space(t, ['sandbox', 'rm', id]).catch(() => undefined);
  }
}
