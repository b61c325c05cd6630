import { existsSync, readFileSync } from 'node:fs';
import { mkdtemp, readdir, rm } from 'node:fs/promises';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { SpaceError } from '../../core/errors.ts';
import { GUEST_PORT } from '../../core/guest-protocol.ts';
import { directoryImage } from '../images.ts';
import { SandboxNetworks } from '../network.ts';
import { buildTemplate } from '../templates.ts';
import type { InstanceSpec, SandboxNetwork, TemplateImage } from './driver.ts';
import { type GvisorConfig, GvisorDriver, httpStatus } from './gvisor.ts';

/** Template cache shared with templates.int.test.ts (persists between runs). */
const CACHE = process.env['SPACE_TEST_CACHE'] ?? '/var/lib/space-test';
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

/** Resolves 'data' when the guest answered within `ms`, 'timeout' when it hung. */
function probe(host: string, ms: number): Promise<'data' | 'timeout' | 'error'> {
  return new Promise((resolve) => {
    const s = connect(GUEST_PORT, host);
    const t = setTimeout(() => {
      s.destroy();
      resolve('timeout');
    }, ms);
    s.on('connect', () => s.write('GET /health HTTP/1.0\r\n\r\n'));
    s.on('data', () => {
      clearTimeout(t);
      s.destroy();
      resolve('data');
    });
    s.on('error', () => {
      clearTimeout(t);
      resolve('error');
    });
  });
}

/** Everything the driver could leave behind for `id` (empty when clean). */
async function leftovers(id: string, netns: string): Promise<string[]> {
  const out: string[] = [];
  if ((await driver.runscStatus(id)) !== undefined) out.push('runsc container');
  if (readFileSync('/proc/self/mountinfo', 'utf8').includes(join(stateDir, 'instances', id)))
    out.push('mount');
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

describe('GvisorDriver (real runsc, ptrace)', () => {
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
    expect((await driver.list()).find((i) => i.instanceId === spec.instanceId)?.state).toBe('paused');
    expect(await probe(info.guest.host, 1500)).toBe('timeout');
    await driver.resume(spec.instanceId);
    expect(await probe(info.guest.host, 3000)).toBe('data');

    await driver.destroy(spec.instanceId);
    await driver.destroy(spec.instanceId); // idempotent
    await nets.release(spec.network);
    networks.delete(spec.instanceId);
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

  it('snapshot: SNAPSHOT_UNSUPPORTED by default (instance untouched); the experimental path reports why', async () => {
    const spec = await newSpec();
    await driver.create(spec);
    const err = await driver.snapshot(spec.instanceId, join(stateDir, 'snap')).catch((e: unknown) => e);
    expect((err as SpaceError).code).toBe('SNAPSHOT_UNSUPPORTED');
    expect(await httpStatus(spec.network.sandboxAddress, GUEST_PORT, '/health', 2000)).toBe(200);

    const experimental = new GvisorDriver(config({ experimentalSnapshots: true }));
    const dir = join(stateDir, 'snap2');
    const result = await experimental.snapshot(spec.instanceId, dir).catch((e: unknown) => e);
    if (result instanceof SpaceError) {
      expect(result.code).toBe('SNAPSHOT_UNSUPPORTED');
      console.log(`experimental snapshot: SNAPSHOT_UNSUPPORTED — ${result.message}`);
    } else {
      expect(result).toMatchObject({ instanceId: spec.instanceId, path: dir, driver: 'gvisor' });
      console.log(`experimental snapshot: ok, files ${(await readdir(dir)).join(', ')}`);
    }
    await cleanup(driver, spec.instanceId);
  }, 120_000);

  it.skipIf(!existsSync(join(RUNTIME_DIR, 'guest/main.ts')))(
    'boots the real guest daemon (default guestArgv: tini + node 24 + runtime/guest/main.ts)',
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
