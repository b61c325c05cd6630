/**
 * The parts of `space up --ha` on one machine, started by {@link startHaStack} (the command, in
 * `up.ts`, and the failover suite, test/failover.int.test.ts, share it):
 *
 * - Redis with automatic failover (`redis-ha.ts`): a primary, a replica, three sentinels;
 * - two APIs and two routers, each pair behind one front: Debian's HAProxy, which takes a member
 *   out after two failed `GET /readyz` (one a second) or at once when it refuses a connection
 *   (a request that could not connect is sent to the other member: `retry-on conn-failure`,
 *   `option redispatch`). HAProxy rather than a Node proxy of our own: it is the load balancer
 *   the VM and cloud deployments put in front of the same services, and health checks, retries
 *   and long-lived streams (`timeout tunnel`) are its trade;
 * - the egress gateway and one node agent (a node is not replicated: its sandboxes live on it).
 *
 * Clients use the fronts' URLs only. An API or router that dies is started again after 1 s (the
 * front sends its traffic to the other meanwhile); a Redis server once the sentinels have
 * replaced it (`redis-ha.ts`). The agent, the gateway or HAProxy dying stops the stack, as one
 * dying does in `space up`.
 */
import { randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { request } from 'undici';
import { API_NODE_FLAGS } from '../api/config.ts';
import { SpaceError } from '../core/errors.ts';
import { localPaths, spaceHome } from './local.ts';
import { CliError, note, printJson, println, usageError } from './output.ts';
import { type DataPlacement, type RedisHa, startRedisHa } from './redis-ha.ts';
import { buildLocalTemplate, DEFAULT_CACHE_DIR } from './template.ts';
import { agentEnv, apiEnv, gatewayEnv, gatewayFiles, routerEnv } from './up-env.ts';
import {
  checkPortsFree,
  checkPrerequisites,
  enableIpv4Forwarding,
  findExecutable,
  LOCAL_HOST as HOST,
  prepareHome,
  searchPath,
} from './up-host.ts';
import { Child, httpOk, STOP_TIMEOUT_MS, until } from './up-supervise.ts';

/** Ports of the HA stack: the fronts clients use, and each member behind them. */
export interface HaPorts {
  /** The API front (HAProxy). */
  api: number;
  /** The router front (HAProxy). */
  router: number;
  agent: number;
  apis: [number, number];
  routers: [number, number];
  /** Redis data servers (first: the first primary). */
  redis: [number, number];
  sentinels: [number, number, number];
}

/** The default HA ports after the fronts' (`space up --ha --api-port`…): 10 and more above the API's. */
export function defaultHaPorts(api: number, agent: number, router: number): HaPorts {
  return {
    api,
    router,
    agent,
    apis: [api + 10, api + 11],
    routers: [api + 12, api + 13],
    redis: [16379, 16380],
    sentinels: [16390, 16391, 16392],
  };
}

/** Options of {@link startHaStack}. */
export interface HaStackOptions {
  /** Folder of keys, logs (`logs/`), Redis (`redis-ha/`) and the agent's state (`agent/`). */
  home: string;
  /** Ed25519 key pair (signing: APIs; verify: routers, agent) and the API key file. */
  keys: { signing: string; verify: string; apiKey: string };
  ports: HaPorts;
  cacheDir: string;
  /** Warm sandboxes per template (agent setting). */
  warm?: number;
  verbose?: boolean;
  /** Extra settings, by service. */
  env?: {
    api?: NodeJS.ProcessEnv;
    agent?: NodeJS.ProcessEnv;
    gateway?: NodeJS.ProcessEnv;
    router?: NodeJS.ProcessEnv;
  };
  /** Where each Redis data server runs (the failover suite puts one in a network namespace). */
  redisPlacement?: (index: number) => DataPlacement;
  /** Sentinel `down-after-milliseconds`. Default 3000. */
  redisDownAfterMs?: number;
  /** Restart APIs, routers and Redis servers that die. Default true (`space up --ha`). */
  restart?: boolean;
  /** A part that is not restarted died (agent, gateway, haproxy): name and how. */
  onDied?: (name: string, how: string) => void;
  /** A line for the operator (restarts). */
  note?: (line: string) => void;
  /** The node's id. Default `local`. */
  nodeId?: string;
}

/** A started HA stack. */
export interface HaStack {
  /** The fronts: what clients use. */
  apiUrl: string;
  routerUrl: string;
  agentUrl: string;
  /** `redis-sentinel://…`: what every service is given as SPACE_REDIS_URL. */
  redisUrl: string;
  redis: RedisHa;
  /** The processes by name: api-0, api-1, router-0, router-1, gateway, agent, haproxy. */
  children: Map<string, Child>;
  /** Sends `signal` to a part (Redis servers by their names in `redis.servers`); resolves once it exited. */
  kill(name: string, signal?: NodeJS.Signals): Promise<void>;
  /** Starts a killed part again (same settings); resolves once it is ready. */
  start(name: string): Promise<void>;
  /** Stops everything: the routers, the agent (it destroys its sandboxes), the gateway, the APIs, HAProxy, then Redis. */
  stop(): Promise<void>;
}

const RESTARTED = /^(api|router)-[01]$/;

/**
 * Starts Redis HA, the gateway, two APIs, two routers, HAProxy and the agent; resolves once the
 * fronts answer `/readyz` and the agent does. The `base` template must be built (in `cacheDir`).
 * @throws CliError START_TIMEOUT / PREREQUISITES (HAProxy, Redis Sentinel missing) and stops what
 * it started.
 */
export async function startHaStack(o: HaStackOptions): Promise<HaStack> {
  const haproxy = findExecutable('haproxy', `${process.env['PATH'] ?? ''}:/usr/sbin:/sbin`);
  if (!haproxy) {
    throw new CliError('PREREQUISITES', 'space up --ha needs haproxy', {
      hint: 'install it with: bash scripts/host-deps.sh',
    });
  }
  const logs = join(o.home, 'logs');
  const log = (name: string) => join(logs, `${name}.log`);
  const tell = o.note ?? (() => {});
  const restart = o.restart ?? true;
  const nodeId = o.nodeId ?? 'local';
  const p = o.ports;
  const url = (port: number) => `http://${HOST}:${port}`;
  const baseEnv: NodeJS.ProcessEnv = { ...process.env, PATH: searchPath(process.env['PATH']) };
  const children = new Map<string, Child>();
  let stopping = false;
  /** Children a `kill` ended: not restarted, not reported. */
  const killed = new Set<Child>();

  // one password for the data servers and the sentinels, kept with the data
  mkdirSync(logs, { recursive: true, mode: 0o700 });
  const redisDir = join(o.home, 'redis-ha');
  const pwFile = join(redisDir, 'password');
  mkdirSync(redisDir, { recursive: true, mode: 0o700 });
  if (!existsSync(pwFile)) {
    writeFileSync(pwFile, `${randomBytes(24).toString('hex')}\n`, { mode: 0o600 });
  }
  const redis = await startRedisHa({
    dir: redisDir,
    password: readFileSync(pwFile, 'utf8').trim(),
    ports: { data: p.redis, sentinels: p.sentinels },
    ...(o.redisPlacement ? { placement: o.redisPlacement } : {}),
    downAfterMs: o.redisDownAfterMs ?? 3000,
    keepConfig: true,
    restart,
    onExit: (name, code, signal) => tell(`space: ${name} exited (${signal ?? `code ${code}`})`),
    onRestart: (name, err) => tell(`space: ${name} ${err ? `did not restart: ${err.message}` : 'restarted'}`),
  });

  const node = process.execPath;
  const server = (svc: string) => fileURLToPath(new URL(`../${svc}/server.ts`, import.meta.url));
  const gatewaySocket = gatewayFiles(o.home).socket;
  const specs = new Map<
    string,
    { file: string; args: string[]; env: NodeJS.ProcessEnv; service?: string; ready: () => Promise<boolean> }
  >();
  for (const i of [0, 1] as const) {
    specs.set(`api-${i}`, {
      file: node,
      args: [...API_NODE_FLAGS, server('api')],
      env: {
        ...baseEnv,
        ...apiEnv({
          port: p.apis[i],
          redisUrl: redis.url,
          signingKey: o.keys.signing,
          // one API writes the first key: two would race for the file
          ...(i === 0 ? { apiKeyFile: o.keys.apiKey } : {}),
          routerUrl: url(p.router),
        }),
        SPACE_REDIS_WAIT_REPLICAS: '1',
        ...o.env?.api,
      },
      ready: () => httpOk(`${url(p.apis[i])}/readyz`),
    });
    specs.set(`router-${i}`, {
      file: node,
      args: [server('router')],
      env: {
        ...baseEnv,
        ...routerEnv({ port: p.routers[i], redisUrl: redis.url, verifyKey: o.keys.verify }),
        ...o.env?.router,
      },
      ready: () => httpOk(`${url(p.routers[i])}/readyz`),
    });
  }
  specs.set('gateway', {
    file: node,
    args: [server('gateway')],
    env: { ...baseEnv, ...gatewayEnv({ home: o.home, redisUrl: redis.url }), ...o.env?.gateway },
    ready: async () => existsSync(gatewaySocket),
  });
  specs.set('agent', {
    file: findExecutable('tini-static') ?? 'tini-static',
    args: ['-s', '--', node, server('agent')],
    service: server('agent'),
    env: {
      ...baseEnv,
      ...agentEnv({
        nodeId,
        port: p.agent,
        redisUrl: redis.url,
        verifyKey: o.keys.verify,
        home: o.home,
        cacheDir: o.cacheDir,
        warm: o.warm,
      }),
      ...o.env?.agent,
    },
    ready: () => httpOk(`${url(p.agent)}/readyz`),
  });
  const haproxyCfg = join(o.home, 'haproxy.cfg');
  const errorDir = join(o.home, 'haproxy-errors');
  mkdirSync(errorDir, { recursive: true, mode: 0o700 });
  for (const status of FRONT_ERRORS)
    writeFileSync(join(errorDir, `${status}.http`), frontErrorResponse(status));
  writeFileSync(haproxyCfg, haproxyConfig(p, errorDir), { mode: 0o600 });
  specs.set('haproxy', {
    file: haproxy,
    // -db: foreground, no daemon; -W: master-worker, so SIGTERM/SIGUSR1 reach the worker
    args: ['-W', '-db', '-f', haproxyCfg],
    env: baseEnv,
    ready: async () => (await httpOk(`${url(p.api)}/readyz`)) && (await httpOk(`${url(p.router)}/readyz`)),
  });

  const launch = (name: string): Child => {
    const s = specs.get(name)!;
    const c = new Child(name, s.file, s.args, s.env, log(name), o.verbose === true, s.service);
    children.set(name, c);
    void c.exited.then((r) => {
      if (stopping || children.get(name) !== c || killed.has(c)) return;
      const how = r.error ?? (r.signal ? `killed by ${r.signal}` : `exited with code ${r.code}`);
      if (restart && RESTARTED.test(name)) {
        tell(`space: ${name} ${how}; starting it again (the front sends its traffic to the other)`);
        void sleep(1000).then(() => {
          if (!stopping && children.get(name) === c) launch(name);
        });
      } else o.onDied?.(name, how);
    });
    return c;
  };
  const ready = (name: string, ms: number) => until(name, ms, specs.get(name)!.ready);

  const stack: HaStack = {
    apiUrl: url(p.api),
    routerUrl: url(p.router),
    agentUrl: url(p.agent),
    redisUrl: redis.url,
    redis,
    children,
    async kill(name, signal = 'SIGKILL') {
      if (redis.servers.some((s) => s.name === name)) return redis.kill(name, signal);
      const c = children.get(name);
      if (!c || c.done) return;
      killed.add(c);
      c.proc.kill(signal);
      await c.exited;
    },
    async start(name) {
      if (redis.servers.some((s) => s.name === name)) return redis.start(name);
      const c = children.get(name);
      if (c && !c.done) throw new Error(`${name} is running`);
      launch(name);
      await ready(name, 120_000);
    },
    async stop() {
      stopping = true;
      for (const name of ['router-0', 'router-1', 'agent', 'gateway', 'api-0', 'api-1', 'haproxy']) {
        const c = children.get(name);
        if (c && !c.done) await c.stop(name === 'agent' ? STOP_TIMEOUT_MS.agent : STOP_TIMEOUT_MS.api);
      }
      await redis.stop();
    },
  };

  try {
    await redis.agreed();
    rmSync(gatewaySocket, { force: true }); // a stale socket would look ready
    launch('gateway');
    launch('api-0');
    await ready('api-0', 60_000);
    await until('the API key file', 10_000, async () => existsSync(o.keys.apiKey));
    for (const n of ['api-1', 'router-0', 'router-1', 'haproxy']) launch(n);
    await ready('gateway', 30_000);
    launch('agent');
    await Promise.all(
      ['api-1', 'router-0', 'router-1', 'agent', 'haproxy'].map((n) =>
        ready(n, n === 'agent' ? 180_000 : 60_000),
      ),
    );
  } catch (err) {
    await stack.stop();
    throw err;
  }
  return stack;
}

/** The answers HAProxy makes itself: no member ready (503), the member failed (502), timed out (504). */
const FRONT_ERRORS = [502, 503, 504] as const;

/**
 * The raw HTTP response HAProxy sends instead of its own HTML page for `status`: SPACE's error
 * envelope, 503 `UPSTREAM_UNAVAILABLE` (retryable) with `Retry-After: 2`, so a client of the
 * front reads the same kind of refusal as from the services behind it. Pure.
 */
export function frontErrorResponse(status: (typeof FRONT_ERRORS)[number]): string {
  const why = {
    502: 'the member serving this request failed before it answered',
    503: 'no member behind this front is ready',
    504: 'the member serving this request did not answer in time',
  }[status];
  const err = new SpaceError(
    'UPSTREAM_UNAVAILABLE',
    `${why}; retry shortly (a change may have been made: read it back before repeating)`,
  );
  const body = JSON.stringify(err.toBody());
  return [
    'HTTP/1.1 503 Service Unavailable',
    'content-type: application/json; charset=utf-8',
    'retry-after: 2',
    'cache-control: no-store',
    'connection: close',
    `content-length: ${Buffer.byteLength(body)}`,
    '',
    body,
  ].join('\r\n');
}

/**
 * HAProxy's configuration for the two fronts (HAProxy 2.6, Debian 12: see its configuration
 * manual for each keyword). HTTP mode so a member is judged by `GET /readyz` (200 or out after
 * two failures one second apart; back after two successes); `retry-on conn-failure` with
 * `redispatch` sends a request that could not reach a member to the other one (nothing of it
 * reached the member, so a POST is safe to send again; a request a member took and then died on
 * is not sent again: the client sees the error and decides). Streams (SSE, `timeout tunnel` covers
 * upgraded connections) may stay open for hours.
 */
export function haproxyConfig(p: HaPorts, errorDir?: string): string {
  const backend = (name: string, ports: readonly number[]) => [
    `backend ${name}`,
    '  balance roundrobin',
    '  option httpchk GET /readyz',
    '  http-check expect status 200',
    '  option redispatch 1',
    '  retries 2',
    '  retry-on conn-failure',
    '  default-server inter 1s fall 2 rise 2',
    ...ports.map((port, i) => `  server ${name}-${i} ${HOST}:${port} check`),
    '',
  ];
  return [
    'global',
    '  maxconn 8192',
    '',
    'defaults',
    '  mode http',
    '  timeout connect 2s',
    '  timeout client 1h',
    '  timeout server 1h',
    '  timeout tunnel 1h',
    '  timeout http-request 30s',
    ...(errorDir ? FRONT_ERRORS.map((st) => `  errorfile ${st} ${join(errorDir, `${st}.http`)}`) : []),
    '',
    'frontend api',
    `  bind ${HOST}:${p.api}`,
    '  default_backend apis',
    '',
    'frontend router',
    `  bind ${HOST}:${p.router}`,
    '  default_backend routers',
    '',
    ...backend('apis', p.apis),
    ...backend('routers', p.routers),
  ].join('\n');
}

/** The flags of `space up` that `--ha` reads. */
export interface UpHaFlags {
  apiPort: number;
  agentPort: number;
  routerPort: number;
  router: boolean;
  redisUrl?: string;
  warm?: number;
  verbose?: boolean;
}

/**
 * `space up --ha`: {@link startHaStack} in the foreground with `$SPACE_HOME`'s keys, the `base`
 * template and `local.json` (the fronts' URLs: every CLI command then goes through them); Ctrl-C,
 * SIGTERM or SIGHUP stops it (exit 0); the agent, the gateway or HAProxy dying stops it too
 * (CliError CHILD_DIED). Returns the exit code.
 * @throws CliError USAGE (with --redis-url or --no-router), PREREQUISITES, PORT_IN_USE, START_TIMEOUT.
 */
export async function runUpHa(o: UpHaFlags, json: boolean): Promise<number> {
  if (o.redisUrl) throw usageError('--ha starts its own Redis with sentinels: leave out --redis-url');
  if (!o.router) throw usageError('--ha runs two routers behind one front: leave out --no-router');
  const paths = localPaths(spaceHome());
  checkPrerequisites(true);
  const ports = defaultHaPorts(o.apiPort, o.agentPort, o.routerPort);
  await checkPortsFree(
    [
      ['API front', ports.api],
      ['router front', ports.router],
      ['agent', ports.agent],
      ...ports.apis.map((p, i) => [`API ${i}`, p] as [string, number]),
      ...ports.routers.map((p, i) => [`router ${i}`, p] as [string, number]),
      ...ports.redis.map((p, i) => [`Redis ${i}`, p] as [string, number]),
      ...ports.sentinels.map((p, i) => [`sentinel ${i}`, p] as [string, number]),
    ],
    paths.home,
  );
  await prepareHome(paths);
  enableIpv4Forwarding();
  const built = await buildLocalTemplate('base', DEFAULT_CACHE_DIR, (line) => note(`space: ${line}`));
  note(`space: template base ready${built.cached ? ' (cached)' : ''}`);

  let resolveStop!: (r: { signal?: string; died?: string }) => void;
  const stopped = new Promise<{ signal?: string; died?: string }>((r) => {
    resolveStop = r;
  });
  const handlers = (['SIGINT', 'SIGTERM', 'SIGHUP'] as const).map((sig) => {
    const h = () => {
      note(`space: ${sig}: stopping (routers, agent, gateway, APIs, HAProxy, then Redis)…`);
      resolveStop({ signal: sig });
    };
    process.on(sig, h);
    return [sig, h] as const;
  });
  let stack: HaStack | null = null;
  try {
    note(`space: starting Redis (primary, replica, three sentinels) under ${join(paths.home, 'redis-ha')}`);
    stack = await startHaStack({
      home: paths.home,
      keys: { signing: paths.signingKey, verify: paths.verifyKey, apiKey: paths.apiKey },
      ports,
      cacheDir: DEFAULT_CACHE_DIR,
      ...(o.warm !== undefined ? { warm: o.warm } : {}),
      verbose: o.verbose === true,
      note,
      onDied: (name, how) => resolveStop({ died: `${name} ${how}` }),
    });
    const apiKey = readFileSync(paths.apiKey, 'utf8').trim();
    await until('node "local" in GET /v1/nodes', 60_000, async () => {
      const res = await request(`${stack!.apiUrl}/v1/nodes`, {
        headers: { authorization: `Bearer ${apiKey}` },
      }).catch(() => null);
      if (!res) return false;
      const body = (await res.body.json().catch(() => null)) as {
        nodes?: { id: string; alive: boolean }[];
      } | null;
      return body?.nodes?.some((n) => n.id === 'local' && n.alive) === true;
    });
    const state = {
      apiUrl: stack.apiUrl,
      agentUrl: stack.agentUrl,
      routerUrl: stack.routerUrl,
      redisUrl: stack.redisUrl,
      apiKeyFile: paths.apiKey,
      pid: process.pid,
      startedAt: new Date().toISOString(),
    };
    writeFileSync(paths.localJson, `${JSON.stringify(state, null, 2)}\n`, { mode: 0o600 });
    const members = {
      apis: ports.apis.map((p) => `http://${HOST}:${p}`),
      routers: ports.routers.map((p) => `http://${HOST}:${p}`),
      redis: stack.redis.servers.map((s) => ({ name: s.name, address: `${s.host}:${s.port}` })),
      primary: await stack.redis.primary(),
    };
    if (json) printJson({ ...state, ha: members, logs: join(paths.logs), template: built });
    else {
      println('SPACE is running with no single point of failure but the node (Ctrl-C to stop)');
      println(`  API      ${stack.apiUrl}  (HAProxy → ${members.apis.join(', ')})`);
      println(`  router   ${stack.routerUrl}  (HAProxy → ${members.routers.join(', ')})`);
      println(
        `  Redis    primary ${members.primary}, ${members.redis.map((r) => `${r.name} ${r.address}`).join(', ')}`,
      );
      println(`  API key  ${paths.apiKey}`);
      println(`  logs     ${paths.logs}, ${join(paths.home, 'redis-ha')}/*/*.log`);
      println('try: npx space sandbox create --template base');
    }
    const reason = await stopped;
    if (reason.died) throw new CliError('CHILD_DIED', reason.died, { details: { logs: paths.logs } });
    note('space: stopped');
    return 0;
  } finally {
    for (const [sig, h] of handlers) process.off(sig, h);
    await stack?.stop();
  }
}
