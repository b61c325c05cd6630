import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { cpSync, existsSync, readdirSync, readFileSync, statSync, truncateSync } from 'node:fs';
import { mkdtemp, readdir, rm } from 'node:fs/promises';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { formatFigures, measureGvisor } from '../../../benchmarks/gvisor-lib.ts';
import { TEST_CACHE_DIR } from '../../../test/cache-dir.ts';
import { probe } from '../../../test/guest-probe.ts';
import { pidsWhere } from '../../../test/host-processes.ts';
import { SpaceError } from '../../core/errors.ts';
import { GUEST_PORT } from '../../core/guest-protocol.ts';
import { GuestClient } from '../guest-client.ts';
import { SandboxNetworks } from '../host/network.ts';
import { directoryImage } from '../image/images.ts';
import { buildTemplate } from '../image/templates.ts';
import type { InstanceSpec, SandboxNetwork, TemplateImage } from './driver.ts';
import { httpStatus } from './guest-health.ts';
import { GvisorDriver } from './gvisor.ts';
import { DEFAULT_GVISOR_PLATFORM } from './gvisor-platform.ts';
import type { GvisorConfig } from './gvisor-runsc.ts';

/** Template cache shared with templates.int.test.ts (persists between runs). */
const CACHE = TEST_CACHE_DIR;
/** A pool of its own so this file never collides with other tests or a running agent. */
const nets = new SandboxNetworks({ pool: '10.79.1.0/24' });
const RUNTIME_DIR = fileURLToPath(new URL('../../', import.meta.url));
/** The repo's Node 24 (vitest itself may run on the system's Node 20, which cannot run .ts files). */
const NODE_24 = [
  fileURLToPath(new URL('../../../node_modules/node/bin/node', import.meta.url)),
  process.execPath,
].find((p) => existsSync(p))!;
/** Stand-in for the guest daemon until runtime/guest/main.ts exists: answers GET /health with 200. */
const STAND_IN_GUEST = [
  '/opt/space/bin/tini',
  '--',
  '/bin/sh',
  '-c',
  `mkdir -p /srv/g && echo ok > /srv/g/health && exec python3 -m http.server ${GUEST_PORT} --directory /srv/g`,
];

let stateDir = '';
let image: TemplateImage;
let driver: GvisorDriver;
const networks = new Map<string, SandboxNetwork>();
let seq = 0;

function config(extra: Partial<GvisorConfig> = {}): GvisorConfig {
  return {
    stateDir,
    guestArgv: STAND_IN_GUEST,
    ...extra,
  };
}

async function newSpec(memoryMiB = 256): Promise<InstanceSpec> {
  const instanceId = `i-gvt${process.pid % 1000}${(seq++).toString(36)}`;
  const network = await nets.allocate(instanceId);
  networks.set(instanceId, network);
  return {
    instanceId,
    guestToken: 'test-guest-token',
    diskMiB: 512,
    template: 'base',
    image,
    vcpus: 0.5,
    memoryMiB,
    pidsLimit: 128,
    network,
  };
}

async function cleanup(d: GvisorDriver, id: string): Promise<void> {
  await d.destroy(id).catch(() => {});
  const n = networks.get(id);
  if (n) await nets.release(n).catch(() => {});
  networks.delete(id);
}

/** Output of `sh -c script` run inside the instance (`runsc exec`). */
async function runscExec(id: string, script: string): Promise<string> {
  const { stdout } = await promisify(execFile)('runsc', [
    `--root=${join(stateDir, 'runsc')}`,
    'exec',
    id,
    '/bin/sh',
    '-c',
    script,
  ]);
  return stdout;
}

/** An IPv4 address as /proc/net/route prints it (little-endian hex, upper case). */
function hexAddress(ip: string): string {
  return ip
    .split('.')
    .reverse()
    .map((o) => Number(o).toString(16).padStart(2, '0'))
    .join('')
    .toUpperCase();
}

/**
 * An open HTTP/1.1 keep-alive connection to the guest after one /health exchange; `closed` settles
 * with 'reset' or 'closed' once the connection ends (or 'open' after 5 s).
 */
