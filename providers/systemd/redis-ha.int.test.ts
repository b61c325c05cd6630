/**
 * The vm-mode Redis failover as rendered, run for real: three "control VMs" (network namespaces
 * on one bridge, addresses in the stack's private network) each start the rendered `space-redis`
 * and `space-sentinel` scripts with the rendered redis.conf and sentinel.conf (only their paths
 * moved into a temporary directory; Debian's redis-server 7.0), and a fourth ("a node") uses the
 * `SPACE_REDIS_URL` its own rendering got, through the runtime's client
 * (runtime/core/redis-connection.ts). Then the primary is killed (SIGKILL): the sentinels promote a
 * replica, the node's client writes through the new primary, and the old primary's VM, restarted
 * with the same script, comes back as a replica of the new one.
 */
import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { until as waitUntil } from '../../runtime/cli/up-supervise.ts';
import { bridgedLan, redisCliIn } from '../../test/netns-lan.ts';
import { agentPlan, controlPlan } from './cloud-init.ts';
import type { VmHa, VmPlan } from './plan.ts';

const run = promisify(execFile);
const CIDR = '10.213.7.0/24';
const ADDRS = ['10.213.7.10', '10.213.7.11', '10.213.7.12'];
const NODE_ADDR = '10.213.7.21';
const PASSWORD = `ha-test-${randomBytes(8).toString('hex')}`;
const ha: VmHa = { controlVms: 3, controlAddresses: ADDRS, initialPrimary: ADDRS[0]! };
const NODE = join(import.meta.dirname, '../../node_modules/.bin/node');
const CLIENT = join(import.meta.dirname, '../../runtime/core/redis-connection.ts');
const tag = randomBytes(2).toString('hex');
const hub = `rhub${tag}`;
const vms = [0, 1, 2].map((i) => `rha${i}${tag}`);
const nodeNs = `rhan${tag}`;
const procs: ChildProcess[] = [];
const cleanups: (() => Promise<unknown>)[] = [];
let dir: string;

const fileOf = (plan: VmPlan, path: string) => plan.files.find((f) => f.path === path)!.content;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** `redis-cli` in namespace `ns` against `host:port`, with the password. */
const cli = (ns: string, host: string, port: number, ...args: string[]) =>
  redisCliIn(ns, PASSWORD, host, port, ...args);

/** Polls `f` until it answers true, at most 60 s. */
const until = (what: string, f: () => Promise<boolean>) => waitUntil(what, 60_000, f);

/** Starts a rendered script of VM `i` in its namespace (stdout and stderr to its log). */
async function startScript(i: number, name: 'space-redis' | 'space-sentinel'): Promise<ChildProcess> {
  const log = await import('node:fs').then((fs) => fs.openSync(join(dir, `vm${i}`, `${name}.log`), 'a'));
  const p = spawn('ip', ['netns', 'exec', vms[i]!, 'sh', join(dir, `vm${i}`, name)], {
    stdio: ['ignore', log, log],
  });
  procs.push(p);
  return p;
}

/** The node's client (the runtime's): SET then GET `key` through `url`; prints the value read. */
async function clientRoundTrip(url: string, key: string, value: string): Promise<string> {
  const code = `import { redisConnection } from ${JSON.stringify(CLIENT)};
const r = redisConnection(process.env.URL, { maxRetriesPerRequest: 20 });
await r.set(${JSON.stringify(key)}, ${JSON.stringify(value)});
process.stdout.write(String(await r.get(${JSON.stringify(key)})));
r.disconnect();`;
  const { stdout } = await run('ip', ['netns', 'exec', nodeNs, NODE, '--input-type=module', '-e', code], {
    env: { ...process.env, URL: url },
    timeout: 60_000,
  });
  return stdout;
}

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'space-redis-ha-'));
  cleanups.push(() => rm(dir, { recursive: true, force: true }));
  // the private network: a bridge in a namespace of its own, each VM's namespace joined by a veth
  await bridgedLan(
    hub,
    [...vms.map((ns, i) => ({ ns, addr: ADDRS[i]! })), { ns: nodeNs, addr: NODE_ADDR }],
    cleanups,
  );
  // each control VM's rendering, its paths moved under the temporary directory
  const common = {
    version: '1.0.0',
    imageRepository: 'registry.example/space',
    privateCidr: CIDR,
    redisPassword: PASSWORD,
    ha,
  };
  for (let i = 0; i < 3; i++) {
    const plan = controlPlan({
      ...common,
      routerUrl: 'http://router.example:8082',
      self: { address: ADDRS[i]!, signingKey: 'unused here' },
    });
    const d = join(dir, `vm${i}`);
    await run('mkdir', ['-p', d]);
    const moved = (text: string) =>
      text
        .replaceAll('/etc/space/redis.conf', join(d, 'redis.conf'))
        .replaceAll('/var/lib/redis/sentinel.conf', join(d, 'sentinel.conf'))
        .replaceAll('dir /var/lib/redis', `dir ${d}`);
    await writeFile(join(d, 'redis.conf'), moved(fileOf(plan, '/etc/space/redis.conf')), { mode: 0o600 });
    await writeFile(join(d, 'space-redis'), moved(fileOf(plan, '/usr/local/sbin/space-redis')));
    await writeFile(join(d, 'space-sentinel'), moved(fileOf(plan, '/usr/local/sbin/space-sentinel')));
    // the unit's ExecStartPre: the template, once
    await writeFile(join(d, 'sentinel.conf.new'), moved(fileOf(plan, '/etc/space/sentinel.conf')), {
      mode: 0o600,
    });
  }
}, 120_000);

