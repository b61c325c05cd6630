/**
 * `space up`: the local single-node stack in the foreground — Redis (unless --redis-url), the API,
 * the data-plane router (unless --no-router) and one node agent (gVisor driver), with keys, the
 * `base` template and logs under `$SPACE_HOME`. With the router, the API hands out router URLs
 * (SPACE_ROUTER_URL) for command streams and files; without it, the agent's own URL.
 *
 * Start: prerequisites → free ports → `$SPACE_HOME` + key pair → IPv4 forwarding → template `base` → Redis → API,
 * router and agent → their `/readyz` → an alive node in `GET /v1/nodes` → `local.json` → "ready".
 * Stop (Ctrl-C / SIGTERM / SIGHUP): the router first (no new client traffic), then the agent (it
 * destroys its sandboxes), then the API, then Redis, each with
 * a timeout and a SIGKILL fallback; exit 0. A child that dies on its own stops the rest: exit 1 with
 * the tail of its log. Children run in their own process groups so a terminal Ctrl-C reaches only us
 * and the stop order holds.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { createPublicKey } from 'node:crypto';
import {
  accessSync,
  chmodSync,
  closeSync,
  constants,
  createWriteStream,
  existsSync,
  fstatSync,
  mkdirSync,
  openSync,
  readdirSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { connect, createServer } from 'node:net';
import { constants as osConstants } from 'node:os';
import { delimiter, join } from 'node:path';
import { createInterface } from 'node:readline';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import type { Command } from 'commander';
import { request } from 'undici';
import { API_NODE_FLAGS } from '../api/config.ts';
import { isIPv4 } from '../core/net-address.ts';
import { parseStat } from '../core/proc-stat.ts';
import { ApiClient } from './client.ts';
import { isJson } from './context.ts';
import { type LocalState, localPaths, readLocalState, spaceHome } from './local.ts';
import { CliError, note, parsePositiveInt, printJson, println, usageError } from './output.ts';
import { buildLocalTemplate, DEFAULT_CACHE_DIR } from './template.ts';

export const LOCAL_REDIS_PORT = 16379;
export const LOCAL_NODE_ID = 'local';
const HOST = '127.0.0.1';

/** How long each child gets to stop after SIGTERM before SIGKILL, ms. */
export const STOP_TIMEOUT_MS = {
  router: 15_000,
  agent: 120_000,
  gateway: 15_000,
  api: 15_000,
  redis: 15_000,
} as const;

/** The host's first resolver (`/etc/resolv.conf`), as `ip:53`: what the local gateway asks. */
export function hostResolver(resolvConf: string): string {
  const first = [...resolvConf.matchAll(/^\s*nameserver\s+(\S+)\s*$/gm)].map((m) => m[1]).find(isIPv4);
  return `${first ?? '127.0.0.1'}:53`;
}

interface UpOptions {
  apiPort: number;
  agentPort: number;
  routerPort: number;
  /** False with --no-router: clients reach the agent directly. */
  router: boolean;
  redisUrl?: string;
  warm?: number;
  verbose?: boolean;
}

/** Directories searched besides $PATH (root's tools often live in sbin, absent from user PATHs). */
const EXTRA_DIRS = ['/usr/local/sbin', '/usr/local/bin', '/usr/sbin', '/usr/bin', '/sbin', '/bin'];

/** `$PATH` with the standard system dirs appended (children get this too). Pure. */
export function searchPath(pathEnv: string | undefined): string {
  const dirs = (pathEnv ?? '').split(delimiter).filter(Boolean);
  for (const d of EXTRA_DIRS) if (!dirs.includes(d)) dirs.push(d);
  return dirs.join(delimiter);
}

/** Absolute path of executable `name` on `pathEnv` (+ system dirs), or null. */
export function findExecutable(name: string, pathEnv = process.env['PATH']): string | null {
  for (const dir of searchPath(pathEnv).split(delimiter)) {
    const p = join(dir, name);
    try {
      accessSync(p, constants.X_OK);
      return p;
    } catch {
      // next
    }
  }
  return null;
}

/** Tools the local stack needs on the host. */
export function requiredTools(localRedis: boolean): string[] {
  return ['runsc', ...(localRedis ? ['redis-server'] : []), 'nft', 'ip', 'debootstrap', 'tini-static'];
}

