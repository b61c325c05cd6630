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
 *
 * This module owns the command (its flags and help) and the start/stop sequence; the host checks
 * and first-run steps are `up-host.ts`, the children and readiness polls `up-supervise.ts`.
 */
import { existsSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Command } from 'commander';
import { API_NODE_FLAGS } from '../api/config.ts';
import { ApiClient } from './client.ts';
import { isJson } from './context.ts';
import { type LocalState, localPaths, spaceHome } from './local.ts';
import { CliError, note, parsePositiveInt, printJson, println, usageError } from './output.ts';
import { buildLocalTemplate, DEFAULT_CACHE_DIR, prepareLocalGuestKernel } from './template.ts';
import { agentEnv, apiEnv, gatewayEnv, gatewayFiles, routerEnv } from './up-env.ts';
import { runUpHa } from './up-ha.ts';
import {
  checkPortsFree,
  checkPrerequisites,
  enableIpv4Forwarding,
  findExecutable,
  LOCAL_HOST as HOST,
  prepareHome,
  searchPath,
} from './up-host.ts';
import {
  Child,
  httpOk,
  logTail,
  redisPing,
  STOP_TIMEOUT_MS,
  StopFirst,
  type StopReason,
  until,
} from './up-supervise.ts';

export {
  findExecutable,
  hostResolver,
  missingPrerequisites,
  portInUse,
  requiredTools,
  searchPath,
} from './up-host.ts';
export { childPids, logTail, STOP_TIMEOUT_MS, signalName } from './up-supervise.ts';

export const LOCAL_REDIS_PORT = 16379;
export const LOCAL_NODE_ID = 'local';

interface UpOptions {
  apiPort: number;
  agentPort: number;
  routerPort: number;
  /** False with --no-router: clients reach the agent directly. */
  router: boolean;
  redisUrl?: string;
  warm?: number;
  verbose?: boolean;
  /** --ha: two APIs, two routers and Redis with sentinels behind HAProxy (up-ha.ts). */
  ha?: boolean;
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
    .option(
      '--ha',
      'no single point of failure but the node: Redis primary, replica and three sentinels, two APIs and two routers, each pair behind HAProxy on the --api-port/--router-port',
    )
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
  space up --redis-url redis://10.0.0.5:6379
  space up --ha

With --ha (also needs haproxy and redis-sentinel): the APIs listen on --api-port + 10 and + 11,
the routers on + 12 and + 13, Redis on 16379-16380 and its sentinels on 16390-16392 (password in
$SPACE_HOME/redis-ha/password). An API, router or Redis server that dies is started again; the
front takes it out meanwhile (docs/operations.md, "Redis failover").`,
    )
    .action(async (o: UpOptions, cmd: Command) => {
      process.exitCode = o.ha ? await runUpHa(o, isJson(cmd)) : await runUp(o, isJson(cmd));
    });
}

async function runUp(o: UpOptions, json: boolean): Promise<number> {
  const paths = localPaths(spaceHome());
  const localRedis = !o.redisUrl;

  checkPrerequisites(localRedis);
  await checkPortsFree(
    [
      ['API', o.apiPort],
      ['agent', o.agentPort],
      ...(o.router ? ([['router', o.routerPort]] as [string, number][]) : []),
      ...(localRedis ? ([['Redis', LOCAL_REDIS_PORT]] as [string, number][]) : []),
    ],
    paths.home,
  );

  await prepareHome(paths);
  enableIpv4Forwarding();
  const built = await buildLocalTemplate('base', DEFAULT_CACHE_DIR, (line) => note(`space: ${line}`));
  note(`space: template base ready${built.cached ? ' (cached)' : ''}`);
  // a VM driver boots the guest kernel the runtime image bakes: on a host it is prepared once (apt);
  // without it `auto` stays on gvisor and an explicit VM driver fails at boot, naming the path
  const driver = process.env['SPACE_DRIVER'] || 'auto';
  if (driver !== 'gvisor' && (driver !== 'auto' || existsSync('/dev/kvm')))
    await prepareLocalGuestKernel(DEFAULT_CACHE_DIR).then(
      (v) => note(`space: guest kernel ${v} ready`),
      (err: Error) => note(`space: no guest kernel for the VM drivers (${err.message})`),
    );

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
      ...apiEnv({
        port: o.apiPort,
        redisUrl: servicesRedisUrl,
        signingKey: paths.signingKey,
        apiKeyFile: paths.apiKey,
        ...(routerUrl ? { routerUrl } : {}),
      }),
    });
    if (routerUrl) {
      note(`space: starting the router on ${routerUrl} (command streams and files go through it)`);
      start('router', node, [fileURLToPath(new URL('../router/server.ts', import.meta.url))], {
        ...baseEnv,
        ...routerEnv({ port: o.routerPort, redisUrl: servicesRedisUrl, verifyKey: paths.verifyKey }),
      });
    }
    const gatewaySocket = gatewayFiles(paths.home).socket;
    rmSync(gatewaySocket, { force: true }); // a stale socket would look ready
    note('space: starting the egress gateway (sandboxes reach only what their egress policy allows)');
    start('gateway', node, [fileURLToPath(new URL('../gateway/server.ts', import.meta.url))], {
      ...baseEnv,
      ...gatewayEnv({ home: paths.home, redisUrl: servicesRedisUrl }),
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
        ...agentEnv({
          nodeId: LOCAL_NODE_ID,
          port: o.agentPort,
          redisUrl: servicesRedisUrl,
          verifyKey: paths.verifyKey,
          home: paths.home,
          cacheDir: DEFAULT_CACHE_DIR,
          warm: o.warm,
        }),
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
