/**
 * A single-node SPACE whose parts are real, separate processes, so faults can be injected for real:
 * redis-server (append-only file, fsync always: a kill -9 loses nothing it acknowledged), the
 * egress gateway, the node agent (gVisor driver, network namespaces) and the API. Each part can be
 * sent any signal (kill -9, SIGSTOP/SIGCONT) and started again with the same settings (ports,
 * state directory, keys). Used by the fault suite (test/faults*.int.test.ts) and the upgrade
 * rehearsal; logs go to `<dir>/<part>.log`. Below the stack: the hooks and API calls every fault
 * file shares (creating a sandbox, waiting for an operation's end, the `fault …` report line).
 */
import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { once } from 'node:events';
import { existsSync, openSync } from 'node:fs';
import { mkdir, mkdtemp, readdir, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { Redis } from 'ioredis';
import { request } from 'undici';
import { expect } from 'vitest';
import { buildTemplate } from '../runtime/agent/image/templates.ts';
import { AGENT_ROUTES, type AgentSandboxSummary } from '../runtime/core/agent-protocol.ts';
import { keys } from '../runtime/core/redis-keys.ts';
import { loadSigningKey, mintDispatchToken, writeNewKeyPair } from '../runtime/core/tokens.ts';
import { freePort } from './redis-server.ts';
import {
  collect,
  type Leftovers,
  leftovers,
  NO_LEFTOVERS,
  readEvents,
  TEST_CACHE_DIR,
  waitFor,
} from './stack.ts';

/** The parts that run as their own process. */
export type Part = 'redis' | 'gateway' | 'agent' | 'api' | 'router';

/** Options of {@link startFaultStack}. */
export interface FaultStackOptions {
  /**
   * The source tree each service process runs from (default: this repository). The upgrade
   * rehearsal starts parts from an earlier release's tree and moves them one by one with
   * {@link FaultStack.setRoot}.
   */
  roots?: Partial<Record<Exclude<Part, 'redis'>, string>>;
  /** Start the router process too (it reads Redis and the verify key). Default false. */
  router?: boolean;
  /** Give the API `SPACE_ROUTER_URL` = the router's URL (an API before the router ignores it). Default false. */
  apiUsesRouter?: boolean;
  /**
   * Small tmpfs file systems mounted at these folders of the agent's state directory before any
   * part starts (e.g. `sandboxes`: a disk that can be filled), unmounted by `stop()`.
   */
  tmpfs?: { under: string; sizeBytes: number }[];
}

const NODE_ID = 'fault-node';
const run = promisify(execFile);
const root = new URL('..', import.meta.url).pathname;

export interface FaultStack {
  dir: string;
  pool: string;
  /** Every instance id the agent made (polled from its state folder), for the leftover check. */
  instanceIds: Set<string>;
  /** What `stop()` found left on the host while the stack's folder still existed. */
  left?: Leftovers;
  nodeId: string;
  apiUrl: string;
  agentUrl: string;
  /** Where the router listens (started with `router: true`, or later with `start('router')`). */
  routerUrl: string;
  /** Runs `part` from the tree at `root` from its next start on. */
  setRoot(part: Exclude<Part, 'redis'>, root: string): void;
  /** Stops a part as a deployment does (SIGTERM, its drain; SIGKILL after 60 s) and waits until it is gone. */
  stopPart(part: Part): Promise<void>;
  apiKey: string;
  /** A client of the stack's Redis (reconnects by itself after a Redis restart). */
  redis: Redis;
  /** Calls the API; returns status and parsed JSON. */
  call<T = Record<string, unknown>>(
    method: string,
    path: string,
    body?: unknown,
  ): Promise<{ status: number; body: T }>;
  /** Sends `signal` to a part's process. */
  signal(part: Part, signal: NodeJS.Signals): void;
  /** Kills a part with SIGKILL and waits until its process is gone. */
  kill(part: Part): Promise<void>;
  /** Starts a part again (after a kill) with its settings; resolves when it serves. */
  start(part: Part): Promise<void>;
  /** Whether the part's process is running. */
  running(part: Part): boolean;
  /** The process of a part (to wait for its exit). */
  proc(part: Part): ChildProcess;
  /** The sandboxes the node agent runs (its own inventory, asked over its internal route). */
  inventory(): Promise<string[]>;
  /** Stops everything (agent with SIGTERM in destroy mode first) and removes the directory. */
  stop(): Promise<void>;
}

/** Starts the stack; `env` overrides API and agent settings. */
export async function startFaultStack(
  env: Record<string, string> = {},
  opts: FaultStackOptions = {},
): Promise<FaultStack> {
  await buildTemplate('base', { cacheDir: TEST_CACHE_DIR });
  const dir = await mkdtemp(join(tmpdir(), 'space-faults-'));
  const mounts: string[] = [];
  for (const m of opts.tmpfs ?? []) {
    const at = join(dir, 'agent', m.under);
    await mkdir(at, { recursive: true });
    await run('mount', ['-t', 'tmpfs', '-o', `size=${m.sizeBytes},mode=0700`, 'space-fault-tmpfs', at]);
    mounts.push(at);
  }
  await writeNewKeyPair(join(dir, 'key.pem'), join(dir, 'key.pub.pem'));
  const pool = `10.${100 + Math.floor(Math.random() * 98)}.0.0/16`;
  const [redisPort, apiPort, agentPort, dnsPort, httpPort, tlsPort, deadDns, routerPort] = await Promise.all(
    Array.from({ length: 8 }, () => freePort()),
  );
  const roots: Record<Exclude<Part, 'redis'>, string> = {
    gateway: root,
    agent: root,
    api: root,
    router: root,
    ...opts.roots,
  };
  const redisUrl = `redis://127.0.0.1:${redisPort}`;
  const common = { SPACE_LOG_LEVEL: process.env.SPACE_TEST_LOG_LEVEL ?? 'info', SPACE_REDIS_URL: redisUrl };
  const gatewayEnv = {
    ...common,
    SPACE_GATEWAY_BIND_HOST: '0.0.0.0',
    SPACE_GATEWAY_DNS_PORT: String(dnsPort),
    SPACE_GATEWAY_HTTP_PORT: String(httpPort),
    SPACE_GATEWAY_TLS_PORT: String(tlsPort),
    SPACE_GATEWAY_CONTROL_SOCKET: join(dir, 'gateway.sock'),
    SPACE_GATEWAY_CA_CERT_FILE: join(dir, 'gateway-ca.crt'),
    SPACE_GATEWAY_CA_KEY_FILE: join(dir, 'gateway-ca.key'),
    // the suite needs no egress: an upstream resolver that is not there
    SPACE_GATEWAY_UPSTREAM_DNS: `127.0.0.1:${deadDns}`,
  };
  const agentEnv = {
    ...common,
    SPACE_VERIFY_KEY_FILE: join(dir, 'key.pub.pem'),
    SPACE_AGENT_PORT: String(agentPort),
    SPACE_NODE_ID: NODE_ID,
    SPACE_AGENT_STATE_DIR: join(dir, 'agent'),
    SPACE_CACHE_DIR: TEST_CACHE_DIR,
    SPACE_NETWORK_POOL: pool,
    SPACE_AGENT_ON_SHUTDOWN: 'destroy',
    SPACE_WARM_POOL_SIZE: '0',
    SPACE_HEARTBEAT_INTERVAL_MS: '1000',
    SPACE_GATEWAY_CONTROL_SOCKET: gatewayEnv.SPACE_GATEWAY_CONTROL_SOCKET,
    SPACE_GATEWAY_DNS_PORT: String(dnsPort),
    SPACE_GATEWAY_HTTP_PORT: String(httpPort),
    SPACE_GATEWAY_TLS_PORT: String(tlsPort),
    SPACE_TRUSTED_CA_FILE: gatewayEnv.SPACE_GATEWAY_CA_CERT_FILE,
    ...env,
  };
  const apiEnv = {
    ...common,
    SPACE_SIGNING_KEY_FILE: join(dir, 'key.pem'),
    SPACE_API_PORT: String(apiPort),
    SPACE_BOOTSTRAP_API_KEY_FILE: join(dir, 'api-key'),
    SPACE_REAPER_INTERVAL_MS: '200',
    ...(opts.apiUsesRouter ? { SPACE_ROUTER_URL: `http://127.0.0.1:${routerPort}` } : {}),
    ...env,
  };
  const routerEnv = {
    ...common,
    SPACE_ROUTER_PORT: String(routerPort),
    SPACE_VERIFY_KEY_FILE: join(dir, 'key.pub.pem'),
  };
  const routerUrl = `http://127.0.0.1:${routerPort}`;
  const apiUrl = `http://127.0.0.1:${apiPort}`;
  const agentUrl = `http://127.0.0.1:${agentPort}`;
  const procs = new Map<Part, ChildProcess>();

  const launch = (part: Part): ChildProcess => {
    const log = openSync(join(dir, `${part}.log`), 'a');
    const child =
      part === 'redis'
        ? spawn(
            'redis-server',
            [
              '--port',
              String(redisPort),
              '--bind',
              '127.0.0.1',
              '--save',
              '',
              '--appendonly',
              'yes',
              '--appendfsync',
              'always',
              '--dir',
              dir,
            ],
            { stdio: ['ignore', log, log] },
          )
        : spawn(process.execPath, [join(roots[part], `runtime/${part}/server.ts`)], {
            env: {
              ...process.env,
              ...(part === 'gateway'
                ? gatewayEnv
                : part === 'agent'
                  ? agentEnv
                  : part === 'router'
                    ? routerEnv
                    : apiEnv),
            },
            stdio: ['ignore', log, log],
          });
    procs.set(part, child);
    return child;
  };

  const healthy = async (url: string) => {
    try {
      const res = await request(url, { headersTimeout: 1000, bodyTimeout: 1000 });
      await res.body.dump();
      return res.statusCode === 200 ? true : undefined;
    } catch {
      return undefined;
    }
  };

  const start = async (part: Part) => {
    const child = launch(part);
    const exited = once(child, 'exit').then(([code]) => {
      throw new Error(`${part} exited with ${code} while starting (see ${dir}/${part}.log)`);
    });
    exited.catch(() => {});
    const ready = (async () => {
      if (part === 'redis') {
        const probe = new Redis(redisUrl, { lazyConnect: true, retryStrategy: () => null });
        probe.on('error', () => {});
        await waitFor(
          'redis',
          () =>
            probe.connect().then(
              () => true,
              () => undefined,
            ),
          30_000,
        );
        probe.disconnect();
      } else if (part === 'gateway') {
        await waitFor(
          'the gateway socket',
          async () => (existsSync(gatewayEnv.SPACE_GATEWAY_CONTROL_SOCKET) ? true : undefined),
          60_000,
        );
      } else if (part === 'agent') {
        await waitFor('the agent', () => healthy(`${agentUrl}/healthz`), 180_000);
      } else if (part === 'router') {
        await waitFor('the router', () => healthy(`${routerUrl}/healthz`), 30_000);
      } else {
        await waitFor('the api', () => healthy(`${apiUrl}/healthz`), 60_000);
      }
    })();
    await Promise.race([ready, exited]);
  };

  await start('redis');
  await start('gateway');
  await start('agent');
  await start('api');
  if (opts.router) await start('router');
  const apiKey = (await readFile(join(dir, 'api-key'), 'utf8')).trim();
  const redis = new Redis(redisUrl, { maxRetriesPerRequest: 1 });
  redis.on('error', () => {}); // Redis restarts are part of the suite; commands fail and are retried
  const signingKey = await loadSigningKey(join(dir, 'key.pem'));
  const instanceIds = new Set<string>();
  const noteInstances = async () => {
    const instancesDir = join(dir, 'agent', 'driver', 'instances');
    for (const i of await readdir(instancesDir).catch(() => [] as string[])) instanceIds.add(i);
  };
  // instances live for seconds at least: a 200 ms poll sees every one the agent makes
  const poller = setInterval(() => void noteInstances(), 200);
  poller.unref();

  const stack: FaultStack = {
    dir,
    pool,
    instanceIds,
    nodeId: NODE_ID,
    apiUrl,
    agentUrl,
    routerUrl,
    apiKey,
    redis,
    setRoot(part, at) {
      roots[part] = at;
    },
    async stopPart(part) {
      const child = procs.get(part);
      if (!child || child.exitCode !== null || child.signalCode !== null) return;
      const gone = once(child, 'exit');
      child.kill('SIGTERM');
      const t = setTimeout(() => child.kill('SIGKILL'), 60_000);
      await gone;
      clearTimeout(t);
      if (part === 'gateway') await rm(gatewayEnv.SPACE_GATEWAY_CONTROL_SOCKET, { force: true });
    },
    async call(method, path, body) {
      const res = await request(new URL(path, apiUrl), {
        method: method as 'GET',
        headers: {
          authorization: `Bearer ${apiKey}`,
          ...(body === undefined ? {} : { 'content-type': 'application/json' }),
        },
        body: body === undefined ? undefined : JSON.stringify(body),
      });
      const text = await res.body.text();
      return { status: res.statusCode, body: (text ? JSON.parse(text) : {}) as never };
    },
    signal(part, signal) {
      procs.get(part)?.kill(signal);
    },
    async kill(part) {
      const child = procs.get(part);
      if (!child || child.exitCode !== null || child.signalCode !== null) return;
      const gone = once(child, 'exit');
      child.kill('SIGKILL');
      await gone;
      if (part === 'gateway') await rm(gatewayEnv.SPACE_GATEWAY_CONTROL_SOCKET, { force: true });
    },
    start,
    running(part) {
      const child = procs.get(part);
      return !!child && child.exitCode === null && child.signalCode === null;
    },
    proc(part) {
      const child = procs.get(part);
      if (!child) throw new Error(`${part} never started`);
      return child;
    },
    async inventory() {
      const token = await mintDispatchToken(signingKey, NODE_ID);
      const res = await request(new URL(AGENT_ROUTES.sandboxes, agentUrl), {
        headers: { authorization: `Bearer ${token}` },
        headersTimeout: 5000,
        bodyTimeout: 5000,
      });
      const body = (await res.body.json()) as { sandboxes: AgentSandboxSummary[] };
      return body.sandboxes.map((s) => s.id).sort();
    },
    async stop() {
      await noteInstances();
      clearInterval(poller);
      redis.disconnect();
      for (const part of ['router', 'api', 'agent', 'gateway', 'redis'] as const) {
        const child = procs.get(part);
        if (!child || child.exitCode !== null || child.signalCode !== null) continue;
        child.kill('SIGCONT');
        const gone = once(child, 'exit');
        child.kill('SIGTERM');
        const t = setTimeout(() => child.kill('SIGKILL'), 60_000);
        await gone;
        clearTimeout(t);
      }
      for (const m of mounts) await run('umount', [m]).catch(() => run('umount', ['-l', m]));
      // before the folder goes: mounts and processes are found by its path
      stack.left = await leftovers(stack);
      if (!process.env.SPACE_TEST_KEEP_LOGS) await rm(dir, { recursive: true, force: true });
    },
  };
  return stack;
}

/**
 * The node, the records and the reservations agree: the agent runs exactly the sandboxes the
 * control plane records as live on the node, and the node's reservations count exactly those.
 * Returns the three views (sorted ids and the reservation count) for an equality assertion.
 */
export async function views(
  s: FaultStack,
): Promise<{ node: string[]; records: string[]; reserved: string[]; count: number }> {
  const placed = (await s.redis.smembers(keys.nodeSandboxes(s.nodeId))).sort();
  const records: string[] = [];
  for (const id of await s.redis.zrange(keys.sandboxIndex(), 0, -1)) {
    const [state, nodeId] = await s.redis.hmget(keys.sandbox(id), 'state', 'nodeId');
    if (nodeId === s.nodeId && state && state !== 'killed' && state !== 'killing' && state !== 'creating')
      records.push(id);
  }
  return {
    node: await s.inventory(),
    records: records.sort(),
    reserved: placed,
    count: Number((await s.redis.hget(keys.node(s.nodeId), 'sandboxes')) ?? 0),
  };
}

/** Waits until node, records and reservations agree (see {@link views}); returns the agreed ids. */
export async function converged(s: FaultStack, timeoutMs = 60_000): Promise<string[]> {
  let last: Awaited<ReturnType<typeof views>> | null = null;
  try {
    return await waitFor(
      'node, records and reservations to agree',
      async () => {
        last = await views(s).catch(() => null);
        if (!last) return undefined;
        const same =
          JSON.stringify(last.node) === JSON.stringify(last.records) &&
          JSON.stringify(last.records) === JSON.stringify(last.reserved) &&
          last.count === last.records.length;
        return same ? last.records : undefined;
      },
      timeoutMs,
    );
  } catch (err) {
    throw new Error(`${(err as Error).message}: ${JSON.stringify(last)}`);
  }
}

/** An operation as the API shows it. */
export type Op = { id: string; state: string; error: { code: string; message: string } | null };

/** Logs a `fault <case> {…}` line: what recovery took and what clients saw (docs/operations.md's fault table). */
export function report(fault: string, fields: Record<string, unknown>): void {
  console.log(`fault ${fault} ${JSON.stringify(fields)}`);
}

/** How {@link finished} waits. */
export interface FinishOptions {
  /** Long polls (5 s each) before it gives up. Default 60. */
  polls?: number;
  /** Retry a failed call after 500 ms (the API is down for a restart) rather than throw. Default false. */
  tolerant?: boolean;
}

/** Waits until operation `opId` ended (succeeded or failed); returns it. */
export async function finished(s: FaultStack, opId: string, opts: FinishOptions = {}): Promise<Op> {
  const { polls = 60, tolerant = false } = opts;
  for (let i = 0; i < polls; i++) {
    const poll = s.call<Op>('GET', `/v1/operations/${opId}?waitMs=5000`);
    const op = await (tolerant ? poll.catch(() => null) : poll);
    if (op?.body.state === 'succeeded' || op?.body.state === 'failed') return op.body;
    if (!op) await new Promise((r) => setTimeout(r, 500));
  }
  throw new Error(`operation ${opId} did not end`);
}

/**
 * Waits (60 s at most) until the node counts as alive (and, with `schedulable`, takes new
 * sandboxes): a case may start right after one that stalled the agent or filled its disk.
 */
export async function nodeAlive(s: FaultStack, schedulable = false): Promise<void> {
  await waitFor(
    schedulable ? 'the node to count as alive and schedulable' : 'the node to count as alive',
    async () => {
      const [alive, sched] = await Promise.all([
        s.redis.exists(keys.nodeAlive(s.nodeId)),
        schedulable ? s.redis.hget(keys.node(s.nodeId), 'schedulable') : null,
      ]);
      return alive === 1 && (!schedulable || sched === '1') ? true : undefined;
    },
    60_000,
  );
}

/**
 * Creates a `base` sandbox (0.5 vCPU, 128 MiB) once the node counts as alive ({@link nodeAlive})
 * and waits for its create to end; returns its id, throws unless the create succeeded.
 */
export async function createSandbox(
  s: FaultStack,
  opts: FinishOptions & { schedulable?: boolean } = {},
): Promise<string> {
  // else the API refuses the create for its node (TEMPLATE_NOT_READY, seen on a loaded CI host)
  await nodeAlive(s, opts.schedulable);
  const res = await s.call<{ sandbox: { id: string }; operation: { id: string } }>('POST', '/v1/sandboxes', {
    template: 'base',
    vcpus: 0.5,
    memoryMiB: 128,
  });
  if (res.status !== 202) throw new Error(`create: ${res.status} ${JSON.stringify(res.body)}`);
  const op = await finished(s, res.body.operation.id, opts);
  if (op.state !== 'succeeded') throw new Error(`create failed: ${JSON.stringify(op.error)}`);
  return res.body.sandbox.id;
}

/** What {@link runCommand} saw. */
export interface CommandRun {
  /** The start's HTTP status (201: started). */
  status: number;
  /** The error code of a refused start. */
  code?: string;
  /** Its stdout, read to the exit ('' when it did not start). */
  stdout: string;
  /** Its exit code (null when it did not start, or a signal ended it). */
  exitCode: number | null;
}

/**
 * Starts `cmd args` in sandbox `id` and reads its stream to the exit (10 s at most). A refused
 * start is returned (status and code), not thrown; a stream that fails or ends without its exit
 * throws.
 */
export async function runCommand(
  s: FaultStack,
  id: string,
  cmd: string,
  args: string[] = [],
): Promise<CommandRun> {
  const res = await s.call<{ stream: { url: string; token: string }; error?: { code: string } }>(
    'POST',
    `/v1/sandboxes/${id}/commands`,
    { cmd, args },
  );
  if (res.status !== 201)
    return { status: res.status, code: res.body.error?.code, stdout: '', exitCode: null };
  const { stream } = res.body;
  const r = collect(await readEvents(stream.url, stream.token, { signal: AbortSignal.timeout(10_000) }));
  return { status: res.status, stdout: r.stdout.toString(), exitCode: r.exit.exitCode };
}

/** A sandbox's record as the API shows it (its state and why it ended). */
export async function sandboxRecord(s: FaultStack, id: string) {
  return (await s.call<{ state: string; killReason: string | null }>('GET', `/v1/sandboxes/${id}`)).body;
}

/**
 * For `afterEach`: a failed case must not leave a part stopped (SIGSTOP) or dead for the next one;
 * continues the agent and starts every part that does not run. `s` undefined: the stack never started.
 */
export async function restartParts(s: FaultStack | undefined): Promise<void> {
  s?.signal('agent', 'SIGCONT');
  for (const part of ['redis', 'gateway', 'agent', 'api'] as const) {
    if (s && !s.running(part)) await s.start(part);
  }
}

/**
 * For `afterAll`: stops the stack (undefined: it never started) and expects it left nothing on the
 * host. The agent is continued first: the API's drain must not wait on an agent a failed case stopped.
 */
export async function stopFaultStack(s: FaultStack | undefined): Promise<void> {
  if (!s) return;
  s.signal('agent', 'SIGCONT');
  await s.stop();
  expect(await leftovers(s)).toEqual(NO_LEFTOVERS);
}