/** Every missing prerequisite as a line (root, then tools). */
export function missingPrerequisites(
  localRedis: boolean,
  uid: number | undefined = process.getuid?.(),
  find: (name: string) => string | null = (n) => findExecutable(n),
): string[] {
  const missing: string[] = [];
  if (uid !== 0)
    missing.push('root (the agent creates network namespaces, nftables rules and gVisor sandboxes)');
  for (const tool of requiredTools(localRedis)) if (!find(tool)) missing.push(tool);
  return missing;
}

/** True when something already listens on `host:port`. */
export function portInUse(port: number, host = HOST): Promise<boolean> {
  return new Promise((resolve) => {
    const srv = createServer();
    srv.once('error', (err: NodeJS.ErrnoException) =>
      resolve(err.code === 'EADDRINUSE' || err.code === 'EACCES'),
    );
    srv.listen({ port, host, exclusive: true }, () => srv.close(() => resolve(false)));
  });
}

/** Answers true once `redis-cli PING` would (speaks RESP directly; LOADING counts as not yet). */
function redisPing(port: number, host = HOST): Promise<boolean> {
  return new Promise((resolve) => {
    const sock = connect({ port, host });
    let buf = '';
    const done = (ok: boolean) => {
      sock.destroy();
      resolve(ok);
    };
    sock.setTimeout(1000, () => done(false));
    sock.once('error', () => done(false));
    sock.once('connect', () => sock.write('PING\r\n'));
    sock.on('data', (d) => {
      buf += d.toString();
      if (buf.includes('\r\n')) done(buf.startsWith('+PONG'));
    });
  });
}

async function httpOk(url: string): Promise<boolean> {
  try {
    const res = await request(url, { headersTimeout: 2000, bodyTimeout: 2000 });
    await res.body.text();
    return res.statusCode === 200;
  } catch {
    return false;
  }
}

async function until(
  what: string,
  timeoutMs: number,
  check: () => Promise<boolean>,
  signal?: AbortSignal,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (signal?.aborted) return;
    if (await check()) return;
    await sleep(200);
  }
  throw new CliError('START_TIMEOUT', `${what} was not ready after ${Math.round(timeoutMs / 1000)} s`);
}

/** The last `n` lines of `file` from byte `from` on. */
export function logTail(file: string, from: number, n = 25): string[] {
  try {
    const text = readFileSync(file).subarray(from).toString('utf8');
    return text.split('\n').filter(Boolean).slice(-n);
  } catch {
    return [];
  }
}

/**
 * Pids of the live children of process `parent` whose command line contains `marker`, read from
 * `/proc`. Empty when there are none or `parent` is unknown.
 */
export function childPids(parent: number | undefined, marker: string): number[] {
  if (parent === undefined) return [];
  const found: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const proc = parseStat(readFileSync(`/proc/${entry}/stat`, 'utf8'));
      if (proc?.ppid !== parent || proc.zombie) continue;
      if (readFileSync(`/proc/${entry}/cmdline`, 'utf8').includes(marker)) found.push(proc.pid);
    } catch {
      // exited meanwhile
    }
  }
  return found;
}

/** The name of signal number `n` (`SIGKILL` for 9), if it is one. */
export function signalName(n: number): string | undefined {
  return Object.entries(osConstants.signals).find(([, v]) => v === n)?.[0];
}

/** SIGKILL to `pid`, ignoring a process that is already gone. */
function killQuietly(pid: number): void {
  try {
    process.kill(pid, 'SIGKILL');
  } catch {
    // gone
  }
}

/** One supervised child process with its log file. */
class Child {
  readonly name: string;
  readonly logFile: string;
  readonly logStart: number;
  readonly proc: ChildProcess;
  readonly exited: Promise<{ code: number | null; signal: string | null; error?: string }>;
  /** The service's own program when `file` is a wrapper that runs it (its child): tini. */
  readonly service: string | undefined;
  done = false;