async function keepAliveConnection(host: string): Promise<{ closed: Promise<string> }> {
  const s = connect(GUEST_PORT, host);
  await new Promise<void>((resolve, reject) => {
    s.once('error', reject);
    s.once('connect', () => s.write('GET /health HTTP/1.1\r\nHost: g\r\nConnection: keep-alive\r\n\r\n'));
    s.once('data', () => resolve());
  });
  const closed = new Promise<string>((resolve) => {
    const t = setTimeout(() => {
      s.destroy();
      resolve('open');
    }, 5000);
    s.on('error', (e: NodeJS.ErrnoException) => {
      clearTimeout(t);
      resolve(e.code === 'ECONNRESET' ? 'reset' : e.message);
    });
    s.on('close', () => {
      clearTimeout(t);
      resolve('closed');
    });
  });
  return { closed };
}

/** Instance dirs, mounts under the state dir and runsc containers, for before/after comparisons. */
function listState(): string[] {
  const dirs = existsSync(join(stateDir, 'instances')) ? readdirSync(join(stateDir, 'instances')) : [];
  const mounts = readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .map((l) => l.split(' ')[4] ?? '')
    .filter((m) => m.startsWith(stateDir));
  return [...dirs.map((d) => `dir ${d}`), ...mounts.map((m) => `mount ${m}`)].sort();
}

/** Everything the driver could leave behind for `id` (empty when clean). */
/** The driver's state of instance `id` (undefined when it does not list it). */
async function stateOf(id: string): Promise<string | undefined> {
  return (await driver.list()).find((i) => i.instanceId === id)?.state;
}

/** Releases a destroyed instance's network, as the agent does after a destroy. */
async function releaseNetwork(spec: InstanceSpec): Promise<void> {
  await nets.release(spec.network);
  networks.delete(spec.instanceId);
}

async function leftovers(id: string, netns: string): Promise<string[]> {
  const out: string[] = [];
  if ((await driver.runscStatus(id)) !== undefined) out.push('runsc container');
  // the sandbox and gofer processes name their bundle (the instance dir) on their command line
  const bundle = join(stateDir, 'instances', id);
  for (const pid of await pidsWhere((cmd) => cmd.includes(bundle))) out.push(`process ${pid}`);
  if (readFileSync('/proc/self/mountinfo', 'utf8').includes(bundle)) out.push('mount');
  for (const c of await readdir('/sys/fs/cgroup')) {
    if (existsSync(join('/sys/fs/cgroup', c, 'space', id))) out.push(`cgroup ${c}`);
  }
  if (existsSync(join(stateDir, 'instances', id))) out.push('instance dir');
  if (existsSync(`/var/run/netns/${netns}`)) out.push('netns');
  return out;
}

beforeAll(async () => {
  await buildTemplate('base', { cacheDir: CACHE });
  image = await directoryImage('base', CACHE, { nodeBinary: NODE_24, tiniBinary: '/usr/bin/tini-static' });
  stateDir = await mkdtemp(join(tmpdir(), 'space-gvisor-'));
  driver = new GvisorDriver(config());
  await driver.preflight();
}, 20 * 60_000);

afterAll(async () => {
  for (const id of [...networks.keys()]) await cleanup(driver, id);
  if (stateDir) await rm(stateDir, { recursive: true, force: true });
}, 120_000);

