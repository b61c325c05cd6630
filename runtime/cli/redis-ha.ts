/**
 * Redis with automatic failover on one machine: data servers (a primary and `replicas` replicas,
 * Debian's `redis-server`) and three sentinels (Debian's `redis-sentinel`), all with one password.
 * `space up --ha` runs it, and so do the failover tests (test/failover.int.test.ts), which also
 * place a data server in a network namespace of their own (`wrap`, `announceIp`, `bind`) to cut it
 * off for real.
 *
 * Why Sentinel (docs/operations.md, "Redis failover", says the same for operators): it ships with
 * Redis in Debian (the same 7.0 server SPACE already runs), ioredis follows it natively, and the
 * Lua scripts keep working because every key stays on one primary (Redis Cluster is refused for
 * that reason). Valkey's Sentinel is the same design under another name; KeyDB's active
 * replication lets both servers accept writes, which our scripts' read-modify-write steps would
 * merge wrongly; an operator exists only in Kubernetes mode.
 *
 * Settings of every data server, the same on each because roles swap at a failover:
 * - `requirepass`/`masterauth`: the data servers talk to each other with the password; the
 *   sentinels have it too (`requirepass`, `sentinel auth-pass`, `sentinel sentinel-pass`).
 * - `min-replicas-to-write 1` with `min-replicas-max-lag` (default 10 s): a primary that has lost
 *   every replica (a partition, or the replica died) refuses writes (`NOREPLICAS`) after that lag,
 *   so a primary cut off from the sentinels stops taking writes the new primary will never see.
 *   The price: with one replica, losing the replica stops writes until it is back (run two
 *   replicas, `replicas: 2`, where that matters more than the spare machine).
 * - `appendonly yes`, `appendfsync everysec`: the replica keeps what it received on its disk, so a
 *   promoted replica that restarts does not come back empty (a primary that restarts empty would
 *   make its replicas drop their data: Redis's own replication-safety warning). The primary has it
 *   too because it becomes a replica after a failover.
 *
 * Sentinel timings (`downAfterMs`, default 3000; `failoverTimeoutMs`, default 15000): a dead
 * primary is replaced in about `downAfterMs` + an election (~1 s).
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { once } from 'node:events';
import { closeSync, existsSync, mkdirSync, openSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';
import { CliError } from './output.ts';
import { findExecutable } from './up-host.ts';

/** How a data server is placed: where it listens and what it tells others its address is. */
export interface DataPlacement {
  /** Addresses it binds (default: `[host]`). */
  bind?: string[];
  /** The address the others (sentinels, replicas, clients) use for it (default: `host`). */
  announceIp?: string;
  /** A command the server runs under, e.g. `['ip', 'netns', 'exec', 'ns1']` (must exec it). */
  wrap?: string[];
}

/** Options of {@link startRedisHa}. */
export interface RedisHaOptions {
  /** Folder for the configuration files, data and logs (one subfolder per server). */
  dir: string;
  /** The password of the data servers and of the sentinels (no `@`, `/`, `:` or space). */
  password: string;
  /** Ports: one per data server (the first is the first primary) and three for the sentinels. */
  ports: { data: number[]; sentinels: [number, number, number] };
  /** The primary's name in the sentinels' configuration. Default `space`. */
  primaryName?: string;
  /** Address everything listens on and is reached at by default. Default 127.0.0.1. */
  host?: string;
  /** Per data server (by index): its placement. */
  placement?: (index: number) => DataPlacement;
  /** Sentinel `down-after-milliseconds`, ms. Default 3000. */
  downAfterMs?: number;
  /** Sentinel `failover-timeout`, ms. Default 15000. */
  failoverTimeoutMs?: number;
  /** `min-replicas-max-lag`, seconds. Default 10. */
  minReplicasMaxLagSec?: number;
  /** Called when a server exits without `stop`/`kill` asking it to (name, exit code, signal). */
  onExit?: (name: string, code: number | null, signal: NodeJS.Signals | null) => void;
  /**
   * Start a server that died on its own again (as a service manager would). A sentinel comes back
   * at once; a data server only once the sentinels name another primary (it then rejoins as a
   * replica): a primary restarted from its append-only file before that may lack the last second
   * of writes its replica holds, and the replica would drop them to resynchronise. Default false.
   */
  restart?: boolean;
  /**
   * Keep configuration files that exist (Redis and Sentinel rewrite theirs at each role change,
   * so a topology started again resumes with the roles it last had, instead of making the first
   * server primary over a replica that may hold newer data). Default false: written afresh.
   */
  keepConfig?: boolean;
  /** Told each restart: (name, error or null). */
  onRestart?: (name: string, err: Error | null) => void;
}

