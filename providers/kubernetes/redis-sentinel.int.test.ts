/**
 * The Kubernetes Sentinel scripts as rendered, run for real: each pod (three data servers, three
 * sentinels) is a network namespace on one bridge, and the cluster DNS names the scripts use
 * (`space-redis-<i>.space-redis.<ns>.svc`, the sentinels' headless names, the
 * `space-redis-sentinel` Service) are a hosts file `ip netns exec` mounts into each
 * (/etc/netns/<name>/hosts, ip-netns(8)); the Service stands in as the first sentinel's address.
 * Debian's redis-server 7.0 runs them (`redis-sentinel` is that binary in Sentinel mode). A client
 * pod uses the URL the `space-redis` Secret carries, through the runtime's client. The primary is
 * killed; a replica is promoted; the client writes on; the old primary's pod, restarted with
 * the server script, rejoins as a replica; a restarted sentinel finds and monitors the new primary.
 */
import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdirSync, openSync } from 'node:fs';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { until as waitUntil } from '../../runtime/cli/up-supervise.ts';
import { bridgedLan, redisCliIn } from '../../test/netns-lan.ts';
import { sentinelScript, serverScript } from './redis-sentinel.ts';

const run = promisify(execFile);
const NS = 't';
const PASSWORD = `k8s-ha-${randomBytes(8).toString('hex')}`;
const NODE = join(import.meta.dirname, '../../node_modules/.bin/node');
const CLIENT = join(import.meta.dirname, '../../runtime/core/redis-connection.ts');
const tag = randomBytes(2).toString('hex');
const hub = `rkh${tag}`;
const server = (i: number) => `space-redis-${i}.space-redis.${NS}.svc`;
const pods = [
  ...[0, 1, 2].map((i) => ({ pod: `space-redis-${i}`, ns: `rks${i}${tag}`, addr: `10.213.8.${10 + i}` })),
  ...[0, 1, 2].map((i) => ({
    pod: `space-redis-sentinel-${i}`,
    ns: `rkt${i}${tag}`,
    addr: `10.213.8.${20 + i}`,
  })),
  { pod: 'client', ns: `rkc${tag}`, addr: '10.213.8.30' },
];
const HOSTS = [
  '127.0.0.1 localhost',
  ...pods.slice(0, 3).map((p, i) => `${p.addr} ${server(i)}`),
  ...pods.slice(3, 6).map((p) => `${p.addr} ${p.pod}.space-redis-sentinel-headless.${NS}.svc`),
  // the Service (kube-proxy would balance over the ready sentinels): the first sentinel here
  `${pods[3]!.addr} space-redis-sentinel space-redis-sentinel.${NS}.svc`,
  '',
].join('\n');
const procs: ChildProcess[] = [];
const cleanups: (() => Promise<unknown>)[] = [];
let dir: string;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** `redis-cli` in namespace `ns` against `host:port`, with the password. */
const cli = (ns: string, host: string, port: number, ...args: string[]) =>
  redisCliIn(ns, PASSWORD, host, port, ...args);

/** Polls `f` until it answers true, at most 60 s. */
const until = (what: string, f: () => Promise<boolean>) => waitUntil(what, 60_000, f);

/** Starts pod `k`'s script (the server or the sentinel script) as the container would: HOSTNAME, REDIS_PASSWORD, /data. */
function startPod(k: number): ChildProcess {
  const p = pods[k]!;
  const data = join(dir, p.pod);
  mkdirSync(data, { recursive: true });
  const log = openSync(join(dir, `${p.pod}.log`), 'a');
  const script = join(dir, k < 3 ? 'server.sh' : 'sentinel.sh');
  const child = spawn('ip', ['netns', 'exec', p.ns, 'sh', script], {
    cwd: data,
    env: { ...process.env, HOSTNAME: p.pod, REDIS_PASSWORD: PASSWORD, DATA: data },
    stdio: ['ignore', log, log],
  });
  procs.push(child);
  return child;
}

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'space-k8s-sentinel-'));
  cleanups.push(() => rm(dir, { recursive: true, force: true }));
  await bridgedLan(hub, pods, cleanups);
  for (const p of pods) {
    // the pod's /etc/hosts: ip netns exec mounts /etc/netns/<name>/hosts over it
    const etc = `/etc/netns/${p.ns}`;
    mkdirSync(etc, { recursive: true });
    cleanups.push(() => rm(etc, { recursive: true, force: true }));
    await writeFile(join(etc, 'hosts'), HOSTS);
  }
  // the rendered scripts; only the sentinel's /data (an emptyDir in the pod) moves to $DATA
  await writeFile(join(dir, 'server.sh'), serverScript(NS));
  await writeFile(join(dir, 'sentinel.sh'), sentinelScript(NS, 3, 3).replaceAll('/data/', '$DATA/'));
}, 120_000);