afterAll(async () => {
  for (const p of procs) if (p.exitCode === null) p.kill('SIGKILL');
  await sleep(300);
  for (const c of cleanups.reverse()) await c().catch(() => undefined);
});

describe('vm-mode Redis with three control VMs, rendered scripts under real redis-server', () => {
  it('forms a primary with two replicas; a killed primary is replaced; the node keeps writing; the old primary rejoins as a replica', async () => {
    const sentinels: ChildProcess[] = [];
    const servers: ChildProcess[] = [];
    for (let i = 0; i < 3; i++) sentinels.push(await startScript(i, 'space-sentinel'));
    for (let i = 0; i < 3; i++) servers.push(await startScript(i, 'space-redis'));
    // the first control VM leads a new deployment; the others replicate it
    await until('two replicas in sync', async () =>
      (await cli(vms[0]!, ADDRS[0]!, 6379, 'INFO', 'replication')).includes('connected_slaves:2'),
    );
    await until('every sentinel sees the two others and both replicas', async () => {
      for (let i = 0; i < 3; i++) {
        const info = await cli(vms[i]!, ADDRS[i]!, 26379, 'INFO', 'sentinel');
        if (!/status=ok,address=10\.213\.7\.10:6379,slaves=2,sentinels=3/.test(info)) return false;
      }
      return true;
    });
    // a node's rendering: the three sentinels, through the runtime's client
    const nodePlan = agentPlan({
      version: '1.0.0',
      imageRepository: 'registry.example/space',
      privateCidr: CIDR,
      redisPassword: PASSWORD,
      ha,
      controlAddress: ADDRS[0]!,
      pool: {
        name: 'default',
        driver: 'gvisor',
        instanceType: 't',
        count: 1,
        labels: {},
        allowUnverifiedKvm: false,
      },
    });
    const url = /^SPACE_REDIS_URL=(.*)$/m.exec(fileOf(nodePlan, '/etc/space/redis.env'))![1]!;
    expect(url).toBe(`redis-sentinel://:${PASSWORD}@${ADDRS.map((a) => `${a}:26379`).join(',')}/space`);
    // min-replicas-to-write 1: writes once a replica has acknowledged (INFO min_slaves_good_slaves)
    const goodReplicas = async (i: number) =>
      Number(
        /min_slaves_good_slaves:(\d+)/.exec(
          await cli(vms[i]!, ADDRS[i]!, 6379, 'INFO', 'replication'),
        )?.[1] ?? 0,
      );
    await until('the primary counts its replicas good', async () => (await goodReplicas(0)) >= 1);
    expect(await clientRoundTrip(url, 'before', 'one')).toBe('one');

    // the primary's server dies
    servers[0]!.kill('SIGKILL');
    let promoted = '';
    await until('a replica promoted', async () => {
      promoted = (await cli(vms[1]!, ADDRS[1]!, 26379, 'SENTINEL', 'get-master-addr-by-name', 'space')).split(
        '\n',
      )[0]!;
      return promoted === ADDRS[1] || promoted === ADDRS[2];
    });
    const i = ADDRS.indexOf(promoted);
    expect((await cli(vms[i]!, promoted, 6379, 'ROLE')).split('\n')[0]).toBe('master');
    // it refuses writes (NOREPLICAS) until the other replica follows it
    await until('the new primary counts a replica good', async () => (await goodReplicas(i)) >= 1);
    // the node's client finds the new primary; what was written before is there
    expect(await clientRoundTrip(url, 'after', 'two')).toBe('two');
    expect(await cli(vms[i]!, promoted, 6379, 'GET', 'before')).toBe('one');

    // the first VM's Redis starts again from the same script: the sentinels name the new primary
    await startScript(0, 'space-redis');
    await until('the old primary back as a replica of the new one', async () => {
      const role = (await cli(vms[0]!, ADDRS[0]!, 6379, 'ROLE')).split('\n');
      return role[0] === 'slave' && role[1] === promoted && role[3] === 'connected';
    });
    expect(await cli(vms[0]!, ADDRS[0]!, 6379, 'GET', 'after')).toBe('two');
    const log = await readFile(join(dir, 'vm0', 'space-redis.log'), 'utf8');
    expect(log).toContain(`space-redis: ${ADDRS[0]} starts; primary ${promoted}`);
  }, 240_000);
});