/** One process of the topology. */
export interface HaServer {
  /** `redis-0`, `redis-1`… (data) or `sentinel-0`…`sentinel-2`. */
  name: string;
  kind: 'data' | 'sentinel';
  /** The address others reach it at. */
  host: string;
  port: number;
  logFile: string;
  /** The running process, or null after it exited. */
  proc: ChildProcess | null;
}

/** A started topology (see {@link startRedisHa}). */
export interface RedisHa {
  /** `redis-sentinel://:<password>@h:p,h:p,h:p/<primaryName>`: what SPACE_REDIS_URL takes. */
  url: string;
  primaryName: string;
  servers: HaServer[];
  /**
   * Waits until every sentinel names the same data server as primary, that server says it is the
   * primary, has `min` replicas in time (default: all other data servers that run) and every
   * sentinel knows the two others. Returns that server's name.
   * @throws CliError START_TIMEOUT after `timeoutMs` (default 60 s).
   */
  agreed(opts?: { timeoutMs?: number; minReplicas?: number }): Promise<string>;
  /** The data server the sentinels name as primary now (any one sentinel that answers), or null. */
  primary(): Promise<string | null>;
  /** Sends `signal` (default SIGKILL) to a server and waits until it has exited. */
  kill(name: string, signal?: NodeJS.Signals): Promise<void>;
  /**
   * Starts a server again with its configuration file (which Redis rewrote at each role change); a
   * data server another has replaced as primary starts as that one's replica.
   */
  start(name: string): Promise<void>;
  /** SIGTERM to the sentinels, then the data servers (SIGKILL after 10 s each); waits for all. */
  stop(): Promise<void>;
}

const STOP_TIMEOUT_MS = 10_000;

/**
 * Writes the configuration files and starts the data servers (the first as primary, the others
 * replicas of it) and the three sentinels (quorum 2). Resolves once each answers PING; call
 * `agreed()` to wait for the sentinels to agree.
 * @throws CliError PREREQUISITES when `redis-server` or `redis-sentinel` is not installed
 * (scripts/host-deps.sh installs both); START_TIMEOUT when a server does not answer in 30 s.
 */