afterAll(async () => {
  for (const p of procs) if (p.exitCode === null) p.kill('SIGKILL');
  await sleep(300);
  for (const c of cleanups.reverse()) await c().catch(() => undefined);
});

describe('Kubernetes Redis with Sentinel: the rendered scripts under real redis-server', () => {
  it('pod 0 leads a new deployment; a killed primary is replaced; clients follow; restarted pods rejoin', async () => {
    const started = pods.slice(0, 6).map((_, k) => startPod(k));
    const [s0] = [started[0]!];
    const podNs = (k: number) => pods[k]!.ns;
    await until('two replicas in sync with space-redis-0', async () =>
      (await cli(podNs(0), server(0), 6379, 'INFO', 'replication')).includes('connected_slaves:2'),
    );
    await until('every sentinel sees the others and both replicas', async () => {
      for (const k of [3, 4, 5]) {
        const info = await cli(podNs(k), '127.0.0.1', 26379, 'INFO', 'sentinel');
        if (!info.includes(`status=ok,address=${server(0)}:6379,slaves=2,sentinels=3`)) return false;
      }
      return true;
    });
    // the URL the space-redis Secret carries, through the runtime's client, from a client pod
    const url = `redis-sentinel://:${PASSWORD}@space-redis-sentinel.${NS}.svc:26379/space`;
    const roundTrip = async (key: string, value: string) => {
      const code = `import { redisConnection } from ${JSON.stringify(CLIENT)};
const r = redisConnection(process.env.URL, { maxRetriesPerRequest: 20 });
await r.set(${JSON.stringify(key)}, ${JSON.stringify(value)});
process.stdout.write(String(await r.get(${JSON.stringify(key)})));
r.disconnect();`;
      const { stdout } = await run(
        'ip',
        ['netns', 'exec', pods[6]!.ns, NODE, '--input-type=module', '-e', code],
        {
          env: { ...process.env, URL: url },
          timeout: 60_000,
        },
      );
      return stdout;
    };
    // min-replicas-to-write 1: a primary takes writes once a replica has acknowledged within 10 s
    // (INFO's min_slaves_good_slaves, refreshed each second), not at the moment it connects
    const goodReplicas = async (k: number, host: string) =>
      Number(
        /min_slaves_good_slaves:(\d+)/.exec(await cli(podNs(k), host, 6379, 'INFO', 'replication'))?.[1] ?? 0,
      );
    await until('the primary counts its replicas good', async () => (await goodReplicas(0, server(0))) >= 1);
    expect(await roundTrip('before', 'one')).toBe('one');

    s0.kill('SIGKILL');
    let promoted = '';
    await until('a replica promoted', async () => {
      promoted = (
        await cli(podNs(3), '127.0.0.1', 26379, 'SENTINEL', 'get-master-addr-by-name', 'space')
      ).split('\n')[0]!;
      return promoted === server(1) || promoted === server(2);
    });
    // the new primary refuses writes (NOREPLICAS) until the other replica follows it
    const k = promoted === server(1) ? 1 : 2;
    await until('the new primary counts a replica good', async () => (await goodReplicas(k, promoted)) >= 1);
    expect(await roundTrip('after', 'two')).toBe('two');

    // the pod restarts (same name, same volume): the server script asks the sentinels and follows
    startPod(0);
    await until('space-redis-0 back as a replica of the new primary', async () => {
      const role = (await cli(podNs(0), server(0), 6379, 'ROLE')).split('\n');
      return role[0] === 'slave' && role[1] === promoted && role[3] === 'connected';
    });
    expect(await cli(podNs(0), server(0), 6379, 'GET', 'after')).toBe('two');

    // a sentinel pod replaced (a new emptyDir): the sentinel script asks the Service and monitors the new primary
    started[5]!.kill('SIGKILL');
    await rm(join(dir, 'space-redis-sentinel-2'), { recursive: true, force: true });
    startPod(5);
    await until('the new sentinel monitors the new primary with the others', async () =>
      (await cli(podNs(5), '127.0.0.1', 26379, 'INFO', 'sentinel')).includes(
        `status=ok,address=${promoted}:6379,slaves=2,sentinels=3`,
      ),
    );
  }, 300_000);
});
