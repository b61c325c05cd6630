/**
 * A whole single-node SPACE in the test process: real Redis (from global setup), the API and a
 * node agent with the real gVisor driver, network namespaces and nftables. Used by the int tests.
 */
import { execFile } from 'node:child_process';
import { mkdtemp, readdir, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { createParser } from 'eventsource-parser';
import { Redis } from 'ioredis';
import type { Logger } from 'pino';
import { request } from 'undici';
import { expect, inject } from 'vitest';
import { loadAgentConfig } from '../runtime/agent/config.ts';
import { NFT_TABLE } from '../runtime/agent/host/firewall.ts';
import { networkNames } from '../runtime/agent/host/network.ts';
import { DEFAULT_IMAGE_ASSETS_DIR, guestKernelDir } from '../runtime/agent/image/assets.ts';
import { ensureGuestKernel } from '../runtime/agent/image/guest-kernel.ts';
import { buildTemplate } from '../runtime/agent/image/templates.ts';
import { type RunningAgent, startAgent } from '../runtime/agent/service.ts';
import { loadApiConfig } from '../runtime/api/config.ts';
import { type RunningApi, startApi } from '../runtime/api/service.ts';
import { writeNewKeyPair } from '../runtime/core/tokens.ts';
import { loadGatewayConfig } from '../runtime/gateway/config.ts';
import { type RunningGateway, startGateway } from '../runtime/gateway/service.ts';
import { TEST_CACHE_DIR } from './cache-dir.ts';
import { freePort } from './redis-server.ts';

const run = promisify(execFile);

export { TEST_CACHE_DIR };

/** The API as one key sees it: calls, creates, commands and tokens made with that key. */
export interface StackClient {
  apiKey: string;
  /** Calls the API; returns status and parsed JSON. */
  call<T = Record<string, unknown>>(
    method: string,
    path: string,
    body?: unknown,
    headers?: Record<string, string>,
  ): Promise<{ status: number; body: T }>;
  /** Creates a sandbox and waits until it runs; returns its id. */
  createSandbox(body?: Record<string, unknown>): Promise<string>;
  /** Runs a command to completion via the data plane. */
  exec(id: string, body: Record<string, unknown>): Promise<ExecResult>;
  /** Session token + data-plane base URL for a sandbox. */
  token(id: string, scopes?: string[]): Promise<{ url: string; token: string }>;
}

export interface Stack extends StackClient {
  apiUrl: string;
  /** The bootstrap key: an admin of the default team (every scope). */
  apiKey: string;
  /** The same calls made with another API key (another team's, or one with fewer scopes). */
  as(apiKey: string): StackClient;
  redisUrl: string;
  /** This stack's sandbox address pool (a /16 of its own, so concurrent test runs don't collide). */
  pool: string;
  api: RunningApi;
  agent: RunningAgent;
  /** The node's egress gateway, when the stack was started with one. */
  gateway: RunningGateway | null;
  /** Stops the gateway and starts it again with the same config (ports, socket, CA); throws without one. */
  restartGateway(): Promise<void>;
  redis: Redis;
  dir: string;
  /** Every instance id the agent made while the stack ran (its instance folders, polled). */
  instanceIds: Set<string>;
  /**
   * Stops the services, then looks for leftovers ({@link leftovers}) while the stack's folder still
   * exists, then removes the folder. What was found is kept in `left`.
   */
  stop(): Promise<void>;
  /** What {@link Stack.stop} found left behind (undefined before it ran). */
  left?: Leftovers;
}

export interface ExecResult {
  commandId: string;
  stdout: Buffer;
  stderr: Buffer;
  exit: {
    exitCode: number | null;
    signal: string | null;
    timedOut: boolean;
    error?: string;
    oomKilled?: boolean;
  };
  events: number;
}

/** Reads an SSE stream to its end; returns the events (name, id, data). */
export async function readEvents(
  url: string,
  token: string,
  opts: {
    lastEventId?: string;
    stopAfter?: number;
    signal?: AbortSignal;
    headers?: Record<string, string>;
  } = {},
): Promise<{ event: string; id: string; data: string }[]> {
  const res = await request(url, {
    headers: {
      ...opts.headers,
      authorization: `Bearer ${token}`,
      ...(opts.lastEventId ? { 'last-event-id': opts.lastEventId } : {}),
    },
    signal: opts.signal,
  });
  if (res.statusCode !== 200) throw new Error(`events: HTTP ${res.statusCode} ${await res.body.text()}`);
  const events: { event: string; id: string; data: string }[] = [];
  const parser = createParser({
    onEvent: (e) => events.push({ event: e.event ?? 'message', id: e.id ?? '', data: e.data }),
  });
  const decoder = new TextDecoder();
  for await (const chunk of res.body) {
    parser.feed(decoder.decode(chunk as Buffer, { stream: true }));
    if (opts.stopAfter !== undefined && events.length >= opts.stopAfter) {
      res.body.destroy();
      break;
    }
  }
  // one chunk can carry several events: a reader that asked for N gets N (a loaded host batches more)
  return opts.stopAfter === undefined ? events : events.slice(0, opts.stopAfter);
}

/** Folds SSE events into stdout/stderr bytes and the exit. */
export function collect(events: { event: string; data: string }[]): Omit<ExecResult, 'commandId'> {
  const out: Buffer[] = [];
  const err: Buffer[] = [];
  let exit: ExecResult['exit'] | null = null;
  for (const e of events) {
    if (e.event === 'stdout') out.push(Buffer.from((JSON.parse(e.data) as { data: string }).data, 'base64'));
    else if (e.event === 'stderr')
      err.push(Buffer.from((JSON.parse(e.data) as { data: string }).data, 'base64'));
    else if (e.event === 'exit') exit = JSON.parse(e.data) as ExecResult['exit'];
  }
  if (!exit) throw new Error('stream ended without an exit event');
  return { stdout: Buffer.concat(out), stderr: Buffer.concat(err), exit, events: events.length };
}

/** Gateway settings for a stack with egress (the attack suite): its upstream resolver and deny set. */
export interface StackGateway {
  /** `ip:port` of the DNS server the gateway asks. */
  upstreamDns: string;
  /** Comma list of CIDRs the gateway never connects to (the test's upstream subnet stays off it). */
  denyCidrs: string;
  /** Extra CA the gateway trusts upstream (the test upstream's CA). */
  upstreamCaFile?: string;
  /** Ports the gateway dials upstream (tests use unprivileged ones). */
  upstreamHttpPort?: number;
  upstreamTlsPort?: number;
  /** Logger of the gateway (e.g. to collect its `egress allow|deny` audit lines); default per SPACE_LOG_LEVEL. */
  log?: Logger;
  /** Further `SPACE_GATEWAY_*` settings (limits, timeouts). */
  env?: Record<string, string>;
}

/** The stack's API as key `apiKey` sees it. */
export function clientOf(apiUrl: string, apiKey: string): StackClient {
  const call: StackClient['call'] = async (method, path, body, headers = {}) => {
    const res = await request(new URL(path, apiUrl), {
      method: method as 'GET',
      headers: {
        authorization: `Bearer ${apiKey}`,
        ...(body === undefined ? {} : { 'content-type': 'application/json' }),
        ...headers,
      },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await res.body.text();
    return { status: res.statusCode, body: (text ? JSON.parse(text) : {}) as never };
  };
  return {
    apiKey,
    call,
    async createSandbox(body = {}) {
      const res = await call<{ sandbox: { id: string }; operation: { id: string } }>(
        'POST',
        '/v1/sandboxes',
        {
          template: 'base',
          ...body,
        },
      );
      if (res.status !== 202) throw new Error(`create: ${res.status} ${JSON.stringify(res.body)}`);
      for (let i = 0; i < 120; i++) {
        const op = await call<{ state: string; error: unknown }>(
          'GET',
          `/v1/operations/${res.body.operation.id}?waitMs=5000`,
        );
        if (op.body.state === 'succeeded') return res.body.sandbox.id;
        if (op.body.state === 'failed') throw new Error(`create failed: ${JSON.stringify(op.body.error)}`);
      }
      throw new Error('create did not finish');
    },
    async exec(id, body) {
      const res = await call<{ command: { id: string }; stream: { url: string; token: string } }>(
        'POST',
        `/v1/sandboxes/${id}/commands`,
        body,
      );
      if (res.status !== 201) throw new Error(`exec: ${res.status} ${JSON.stringify(res.body)}`);
      const events = await readEvents(res.body.stream.url, res.body.stream.token);
      return { commandId: res.body.command.id, ...collect(events) };
    },
    async token(id, scopes = ['commands', 'files']) {
      const res = await call<{ url: string; token: string }>('POST', `/v1/sandboxes/${id}/tokens`, {
        scopes,
      });
      if (res.status !== 201) throw new Error(`token: ${res.status} ${JSON.stringify(res.body)}`);
      return res.body;
    },
  };
}

/**
 * Starts the stack. `env` overrides agent/API settings (e.g. SPACE_WARM_POOL_SIZE); with `gateway`,
 * the node also runs an egress gateway and its sandboxes' DNS/80/443 go through it.
 */
export async function startStack(env: Record<string, string> = {}, gw?: StackGateway): Promise<Stack> {
  await buildTemplate('base', { cacheDir: TEST_CACHE_DIR });
  // a VM driver boots the guest kernel the image bakes; a test host prepares it once (apt)
  if (env['SPACE_DRIVER'] && env['SPACE_DRIVER'] !== 'gvisor')
    await ensureGuestKernel(guestKernelDir(DEFAULT_IMAGE_ASSETS_DIR), TEST_CACHE_DIR);
  const dir = await mkdtemp(join(tmpdir(), 'space-stack-'));
  const redisUrl = inject('redisUrl');
  const redis = new Redis(redisUrl);
  await redis.flushall();
  await writeNewKeyPair(join(dir, 'key.pem'), join(dir, 'key.pub.pem'));
  // 10.100–10.197: 10.198/16 and 10.199/16 hold the test upstreams of the attack suite and the gateway test
  const pool = process.env.SPACE_TEST_POOL ?? `10.${100 + Math.floor(Math.random() * 98)}.0.0/16`;
  const base: Record<string, string> = {
    SPACE_REDIS_URL: redisUrl,
    SPACE_LOG_LEVEL: process.env.SPACE_TEST_LOG_LEVEL ?? 'silent',
    SPACE_SIGNING_KEY_FILE: join(dir, 'key.pem'),
    SPACE_VERIFY_KEY_FILE: join(dir, 'key.pub.pem'),
    SPACE_API_PORT: '0',
    SPACE_AGENT_PORT: '0',
    SPACE_NODE_ID: 'test-node',
    SPACE_AGENT_STATE_DIR: join(dir, 'agent'),
    SPACE_CACHE_DIR: TEST_CACHE_DIR,
    SPACE_NETWORK_POOL: pool,
    SPACE_AGENT_ON_SHUTDOWN: 'destroy',
    SPACE_WARM_POOL_SIZE: '0',
    SPACE_HEARTBEAT_INTERVAL_MS: '1000',
    // sandboxes of long tests must not pause themselves under the test: tests of auto-pause ask for it
    SPACE_DEFAULT_AUTO_PAUSE_SEC: '0',
    ...env,
  };
  let gateway: RunningGateway | null = null;
  let restart: (() => Promise<RunningGateway>) | null = null;
  if (gw) {
    const ports = [await freePort(), await freePort(), await freePort()];
    const gwConfig = loadGatewayConfig({
      SPACE_LOG_LEVEL: base.SPACE_LOG_LEVEL,
      SPACE_REDIS_URL: redisUrl,
      SPACE_GATEWAY_BIND_HOST: '0.0.0.0',
      SPACE_GATEWAY_DNS_PORT: String(ports[0]),
      SPACE_GATEWAY_HTTP_PORT: String(ports[1]),
      SPACE_GATEWAY_TLS_PORT: String(ports[2]),
      SPACE_GATEWAY_CONTROL_SOCKET: join(dir, 'gateway.sock'),
      SPACE_GATEWAY_CA_CERT_FILE: join(dir, 'gateway-ca.crt'),
      SPACE_GATEWAY_CA_KEY_FILE: join(dir, 'gateway-ca.key'),
      SPACE_GATEWAY_UPSTREAM_DNS: gw.upstreamDns,
      SPACE_GATEWAY_DENY_CIDRS: gw.denyCidrs,
      ...(gw.upstreamCaFile ? { SPACE_GATEWAY_UPSTREAM_CA_FILE: gw.upstreamCaFile } : {}),
      ...(gw.upstreamHttpPort ? { SPACE_GATEWAY_UPSTREAM_HTTP_PORT: String(gw.upstreamHttpPort) } : {}),
      ...(gw.upstreamTlsPort ? { SPACE_GATEWAY_UPSTREAM_TLS_PORT: String(gw.upstreamTlsPort) } : {}),
      ...gw.env,
    });
    restart = () => startGateway(gwConfig, gw.log ? { log: gw.log } : {});
    gateway = await restart();
    Object.assign(base, {
      SPACE_GATEWAY_CONTROL_SOCKET: gateway.controlSocket,
      SPACE_GATEWAY_DNS_PORT: String(gateway.dnsPort),
      SPACE_GATEWAY_HTTP_PORT: String(gateway.httpPort),
      SPACE_GATEWAY_TLS_PORT: String(gateway.tlsPort),
      SPACE_TRUSTED_CA_FILE: join(dir, 'gateway-ca.crt'),
    });
  }
  const agent = await startAgent(loadAgentConfig(base));
  const instanceIds = new Set<string>();
  const instancesDir = join(dir, 'agent', 'driver', 'instances');
  const noteInstances = async () => {
    for (const i of await readdir(instancesDir).catch(() => [] as string[])) instanceIds.add(i);
  };
  // instances live for seconds at least: a 200 ms poll sees every one the agent makes
  const poller = setInterval(() => void noteInstances(), 200);
  poller.unref();
  const api = await startApi(loadApiConfig(base), { bootstrapKeyFile: join(dir, 'api-key') });
  const apiKey = (await readFile(join(dir, 'api-key'), 'utf8')).trim();

  const stack: Stack = {
    ...clientOf(api.url, apiKey),
    apiUrl: api.url,
    as: (key) => clientOf(api.url, key),
    redisUrl,
    pool,
    gateway,
    api,
    agent,
    redis,
    dir,
    instanceIds,
    async restartGateway() {
      if (!stack.gateway || !restart) throw new Error('this stack has no gateway');
      await stack.gateway.close('restart');
      stack.gateway = await restart();
    },
    async stop() {
      await noteInstances();
      clearInterval(poller);
      await stack.agent.close();
      await stack.api.close();
      await stack.gateway?.close();
      redis.disconnect();
      // before the folder goes: mounts and processes are found by its path
      stack.left = await leftovers(stack);
      await rm(dir, { recursive: true, force: true });
    },
  };
  return stack;
}

/** What {@link leftovers} finds; every list empty means a clean stop ({@link NO_LEFTOVERS}). */
export interface Leftovers {
  /** Host interfaces holding an address of the stack's pool (veth host ends). */
  links: string[];
  /** runsc processes naming the stack's folder. */
  runsc: string[];
  /** `<controller>/space/<instance>` cgroups of the stack's instances. */
  cgroups: string[];
  /** VMM processes (qemu, firecracker, cloud-hypervisor) naming the stack's folder. */
  vmms: string[];
  /** Network namespaces of the stack's instances (`sp-<short>`). */
  netns: string[];
  /** Mount points under the stack's folder (overlays, loop-mounted disks). */
  mounts: string[];
  /** nftables chains of the stack's instances in `inet space` (`raw_spv<short>`, …). */
  chains: string[];
  /** Any other process naming the stack's folder. */
  processes: string[];
}

/** The value of {@link leftovers} after a clean stop. */
export const NO_LEFTOVERS: Leftovers = {
  links: [],
  runsc: [],
  cgroups: [],
  vmms: [],
  netns: [],
  mounts: [],
  chains: [],
  processes: [],
};

async function pgrep(pattern: string): Promise<string[]> {
  const { stdout } = await run('pgrep', ['-af', pattern]).catch(() => ({ stdout: '' }));
  return stdout
    .split('\n')
    .filter(Boolean)
    .filter((l) => !l.includes('pgrep'));
}

/**
 * What a stack left on the host, looked for where each kind would be: host links with an address
 * of its pool; runsc, VMM and any other processes naming its folder; mounts under its folder; and,
 * for each of its instance ids, cgroups (every controller), the network namespace and the
 * nftables chains named after it. A stopped {@link Stack} answers what its `stop()` found while its
 * folder still existed; anything else (a planted control) is looked at now.
 */
export async function leftovers(
  stack: Pick<Stack, 'dir' | 'pool' | 'instanceIds'> & { left?: Leftovers },
): Promise<Leftovers> {
  if (stack.left) return stack.left;
  const stackDir = stack.dir;
  const prefix = `${stack.pool.split('.').slice(0, 2).join('.')}.`;
  const addrs = JSON.parse((await run('ip', ['-j', '-4', 'addr', 'show'])).stdout) as {
    ifname: string;
    addr_info?: { local?: string }[];
  }[];
  const links = addrs
    .filter((l) => l.addr_info?.some((a) => a.local?.startsWith(prefix)))
    .map((l) => l.ifname);
  const runsc = await pgrep(`runsc.*${stackDir}`);
  // VMM processes (qemu, firecracker, cloud-hypervisor) whose command line names this stack's dir
  const vmms = await pgrep(`(qemu-system|firecracker|cloud-hypervisor).*${stackDir}`);
  const processes = (await pgrep(stackDir)).filter((l) => !runsc.includes(l) && !vmms.includes(l));
  const ids = [...stack.instanceIds];
  const cgroups: string[] = [];
  for (const ctl of await readdir('/sys/fs/cgroup').catch(() => [] as string[])) {
    const present = await readdir(`/sys/fs/cgroup/${ctl}/space`).catch(() => [] as string[]);
    cgroups.push(...present.filter((i) => ids.includes(i)).map((i) => `${ctl}/space/${i}`));
  }
  const names = ids.flatMap((i) => {
    try {
      return [networkNames(i)];
    } catch {
      return [];
    }
  });
  const allNetns = (await run('ip', ['netns', 'list']).catch(() => ({ stdout: '' }))).stdout
    .split('\n')
    .map((l) => l.split(' ')[0]!)
    .filter(Boolean);
  const netns = allNetns.filter((n) => names.some((x) => x.netns === n));
  const table = (await run('nft', ['-j', 'list', 'table', 'inet', NFT_TABLE]).catch(() => ({ stdout: '{}' })))
    .stdout;
  const chains = ((JSON.parse(table) as { nftables?: { chain?: { name: string } }[] }).nftables ?? [])
    .map((e) => e.chain?.name)
    .filter((n): n is string => n !== undefined)
    .filter((c) => names.some((x) => c.endsWith(`_${x.hostIf}`)));
  const mounts = (await readFile('/proc/self/mountinfo', 'utf8'))
    .split('\n')
    .map((l) => l.split(' ')[4] ?? '')
    .filter((m) => m.startsWith(`${stackDir}/`) || m === stackDir);
  return { links, runsc, cgroups, vmms, netns, mounts, chains, processes };
}

/**
 * The end of a test file that started `s` (undefined: it never got that far) and pushed undo steps
 * onto `cleanups`: stops `s` and expects it left nothing behind ({@link leftovers}); then, also
 * when that failed, runs `cleanups` last first, ignoring their errors. Rethrows the stop's failure.
 */
export async function stopThenClean(
  s: Stack | undefined,
  cleanups: (() => Promise<unknown>)[],
): Promise<void> {
  try {
    if (s) {
      await s.stop();
      expect(await leftovers(s)).toEqual(NO_LEFTOVERS);
    }
  } finally {
    for (const c of cleanups.reverse()) await c().catch(() => {});
  }
}

/** A sandbox's record once it ended: why (`killReason`, e.g. `timeout`, `oom`) and the message users see. */
export interface EndRecord {
  state: 'killed';
  killReason: string;
  endMessage: string;
}

/**
 * Polls sandbox `id`'s record (`GET /v1/sandboxes/:id`) every 100 ms until its state is `killed`.
 * @returns that record.
 * @throws Error when it has not ended after `timeoutMs` (ms).
 */
export function waitForEnd(s: StackClient, id: string, timeoutMs = 30_000): Promise<EndRecord> {
  return waitFor(
    `sandbox ${id} to end`,
    async () => {
      const r = await s.call<EndRecord | { state: string }>('GET', `/v1/sandboxes/${id}`);
      return r.body.state === 'killed' ? (r.body as EndRecord) : undefined;
    },
    timeoutMs,
  );
}

/** Agent settings that restart `s`'s agent as it was (plus `extra`). */
export function agentEnv(s: Stack, extra: Record<string, string> = {}): Record<string, string> {
  return {
    SPACE_REDIS_URL: s.redisUrl,
    SPACE_VERIFY_KEY_FILE: `${s.dir}/key.pub.pem`,
    SPACE_AGENT_PORT: new URL(s.agent.url).port,
    SPACE_NODE_ID: 'test-node',
    SPACE_AGENT_STATE_DIR: `${s.dir}/agent`,
    SPACE_CACHE_DIR: TEST_CACHE_DIR,
    SPACE_NETWORK_POOL: s.pool,
    SPACE_AGENT_ON_SHUTDOWN: 'destroy',
    SPACE_WARM_POOL_SIZE: '0',
    SPACE_HEARTBEAT_INTERVAL_MS: '1000',
    SPACE_LOG_LEVEL: 'silent',
    ...extra,
  };
}

/** Polls `fn` every 100 ms until it returns a value; throws after `timeoutMs`. */
export async function waitFor<T>(
  what: string,
  fn: () => Promise<T | undefined>,
  timeoutMs = 30_000,
): Promise<T> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const v = await fn();
    if (v !== undefined) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}