export async function startRedisHa(o: RedisHaOptions): Promise<RedisHa> {
  if (/[@/:\s]/.test(o.password) || o.password === '')
    throw new Error('the Redis password must be non-empty without @, /, : or spaces');
  if (o.ports.data.length < 2) throw new Error('Redis HA needs at least two data servers');
  const serverBin = findExecutable('redis-server');
  const sentinelBin = findExecutable('redis-sentinel');
  if (!serverBin || !sentinelBin)
    throw new CliError(
      'PREREQUISITES',
      `Redis HA needs ${serverBin ? '' : 'redis-server '}${sentinelBin ? '' : 'redis-sentinel'}`.trim(),
      { hint: 'install them with: bash scripts/host-deps.sh' },
    );
  const host = o.host ?? '127.0.0.1';
  const name = o.primaryName ?? 'space';
  const pw = o.password;
  const place = (i: number): Required<DataPlacement> => {
    const p = o.placement?.(i) ?? {};
    return { bind: p.bind ?? [host], announceIp: p.announceIp ?? host, wrap: p.wrap ?? [] };
  };
  const servers: HaServer[] = [];
  const files = new Map<string, { bin: string; args: string[]; wrap: string[] }>();
  const primary0 = place(0);
  o.ports.data.forEach((port, i) => {
    const p = place(i);
    const sub = join(o.dir, `redis-${i}`);
    mkdirSync(sub, { recursive: true, mode: 0o700 });
    const conf = join(sub, 'redis.conf');
    if (!(o.keepConfig && existsSync(conf)))
      writeFileSync(
        conf,
        [
          `port ${port}`,
          `bind ${p.bind.join(' ')}`,
          'protected-mode no',
          `dir ${sub}`,
          'daemonize no',
          `requirepass ${pw}`,
          `masterauth ${pw}`,
          `replica-announce-ip ${p.announceIp}`,
          // a replica (re)joining is sent the data at once: the default 5 s wait for more replicas
          // to share one transfer would hold writes (min-replicas-to-write) that long after a failover
          'repl-diskless-sync-delay 0',
          'appendonly yes',
          'appendfsync everysec',
          'save ""',
          'min-replicas-to-write 1',
          `min-replicas-max-lag ${o.minReplicasMaxLagSec ?? 10}`,
          ...(i === 0 ? [] : [`replicaof ${primary0.announceIp} ${o.ports.data[0]}`]),
          '',
        ].join('\n'),
        { mode: 0o600 },
      );
    files.set(`redis-${i}`, { bin: serverBin, args: [conf], wrap: p.wrap });
    servers.push({
      name: `redis-${i}`,
      kind: 'data',
      host: p.announceIp,
      port,
      logFile: join(sub, 'redis.log'),
      proc: null,
    });
  });
  o.ports.sentinels.forEach((port, i) => {
    const sub = join(o.dir, `sentinel-${i}`);
    mkdirSync(sub, { recursive: true, mode: 0o700 });
    const conf = join(sub, 'sentinel.conf');
    if (!(o.keepConfig && existsSync(conf)))
      writeFileSync(
        conf,
        [
          `port ${port}`,
          `bind ${host}`,
          'protected-mode no',
          `dir ${sub}`,
          'daemonize no',
          `requirepass ${pw}`,
          `sentinel sentinel-pass ${pw}`,
          `sentinel announce-ip ${host}`,
          `sentinel monitor ${name} ${primary0.announceIp} ${o.ports.data[0]} 2`,
          `sentinel auth-pass ${name} ${pw}`,
          `sentinel down-after-milliseconds ${name} ${o.downAfterMs ?? 3000}`,
          `sentinel failover-timeout ${name} ${o.failoverTimeoutMs ?? 15_000}`,
          `sentinel parallel-syncs ${name} 1`,
          '',
        ].join('\n'),
        { mode: 0o600 },
      );
    files.set(`sentinel-${i}`, { bin: sentinelBin, args: [conf], wrap: [] });
    servers.push({
      name: `sentinel-${i}`,
      kind: 'sentinel',
      host,
      port,
      logFile: join(sub, 'sentinel.log'),
      proc: null,
    });
  });

  const expected = new Set<ChildProcess>();
  const launch = (s: HaServer, replicaOf?: HaServer) => {
    const f = files.get(s.name)!;
    const fd = openSync(s.logFile, 'a', 0o600);
    // a data server that comes back while another is primary starts as that one's replica: left
    // to the sentinels, it would serve as a primary of its own for ~10 s before they convert it,
    // and the real primary would refuse writes (min-replicas-to-write) all that time
    const as = replicaOf ? ['--replicaof', replicaOf.host, String(replicaOf.port)] : [];
    const [file, ...args] = [...f.wrap, f.bin, ...f.args, ...as];
    // own process group: a Ctrl-C in the terminal reaches `space up`, which stops us in order
    const proc = spawn(file!, args, { detached: true, stdio: ['ignore', fd, fd] });
    closeSync(fd);
    s.proc = proc;
    proc.once('exit', (code, signal) => {
      if (s.proc === proc) s.proc = null;
      if (expected.delete(proc)) return;
      o.onExit?.(s.name, code, signal);
      if (o.restart && !stopping) void restartLater(s);
    });
    proc.once('error', () => {
      if (s.proc === proc) s.proc = null;
    });
  };
  const answers = async (s: HaServer) => (await ask(s, pw, ['PING']).catch(() => null)) === 'PONG';
  const waitUp = async (s: HaServer) => {
    const deadline = Date.now() + 30_000;
    while (!(await answers(s))) {
      if (Date.now() > deadline)
        throw new CliError('START_TIMEOUT', `${s.name} did not answer PING in 30 s (log: ${s.logFile})`);
      await sleep(100);
    }
  };
  const byName = (n: string) => {
    const s = servers.find((x) => x.name === n);
    if (!s) throw new Error(`no server ${n} in this topology`);
    return s;
  };
  const stopOne = async (s: HaServer, signal: NodeJS.Signals) => {
    const proc = s.proc;
    if (!proc || proc.exitCode !== null || proc.signalCode !== null) return;
    expected.add(proc);
    const gone = once(proc, 'exit');
    proc.kill(signal);
    const t = sleep(STOP_TIMEOUT_MS).then(() => 'timeout' as const);
    if ((await Promise.race([gone, t])) === 'timeout') {
      proc.kill('SIGKILL');
      await gone;
    }
  };
  const primaryOf = async (s: HaServer): Promise<string | null> => {
    const addr = await ask(s, pw, ['SENTINEL', 'get-master-addr-by-name', name]).catch(() => null);
    if (!Array.isArray(addr)) return null;
    const found = servers.find((d) => d.kind === 'data' && d.host === addr[0] && String(d.port) === addr[1]);
    return found?.name ?? null;
  };

  let stopping = false;
  const restartLater = async (s: HaServer) => {
    const deadline = Date.now() + 2 * (o.failoverTimeoutMs ?? 15_000);
    let other: HaServer | undefined;
    if (s.kind === 'data') {
      // until another primary is named (or the sentinels never fail over: then it is the primary)
      while (!stopping && Date.now() < deadline) {
        const p = await primaryOfAny();
        if (p && p !== s.name) {
          other = servers.find((x) => x.name === p);
          break;
        }
        await sleep(250);
      }
    } else await sleep(1000);
    if (stopping || s.proc) return;
    launch(s, other);
    await waitUp(s).then(
      () => o.onRestart?.(s.name, null),
      (err: Error) => o.onRestart?.(s.name, err),
    );
  };
  const primaryOfAny = async () => {
    for (const s of sentinels) {
      const p = await primaryOf(s);
      if (p) return p;
    }
    return null;
  };

  const data = servers.filter((s) => s.kind === 'data');
  const sentinels = servers.filter((s) => s.kind === 'sentinel');
  try {
    for (const s of data) launch(s);
    await Promise.all(data.map(waitUp));
    for (const s of sentinels) launch(s);
    await Promise.all(sentinels.map(waitUp));
  } catch (err) {
    await Promise.all(servers.map((s) => stopOne(s, 'SIGKILL')));
    throw err;
  }

  const hosts = sentinels.map((s) => `${s.host}:${s.port}`).join(',');
  return {
    url: `redis-sentinel://:${pw}@${hosts}/${name}`,
    primaryName: name,
    servers,
    async agreed(opts = {}) {
      const deadline = Date.now() + (opts.timeoutMs ?? 60_000);
      let last = 'no sentinel answered';
      for (;;) {
        const named = await Promise.all(sentinels.map(primaryOf));
        const first = named[0];
        if (first && named.every((n) => n === first)) {
          const p = byName(first);
          const info = String((await ask(p, pw, ['INFO', 'replication']).catch(() => '')) ?? '');
          const role = /role:(\w+)/.exec(info)?.[1];
          // replicas that acknowledged within min-replicas-max-lag (the ones a write may count on)
          const replicas = Number(/min_slaves_good_slaves:(\d+)/.exec(info)?.[1] ?? 0);
          const want = opts.minReplicas ?? data.filter((d) => d !== p && d.proc).length;
          const peers = await Promise.all(
            sentinels.map((s) =>
              ask(s, pw, ['SENTINEL', 'sentinels', name]).then(
                (r) => (Array.isArray(r) ? r.length : 0),
                () => 0,
              ),
            ),
          );
          if (role === 'master' && replicas >= want && peers.every((n) => n >= 2)) return first;
          last = `${first}: role ${role ?? '?'}, ${replicas}/${want} replicas, sentinels know ${peers.join('/')} peers`;
        } else last = `the sentinels name ${named.map((n) => n ?? '-').join(', ')}`;
        if (Date.now() > deadline)
          throw new CliError('START_TIMEOUT', `the sentinels did not agree on a primary (${last})`);
        await sleep(250);
      }
    },
    primary: primaryOfAny,
    async kill(n, signal = 'SIGKILL') {
      await stopOne(byName(n), signal);
    },
    async start(n) {
      const s = byName(n);
      if (s.proc) throw new Error(`${n} is running`);
      // as a restart does: a data server that another has replaced comes back as its replica, not
      // as a second primary with its old data (the CI pre-check saw the sentinels name it again)
      const p = s.kind === 'data' ? await primaryOfAny() : null;
      launch(s, p && p !== s.name ? byName(p) : undefined);
      await waitUp(s);
    },
    async stop() {
      stopping = true;
      await Promise.all(sentinels.map((s) => stopOne(s, 'SIGTERM')));
      await Promise.all(data.map((s) => stopOne(s, 'SIGTERM')));
    },
  };
}

/** One command to one server with the password; the reply, or throws (1 s to connect and answer). */
async function ask(s: HaServer, password: string, command: string[]): Promise<unknown> {
  const c = new Redis({
    host: s.host,
    port: s.port,
    password,
    lazyConnect: true,
    connectTimeout: 1000,
    commandTimeout: 1000,
    maxRetriesPerRequest: 0,
    retryStrategy: () => null,
    enableOfflineQueue: false,
  });
  c.on('error', () => {});
  try {
    await c.connect();
    return await c.call(command[0]!, ...command.slice(1));
  } finally {
    c.disconnect();
  }
}