describe(`GvisorDriver (real runsc, ${DEFAULT_GVISOR_PLATFORM})`, () => {
  it('creates, serves TCP, pauses, resumes, applies limits and destroys without leftovers', async () => {
    const spec = await newSpec(300);
    const info = await driver.create(spec);
    expect(info).toMatchObject({ instanceId: spec.instanceId, state: 'running' });
    expect(info.guest).toEqual({
      host: spec.network.sandboxAddress,
      port: GUEST_PORT,
      token: spec.guestToken,
    });
    expect(await httpStatus(info.guest.host, GUEST_PORT, '/health', 2000)).toBe(200);

    const mem = join('/sys/fs/cgroup/memory/space', spec.instanceId, 'memory.limit_in_bytes');
    expect(Number(readFileSync(mem, 'utf8'))).toBe(300 * 1024 * 1024);
    const quota = join('/sys/fs/cgroup/cpu/space', spec.instanceId, 'cpu.cfs_quota_us');
    expect(Number(readFileSync(quota, 'utf8'))).toBe(50_000);

    await driver.pause(spec.instanceId);
    expect(await stateOf(spec.instanceId)).toBe('paused');
    expect(await probe(info.guest.host, 1500)).toBe('timeout');
    await driver.resume(spec.instanceId);
    expect(await probe(info.guest.host, 3000)).toBe('data');

    await driver.destroy(spec.instanceId);
    await driver.destroy(spec.instanceId); // idempotent
    await releaseNetwork(spec);
    expect(await leftovers(spec.instanceId, spec.network.netns)).toEqual([]);
  }, 120_000);

  it('destroys a paused instance without leftovers', async () => {
    const spec = await newSpec();
    await driver.create(spec);
    await driver.pause(spec.instanceId);
    expect(await stateOf(spec.instanceId)).toBe('paused');
    await driver.destroy(spec.instanceId);
    await releaseNetwork(spec);
    expect(await leftovers(spec.instanceId, spec.network.netns)).toEqual([]);
  }, 120_000);

  it('re-adopts running instances through a fresh driver object', async () => {
    const spec = await newSpec();
    await driver.create(spec);
    const fresh = new GvisorDriver(config());
    const found = (await fresh.list()).find((i) => i.instanceId === spec.instanceId);
    expect(found).toMatchObject({ state: 'running', network: spec.network, template: 'base' });
    await fresh.destroy(spec.instanceId);
    expect((await fresh.list()).some((i) => i.instanceId === spec.instanceId)).toBe(false);
    await cleanup(driver, spec.instanceId);
  }, 120_000);

  it('fails with DRIVER_FAILED (runsc/guest logs in the message) and cleans up when the guest never answers', async () => {
    const bad = new GvisorDriver(
      config({ guestArgv: ['/bin/sh', '-c', 'echo guest-broke; exit 3'], healthTimeoutMs: 3000 }),
    );
    const spec = await newSpec();
    const err = await bad.create(spec).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(SpaceError);
    expect((err as SpaceError).code).toBe('DRIVER_FAILED');
    expect((err as SpaceError).message).toMatch(/guest-broke/);
    const n = spec.network;
    await cleanup(driver, spec.instanceId);
    expect(await leftovers(spec.instanceId, n.netns)).toEqual([]);
  }, 60_000);

  it('snapshot → restore into a new instance: its disk, its own new address, the snapshot token; the source keeps running', async () => {
    const real = new GvisorDriver(config({ guestArgv: undefined }));
    const spec = await newSpec(384);
    await real.create(spec);
    await runscExec(spec.instanceId, 'echo written-before-snapshot > /tmp/before.txt');

    const dir = join(stateDir, 'snap-a');
    const ref = await real.snapshot(spec.instanceId, dir);
    expect(ref).toMatchObject({
      driver: 'gvisor',
      instanceId: spec.instanceId,
      template: 'base',
      imageDigest: image.digest,
      path: dir,
      vcpus: spec.vcpus,
      memoryMiB: 384,
      diskMiB: spec.diskMiB,
      guestToken: spec.guestToken,
    });
    expect(JSON.parse(readFileSync(join(dir, 'snapshot.json'), 'utf8'))).toEqual(ref);
    expect((statSync(join(dir, 'snapshot.json')).mode & 0o777).toString(8)).toBe('600');
    // the source is running again, unchanged
    expect((await real.list()).find((i) => i.instanceId === spec.instanceId)?.state).toBe('running');
    expect(await httpStatus(spec.network.sandboxAddress, GUEST_PORT, '/health', 2000)).toBe(200);
    await runscExec(spec.instanceId, 'echo written-after-snapshot > /tmp/after.txt');

    const { vcpus: _v, memoryMiB: _m, diskMiB: _d, ...rest } = await newSpec();
    const restoreSpec = { ...rest, guestToken: randomBytes(32).toString('hex') };
    const info = await real.restore(ref, restoreSpec);
    expect(info).toMatchObject({
      instanceId: restoreSpec.instanceId,
      state: 'running',
      memoryMiB: 384,
      guest: { host: restoreSpec.network.sandboxAddress, port: GUEST_PORT, token: restoreSpec.guestToken },
    });
    // the guest woke up with the snapshot's token: rotate it to the one the driver recorded
    const old = new GuestClient({ ...info.guest, token: spec.guestToken });
    await old.rotateToken(restoreSpec.guestToken);
    await old.close();
    expect(restoreSpec.network.sandboxAddress).not.toBe(spec.network.sandboxAddress);
    // the restored guest answers at its new address with its new token, and has the file
    const read = await fetch(
      `http://${info.guest.host}:${GUEST_PORT}/files?path=${encodeURIComponent('/tmp/before.txt')}`,
      { headers: { authorization: `Bearer ${info.guest.token}` } },
    );
    expect(read.status).toBe(200);
    expect(await read.text()).toBe('written-before-snapshot\n');
    expect(await runscExec(restoreSpec.instanceId, 'cat /tmp/after.txt 2>&1 || true')).toMatch(
      /No such file/,
    );
    // gVisor's netstack took the new namespace's address and route
    expect(await runscExec(restoreSpec.instanceId, 'cat /proc/net/route')).toContain(
      hexAddress(restoreSpec.network.hostAddress),
    );
    const mem = join('/sys/fs/cgroup/memory/space', restoreSpec.instanceId, 'memory.limit_in_bytes');
    expect(Number(readFileSync(mem, 'utf8'))).toBe(384 * 1024 * 1024);

    // pause/resume work on the restored instance, and the source is unaffected
    await real.pause(restoreSpec.instanceId);
    expect(await probe(info.guest.host, 1500)).toBe('timeout');
    await real.resume(restoreSpec.instanceId);
    expect(await probe(info.guest.host, 3000)).toBe('data');
    expect(await httpStatus(spec.network.sandboxAddress, GUEST_PORT, '/health', 2000)).toBe(200);

    // pausing to disk: snapshot the (paused) source, destroy it, restore it later into a new network
    await real.pause(spec.instanceId);
    const refB = await real.snapshot(spec.instanceId, join(stateDir, 'snap-b'));
    const { vcpus: _v2, memoryMiB: _m2, diskMiB: _d2, ...again } = await newSpec();
    await cleanup(real, spec.instanceId);
    await real.restore(refB, again);
    expect(await runscExec(again.instanceId, 'cat /tmp/after.txt')).toBe('written-after-snapshot\n');

    for (const id of [restoreSpec.instanceId, again.instanceId]) {
      const n = networks.get(id)!;
      await cleanup(real, id);
      expect(await leftovers(id, n.netns)).toEqual([]);
    }
  }, 180_000);

  it('a checkpoint resets the connections the host holds to the guest (--net-disconnect-ok)', async () => {
    const spec = await newSpec();
    await driver.create(spec);
    const kept = await keepAliveConnection(spec.network.sandboxAddress);
    await driver.snapshot(spec.instanceId, join(stateDir, 'snap-kept'));
    expect(await kept.closed).toMatch(/reset|closed/);
    expect(await httpStatus(spec.network.sandboxAddress, GUEST_PORT, '/health', 2000)).toBe(200);
    await cleanup(driver, spec.instanceId);
  }, 120_000);

  it('snapshot of a paused instance leaves it paused; a bad target dir or a stopped instance fails cleanly', async () => {
    const spec = await newSpec();
    await driver.create(spec);
    await driver.pause(spec.instanceId);
    const dir = join(stateDir, 'snap-paused');
    await driver.snapshot(spec.instanceId, dir);
    expect(await stateOf(spec.instanceId)).toBe('paused');
    await driver.resume(spec.instanceId);
    expect(await probe(spec.network.sandboxAddress, 3000)).toBe('data');

    const exists = await driver.snapshot(spec.instanceId, dir).catch((e: unknown) => e);
    expect((exists as SpaceError).code).toBe('DRIVER_FAILED');
    expect(existsSync(join(dir, 'snapshot.json'))).toBe(true); // someone else's dir is not removed
    const gone = await driver.snapshot('i-gvtnothere', join(stateDir, 'snap-none')).catch((e: unknown) => e);
    expect((gone as SpaceError).code).toBe('DRIVER_FAILED');
    expect(existsSync(join(stateDir, 'snap-none'))).toBe(false);
    await cleanup(driver, spec.instanceId);
  }, 120_000);

  it('a failed restore undoes exactly what it made (network and snapshot untouched)', async () => {
    const spec = await newSpec();
    await driver.create(spec);
    const dir = join(stateDir, 'snap-c');
    const ref = await driver.snapshot(spec.instanceId, dir);
    await cleanup(driver, spec.instanceId);

    // another image's snapshot: refused before anything is made
    const { vcpus: _a, memoryMiB: _b, diskMiB: _c, ...rs } = await newSpec();
    const wrong = await driver.restore({ ...ref, imageDigest: 'f'.repeat(64) }, rs).catch((e: unknown) => e);
    expect((wrong as SpaceError).code).toBe('DRIVER_FAILED');
    expect(await leftovers(rs.instanceId, 'not-a-netns')).toEqual([]);

    // a corrupt checkpoint image: runsc restore fails after disk, mounts and bundle were made
    const bad = join(stateDir, 'snap-c-bad');
    cpSync(dir, bad, { recursive: true });
    truncateSync(join(bad, 'checkpoint.img'), 4096);
    const before = listState();
    const err = await driver.restore({ ...ref, path: bad }, rs).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(SpaceError);
    expect((err as SpaceError).code).toBe('DRIVER_FAILED');
    expect((err as SpaceError).message).toMatch(/restore/);
    expect(await leftovers(rs.instanceId, 'not-a-netns')).toEqual([]);
    expect(listState()).toEqual(before);
    expect(existsSync(`/var/run/netns/${rs.network.netns}`)).toBe(true); // the caller's to release
    expect(readdirSync(bad).sort()).toEqual(readdirSync(dir).sort());

    // the good snapshot still restores into the same id and network afterwards
    await driver.restore(ref, rs);
    expect(await httpStatus(rs.network.sandboxAddress, GUEST_PORT, '/health', 2000)).toBe(200);
    await cleanup(driver, rs.instanceId);
  }, 120_000);

  // a measurement, not a check: `npm run bench:gvisor` prints the same figures for both platforms;
  // SPACE_TEST_MEASURE=1 runs it here too (it takes ~50 s)
  it.skipIf(!process.env.SPACE_TEST_MEASURE)(
    'measures cold create, snapshot-restore create and pause/resume beside the runsc floor (printed)',
    async () => {
      const f = await measureGvisor({
        platform: DEFAULT_GVISOR_PLATFORM,
        runs: 3,
        stateDir: join(stateDir, 'measure'),
        image,
        nets,
        idPrefix: 'gvm',
      });
      console.log(`gvisor lifecycle, medians of ${f.runs} (ms):\n${formatFigures([f])}`);
      expect(f.restoreCreate).toHaveLength(3);
    },
    300_000,
  );

  it.skipIf(!existsSync(join(RUNTIME_DIR, 'guest/main.ts')))(
    'boots the real guest daemon (default guestArgv: tini + node 24 + the bundled runtime/guest/main.ts)',
    async () => {
      const real = new GvisorDriver(config({ guestArgv: undefined }));
      const spec = await newSpec(512);
      const t = performance.now();
      await real.create(spec);
      console.log(`real guest create() ms: ${(performance.now() - t).toFixed(0)}`);
      const res = await fetch(`http://${spec.network.sandboxAddress}:${GUEST_PORT}/health`);
      expect(res.status).toBe(200);
      expect(await res.json()).toMatchObject({ ok: true });
      await cleanup(real, spec.instanceId);
    },
    120_000,
  );
});