  constructor(
    name: string,
    file: string,
    args: string[],
    env: NodeJS.ProcessEnv,
    logFile: string,
    verbose: boolean,
    service?: string,
  ) {
    this.name = name;
    this.service = service;
    this.logFile = logFile;
    const fd = openSync(logFile, 'a', 0o600);
    this.logStart = fstatSync(fd).size;
    if (verbose) {
      closeSync(fd);
      this.proc = spawn(file, args, { env, detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
      const log = createWriteStream(logFile, { flags: 'a' });
      for (const s of [this.proc.stdout!, this.proc.stderr!]) {
        s.pipe(log, { end: false });
        createInterface({ input: s }).on('line', (line) =>
          process.stderr.write(`${name.padEnd(5)}| ${line}\n`),
        );
      }
      this.proc.once('close', () => log.end());
    } else {
      this.proc = spawn(file, args, { env, detached: true, stdio: ['ignore', fd, fd] });
      closeSync(fd);
    }
    this.exited = new Promise((resolve) => {
      this.proc.once('error', (err) => {
        this.done = true;
        resolve({ code: null, signal: null, error: err.message });
      });
      this.proc.once('exit', (code, signal) => {
        this.done = true;
        // tini exits 128 + n when signal n ended the service it runs: say which signal
        const passed = service && code !== null && code > 128 ? signalName(code - 128) : undefined;
        resolve(passed ? { code: null, signal: passed } : { code, signal });
      });
    });
  }

  /** SIGTERM, wait up to `timeoutMs`, then SIGKILL. */
  async stop(timeoutMs: number): Promise<void> {
    if (this.done) return;
    this.proc.kill('SIGTERM');
    const t = sleep(timeoutMs).then(() => 'timeout' as const);
    if ((await Promise.race([this.exited, t])) === 'timeout') {
      note(`space: ${this.name} did not stop within ${Math.round(timeoutMs / 1000)} s; killing it`);
      // a service under a wrapper (the agent under tini): tini cannot pass SIGKILL on, so the
      // service is killed first, by itself (the sandboxes tini reaps for are not its to end)
      if (this.service) for (const pid of childPids(this.proc.pid, this.service)) killQuietly(pid);
      this.proc.kill('SIGKILL');
      await this.exited;
    }
  }
}

type StopReason = { kind: 'signal'; signal: string } | { kind: 'died'; child: Child; how: string };

/** Creates `$SPACE_HOME` (0700) and its dirs, and the Ed25519 key pair when missing. */
async function prepareHome(paths: ReturnType<typeof localPaths>): Promise<void> {
  mkdirSync(paths.home, { recursive: true, mode: 0o700 });
  chmodSync(paths.home, 0o700);
  mkdirSync(paths.logs, { recursive: true, mode: 0o700 });
  mkdirSync(paths.redisDir, { recursive: true, mode: 0o700 });
  if (!existsSync(paths.signingKey)) {
    const { writeNewKeyPair } = await import('../core/tokens.ts');
    await writeNewKeyPair(paths.signingKey, paths.verifyKey);
    note(`space: created key pair ${paths.signingKey}`);
  } else if (!existsSync(paths.verifyKey)) {
    const pub = createPublicKey(readFileSync(paths.signingKey)).export({ type: 'spki', format: 'pem' });
    writeFileSync(paths.verifyKey, pub, { mode: 0o644 });
  }
}

export function registerUp(program: Command): void {
  program
    .command('up')
    .description(
      'run the local single-node stack (Redis, API, router, agent) in the foreground; Ctrl-C stops it',
    )
    .option('--api-port <port>', 'API port', parsePositiveInt('--api-port'), 8080)
    .option('--agent-port <port>', 'agent (data plane) port', parsePositiveInt('--agent-port'), 8081)
    .option(
      '--router-port <port>',
      'router (public data plane) port',
      parsePositiveInt('--router-port'),
      8082,
    )
    .option('--no-router', 'no router: clients stream from the agent’s own URL')
    .option('--redis-url <url>', `use this Redis instead of starting one on ${HOST}:${LOCAL_REDIS_PORT}`)
    .option('--warm <n>', 'warm sandboxes kept per template (agent default 2)', (v) => {
      if (!/^[0-9]+$/.test(v)) throw usageError(`--warm must be a number, got "${v}"`);
      return Number(v);
    })
    .option('--verbose', 'also show the services’ logs here (they always go to $SPACE_HOME/logs)')
    .addHelpText(
      'after',
      `
Needs root and runsc, redis-server, nft, ip, debootstrap, tini-static (install: bash scripts/host-deps.sh).
Turns IPv4 forwarding on (net.ipv4.ip_forward=1) when it is off: sandboxes' CIDR egress rules need it.
Keeps its things in $SPACE_HOME (default ~/.space): api-key, key pair, local.json, logs/, redis/.
The first start builds template "base" (about a minute); later starts reuse it.

Examples:
  space up
  space up --api-port 9080 --agent-port 9081 --router-port 9082 --warm 0 --verbose
  space up --no-router
  space up --redis-url redis://10.0.0.5:6379`,
    )
    .action(async (o: UpOptions, cmd: Command) => {
      process.exitCode = await runUp(o, isJson(cmd));
    });
}

/** Where the kernel keeps `net.ipv4.ip_forward` (every interface's IPv4 forwarding). */
const IP_FORWARD_PATH = '/proc/sys/net/ipv4/ip_forward';

/**
 * Turns IPv4 forwarding on, as the deployments' agent nodes have it: a sandbox's CIDR egress
 * rules need the uplink to forward their replies back to it (`space doctor`: ipv4-forwarding).
 * Already on: nothing is written. A host that refuses (no root, a read-only /proc/sys) gets a note
 * naming the sysctl; the stack still starts, without working CIDR rules. Never throws.
 */
function enableIpv4Forwarding(): void {
  try {
    if (readFileSync(IP_FORWARD_PATH, 'utf8').trim() === '1') return;
    writeFileSync(IP_FORWARD_PATH, '1\n');
    note('space: IPv4 forwarding turned on (net.ipv4.ip_forward=1): CIDR egress rules need it');
  } catch (err) {
    note(
      `space: could not turn IPv4 forwarding on (${(err as Error).message}); CIDR egress rules need net.ipv4.ip_forward=1 (npx space doctor)`,
    );
  }
}

async function runUp(o: UpOptions, json: boolean): Promise<number> {
  const paths = localPaths(spaceHome());
  const localRedis = !o.redisUrl;

  const missing = missingPrerequisites(localRedis);
  if (missing.length) {
    throw new CliError('PREREQUISITES', `missing: ${missing.join(', ')}`, {
      details: { missing },
      hint: 'install the host packages with: bash scripts/host-deps.sh (as root), and run space up as root',
    });
  }
  const ports: [string, number][] = [
    ['API', o.apiPort],
    ['agent', o.agentPort],
    ...(o.router ? ([['router', o.routerPort]] as [string, number][]) : []),
    ...(localRedis ? ([['Redis', LOCAL_REDIS_PORT]] as [string, number][]) : []),
  ];
  if (new Set(ports.map(([, p]) => p)).size !== ports.length) throw usageError('the ports must differ');
  const busy: string[] = [];
  for (const [what, port] of ports) if (await portInUse(port)) busy.push(`${port} (${what})`);
  if (busy.length) {
    const prior = readLocalState(paths.home);
    const running = prior?.pid && prior.pid !== process.pid && pidAlive(prior.pid);
    throw new CliError(
      'PORT_IN_USE',
      `port${busy.length > 1 ? 's' : ''} in use on ${HOST}: ${busy.join(', ')}`,
      {
        details: { ports: busy },
        hint: running
          ? `another \`space up\` seems to be running (pid ${prior.pid}); stop it first`
          : prior
            ? `a \`space up\` (pid ${prior.pid}) ended without stopping its services; stop them (the agent first: ` +
              `pkill -TERM -f runtime/agent/server.ts, then runtime/router/, runtime/api/ and runtime/gateway/, then redis-server), ` +
              'or pick other ports with --api-port / --agent-port'
            : 'stop what uses them, or pick others with --api-port / --agent-port',
      },
    );
  }

  await prepareHome(paths);
  enableIpv4Forwarding();
  const built = await buildLocalTemplate('base', DEFAULT_CACHE_DIR, (line) => note(`space: ${line}`));
  note(`space: template base ready${built.cached ? ' (cached)' : ''}`);

  const redisUrl = o.redisUrl ?? `redis://${HOST}:${LOCAL_REDIS_PORT}`;
  // The stack's own services reach a Redis it starts by its Unix socket, not TCP: on this kind of
  // 2-core VM a round trip cost the client ~30 µs of CPU by socket against ~45–55 µs over loopback
  // TCP (49 µs against 73–91 µs of wall time; sequential HGETALLs with ioredis), and a create makes
  // a dozen of them. The TCP port stays open for tools (redis-cli, local.json's redisUrl).
  // (a socket path longer than sockaddr_un's 108 bytes cannot be bound: such a home keeps TCP)
  const socketPath = join(paths.redisDir, 'redis.sock');
  const redisSocket = localRedis && Buffer.byteLength(socketPath) < 100 ? socketPath : null;
  const servicesRedisUrl = redisSocket ?? redisUrl;
  const apiUrl = `http://${HOST}:${o.apiPort}`;
  const agentUrl = `http://${HOST}:${o.agentPort}`;
  const routerUrl = o.router ? `http://${HOST}:${o.routerPort}` : undefined;
  const baseEnv: NodeJS.ProcessEnv = { ...process.env, PATH: searchPath(process.env['PATH']) };
  const children: Child[] = [];
  const log = (name: string) => join(paths.logs, `${name}.log`);
  let driverName = 'unknown';

  // stop reasons: a signal, or a child exiting on its own
  let stopping = false;
  let resolveStop!: (r: StopReason) => void;
  const startAbort = new AbortController();
  const stopped = new Promise<StopReason>((r) => {
    resolveStop = r;
  });
  void stopped.then(() => startAbort.abort());
  const onSignal = (signal: string) => {
    if (!stopping) {
      note(`space: ${signal}: stopping (router, agent, then API, then Redis)…`);
      resolveStop({ kind: 'signal', signal });
    } else note('space: still stopping; the agent is destroying its sandboxes');
  };
  const onInt = () => onSignal('SIGINT');
  const onTerm = () => onSignal('SIGTERM');
  // a closed terminal or a dropped SSH session stops the stack too (the services run in their
  // own sessions, so nothing else would)
  const onHup = () => onSignal('SIGHUP');
  process.on('SIGINT', onInt);
  process.on('SIGTERM', onTerm);
  process.on('SIGHUP', onHup);
  const lastResort = () => {
    for (const c of children) if (!c.done) c.proc.kill('SIGTERM');
  };
  process.on('exit', lastResort);

  const start = (name: string, file: string, args: string[], env: NodeJS.ProcessEnv, service?: string) => {
    const c = new Child(name, file, args, env, log(name), o.verbose === true, service);
    children.push(c);
    void c.exited.then((r) => {
      if (!stopping) {
        const how = r.error ?? (r.signal ? `killed by ${r.signal}` : `exited with code ${r.code}`);
        resolveStop({ kind: 'died', child: c, how });
      }
    });
    return c;
  };
  /** `p`, unless a stop reason comes first. */
  const guard = <T>(p: Promise<T>): Promise<T> =>
    Promise.race([p, stopped.then((r) => Promise.reject(new StopFirst(r)))]);

  let reason: StopReason | null = null;
  let failure: unknown = null;
  try {
    if (localRedis) {
      note(`space: starting redis on ${HOST}:${LOCAL_REDIS_PORT} (data in ${paths.redisDir})`);
      start(
        'redis',
        findExecutable('redis-server')!,
        [
          '--port',
          String(LOCAL_REDIS_PORT),
          '--bind',
          HOST,
          '--dir',
          paths.redisDir,
          ...(redisSocket ? ['--unixsocket', redisSocket, '--unixsocketperm', '700'] : []),
          '--appendonly',
          'yes',
          '--daemonize',
          'no',
        ],
        baseEnv,
      );
      await guard(until('redis', 30_000, () => redisPing(LOCAL_REDIS_PORT), startAbort.signal));
    }
    const node = process.execPath;
    const apiServer = fileURLToPath(new URL('../api/server.ts', import.meta.url));
    const agentServer = fileURLToPath(new URL('../agent/server.ts', import.meta.url));
    note(`space: starting the API on ${apiUrl}`);
    start('api', node, [...API_NODE_FLAGS, apiServer], {
      ...baseEnv,
      SPACE_API_HOST: HOST,
      SPACE_API_PORT: String(o.apiPort),
      SPACE_REDIS_URL: servicesRedisUrl,
      SPACE_SIGNING_KEY_FILE: paths.signingKey,
      SPACE_BOOTSTRAP_API_KEY_FILE: paths.apiKey,
      ...(routerUrl ? { SPACE_ROUTER_URL: routerUrl } : {}),
      SPACE_LOG_LEVEL: process.env['SPACE_LOG_LEVEL'] ?? 'info',
    });
    if (routerUrl) {
      note(`space: starting the router on ${routerUrl} (command streams and files go through it)`);
      start('router', node, [fileURLToPath(new URL('../router/server.ts', import.meta.url))], {
        ...baseEnv,
        SPACE_ROUTER_HOST: HOST,
        SPACE_ROUTER_PORT: String(o.routerPort),
        SPACE_REDIS_URL: servicesRedisUrl,
        SPACE_VERIFY_KEY_FILE: paths.verifyKey,
        SPACE_LOG_LEVEL: process.env['SPACE_LOG_LEVEL'] ?? 'info',
      });
    }
    const gatewaySocket = join(paths.home, 'gateway.sock');
    const gatewayCa = join(paths.home, 'gateway-ca.crt');
    rmSync(gatewaySocket, { force: true }); // a stale socket would look ready
    note('space: starting the egress gateway (sandboxes reach only what their egress policy allows)');
    start('gateway', node, [fileURLToPath(new URL('../gateway/server.ts', import.meta.url))], {
      ...baseEnv,
      SPACE_GATEWAY_CONTROL_SOCKET: gatewaySocket,
      SPACE_GATEWAY_CA_CERT_FILE: gatewayCa,
      SPACE_GATEWAY_CA_KEY_FILE: join(paths.home, 'gateway-ca.key'),
      // credential values are read from the state of record when a request needs them
      SPACE_REDIS_URL: servicesRedisUrl,
      SPACE_GATEWAY_UPSTREAM_DNS:
        process.env['SPACE_GATEWAY_UPSTREAM_DNS'] ?? hostResolver(readFileSync('/etc/resolv.conf', 'utf8')),
      SPACE_LOG_LEVEL: process.env['SPACE_LOG_LEVEL'] ?? 'info',
    });
    await guard(until('the gateway', 30_000, async () => existsSync(gatewaySocket), startAbort.signal));
    note(
      `space: starting the agent on ${agentUrl} (node ${LOCAL_NODE_ID}, driver ${process.env['SPACE_DRIVER'] || 'auto'})`,
    );
    // Under tini as a subreaper (as SERVICE_COMMANDS runs it in deployments): the sandbox
    // processes `runsc run --detach` leaves behind are re-parented to it, not to the host's init,
    // and reaped as they exit. `runsc delete` polls until its sandbox process is gone, so an init
    // that reaps late holds every destroy (docs/operations.md, Operating notes: ~1 s per delete on this
    // project's VM).
    start(
      'agent',
      findExecutable('tini-static')!,
      ['-s', '--', node, agentServer],
      {
        ...baseEnv,
        SPACE_NODE_ID: LOCAL_NODE_ID,
        SPACE_AGENT_HOST: HOST,
        SPACE_AGENT_PORT: String(o.agentPort),
        SPACE_REDIS_URL: servicesRedisUrl,
        SPACE_VERIFY_KEY_FILE: paths.verifyKey,
        SPACE_AGENT_STATE_DIR: join(paths.home, 'agent'),
        SPACE_CACHE_DIR: DEFAULT_CACHE_DIR,
        SPACE_AGENT_ON_SHUTDOWN: 'destroy',
        SPACE_GATEWAY_CONTROL_SOCKET: gatewaySocket,
        SPACE_TRUSTED_CA_FILE: gatewayCa,
        ...(o.warm !== undefined ? { SPACE_WARM_POOL_SIZE: String(o.warm) } : {}),
        SPACE_LOG_LEVEL: process.env['SPACE_LOG_LEVEL'] ?? 'info',
      },
      agentServer,
    );
    await guard(
      Promise.all([
        until('the API', 60_000, () => httpOk(`${apiUrl}/readyz`), startAbort.signal),
        until('the agent', 180_000, () => httpOk(`${agentUrl}/readyz`), startAbort.signal),
        ...(routerUrl
          ? [until('the router', 60_000, () => httpOk(`${routerUrl}/readyz`), startAbort.signal)]
          : []),
      ]),
    );
    await guard(until('the API key file', 10_000, async () => existsSync(paths.apiKey), startAbort.signal));
    const api = new ApiClient({ apiUrl, apiKey: readFileSync(paths.apiKey, 'utf8').trim() });
    await guard(
      until(
        `node "${LOCAL_NODE_ID}" in GET /v1/nodes`,
        60_000,
        async () => {
          try {
            const { nodes } = await api.json<{ nodes: { id: string; alive: boolean; driver: string }[] }>(
              'GET',
              '/v1/nodes',
            );
            const me = nodes.find((n) => n.id === LOCAL_NODE_ID && n.alive);
            if (me) driverName = me.driver;
            return me !== undefined;
          } catch (err) {
            if (err instanceof CliError && err.code === 'UNAUTHENTICATED') {
              throw new CliError(
                'API_KEY_STALE',
                `the API key in ${paths.apiKey} is not known to this Redis`,
                {
                  hint: `remove ${paths.apiKey} and run space up again: the API then writes a new key`,
                },
              );
            }
            return false;
          }
        },
        startAbort.signal,
      ),
    );
    const state: LocalState = {
      apiUrl,
      agentUrl,
      ...(routerUrl ? { routerUrl } : {}),
      redisUrl,
      apiKeyFile: paths.apiKey,
      pid: process.pid,
      startedAt: new Date().toISOString(),
    };
    writeFileSync(paths.localJson, `${JSON.stringify(state, null, 2)}\n`, { mode: 0o600 });
    if (json) printJson({ ...state, logs: paths.logs, template: built });
    else {
      println('SPACE is running (Ctrl-C to stop)');
      println(`  API      ${apiUrl}`);
      println(`  router   ${routerUrl ?? 'none (--no-router): clients reach the agent directly'}`);
      println(`  driver   ${driverName} (npx space doctor tells why)`);
      println(`  API key  ${paths.apiKey}`);
      println(`  logs     ${join(paths.logs, `{api,${routerUrl ? 'router,' : ''}agent,gateway,redis}.log`)}`);
      println('try: npx space sandbox create --template base');
    }
    reason = await stopped;
  } catch (err) {
    if (err instanceof StopFirst) reason = err.reason;
    else failure = err;
  }

  stopping = true;
  startAbort.abort();
  const byName = (n: string) => children.find((c) => c.name === n);
  for (const name of ['router', 'agent', 'gateway', 'api', 'redis'] as const) {
    const c = byName(name);
    if (!c || c.done) continue;
    note(`space: stopping ${name}…`);
    await c.stop(STOP_TIMEOUT_MS[name]);
  }
  process.off('exit', lastResort);
  process.off('SIGINT', onInt);
  process.off('SIGTERM', onTerm);
  process.off('SIGHUP', onHup);

  if (reason?.kind === 'died') {
    const { child, how } = reason;
    const tail = logTail(child.logFile, child.logStart);
    note(`space: ${child.name} ${how} unexpectedly; last lines of ${child.logFile}:`);
    for (const line of tail) note(`  ${line}`);
    throw new CliError('CHILD_DIED', `${child.name} ${how}`, {
      details: { service: child.name, log: child.logFile },
    });
  }
  if (failure) {
    // a start step failed: show what the services said, then the error
    for (const c of children) {
      const tail = logTail(c.logFile, c.logStart, 8);
      if (tail.length && failure instanceof CliError && failure.code === 'START_TIMEOUT') {
        note(`space: last lines of ${c.logFile}:`);
        for (const line of tail) note(`  ${line}`);
      }
    }
    throw failure;
  }
  note('space: stopped');
  return 0;
}

class StopFirst extends Error {
  readonly reason: StopReason;
  constructor(reason: StopReason) {
    super('stopped');
    this.reason = reason;
  }
}

function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}
