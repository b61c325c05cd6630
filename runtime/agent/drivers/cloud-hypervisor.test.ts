import { existsSync, readFileSync, statSync } from 'node:fs';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import {
  cloudHypervisorLauncher,
  cloudHypervisorSpec,
  FakeCloudHypervisor,
  faultOnFirstLaunch,
  testImage,
  testRestoreSpec,
  testSpec,
} from '../../../test/vmm-fake.ts';
import {
  CH_API,
  type ChPaths,
  CloudHypervisorDriver,
  chCommand,
  chVmConfig,
  prefixToMask,
} from './cloud-hypervisor.ts';
import type { TemplateImage } from './driver.ts';
import { apiRequest } from './vmm-api.ts';
import { pidAlive } from './vmm-common.ts';

const paths: ChPaths = {
  kernel: '/img/vmlinux',
  initramfs: '/img/initrd.img',
  rootfs: '/img/rootfs.ext4',
  disk: '/st/cloud-hypervisor.vm/disk.img',
  serial: '/st/cloud-hypervisor.vm/serial.log',
};

describe('cloud-hypervisor pure parts', () => {
  it('vm.create body validates against VmConfig (closed objects), memory in bytes, disks in VM_DISKS order', () => {
    const image = { template: 'b', digest: 'd', lowerDirs: [] } as TemplateImage;
    const config = chVmConfig(testSpec('i-1', 'sp-1', image), paths);
    const v = cloudHypervisorSpec().schema('VmConfig');
    expect(v(config), JSON.stringify(v.errors)).toBe(true);
    expect(config.memory).toEqual({ size: 256 * 1024 * 1024 });
    expect(config.cpus).toEqual({ boot_vcpus: 2, max_vcpus: 2 });
    expect(config.disks).toEqual([
      { id: 'rootfs', path: '/img/rootfs.ext4', readonly: true },
      { id: 'disk', path: '/st/cloud-hypervisor.vm/disk.img', readonly: false },
    ]);
    expect(config.net).toEqual([
      { id: 'net0', tap: 'tap0', mac: '06:00:ac:1f:00:02', ip: '172.31.0.1', mask: '255.255.255.252' },
    ]);
    expect(prefixToMask(24)).toBe('255.255.255.0');
  });

  it('runs the VMM in the netns and a private mount namespace with vm/ on the fixed path', () => {
    const { cmd, args } = chCommand({
      binary: '/usr/local/bin/cloud-hypervisor',
      netns: 'sp-3',
      vmDir: '/st/cloud-hypervisor/i-1/vm',
      mountPoint: '/st/cloud-hypervisor.vm',
      apiSocket: '/st/cloud-hypervisor/i-1/api.sock',
    });
    expect(cmd).toBe('nsenter');
    expect(args.slice(0, 8)).toEqual([
      '--net=/var/run/netns/sp-3',
      '--',
      'unshare',
      '--mount',
      '--propagation',
      'private',
      '--',
      '/bin/sh',
    ]);
    expect(args.slice(8)).toEqual([
      '-c',
      'mount --bind "$1" "$2" && shift 2 && exec "$@"',
      'sh',
      '/st/cloud-hypervisor/i-1/vm',
      '/st/cloud-hypervisor.vm',
      '/usr/local/bin/cloud-hypervisor',
      '--api-socket',
      'path=/st/cloud-hypervisor/i-1/api.sock',
    ]);
  });
});

describe('CloudHypervisorDriver against the spec-checked fake', () => {
  let dir: string;
  let image: TemplateImage;
  let fakes: ReturnType<typeof cloudHypervisorLauncher>;
  let driver: CloudHypervisorDriver;

  const make = () =>
    new CloudHypervisorDriver({
      stateDir: join(dir, 'state'),
      cloudHypervisorBinary: '/usr/local/bin/cloud-hypervisor',
      launcher: fakes.launcher,
      waitForGuest: async () => {
        if (![...fakes.reg.fakes.values()].some((f) => f.vm?.state === 'Running'))
          throw new Error('guest never booted');
      },
    });
  const fakeOf = (id: string) => fakes.reg.fakes.get(join(dir, 'state', 'cloud-hypervisor', id, 'api.sock'))!;

  beforeEach(async () => {
    dir = await mkdtemp(join(tmpdir(), 'ch-test-'));
    image = testImage(dir);
    fakes = cloudHypervisorLauncher();
    driver = make();
  });
  afterEach(async () => {
    await fakes.reg.closeAll();
    await rm(dir, { recursive: true, force: true });
  });

  it('create → pause/resume → snapshot → restore in another namespace → adopt → destroy', async () => {
    const info = await driver.create(testSpec('i-one', 'sp-1', image));
    expect(info).toMatchObject({ instanceId: 'i-one', state: 'running', memoryMiB: 256 });
    const fake = fakeOf('i-one');
    expect(fake.violations).toEqual([]);
    expect(fake.calls.map((c) => `${c.method} ${c.path} ${c.status}`)).toEqual([
      `GET ${CH_API}/vmm.ping 200`,
      `PUT ${CH_API}/vm.create 204`,
      `PUT ${CH_API}/vm.boot 204`,
    ]);
    const created = fake.calls[1]!.body as { payload: Record<string, string>; disks: { path: string }[] };
    expect(created.payload.kernel).toBe(image.kernel!.vmlinux);
    expect(created.disks[1]!.path).toBe(join(dir, 'state', 'cloud-hypervisor.vm', 'disk.img'));
    expect(statSync(join(dir, 'state', 'cloud-hypervisor', 'i-one', 'vm', 'disk.img')).size).toBe(
      16 * 1048576,
    );
    expect(fakes.reg.launches[0]!.args[0]).toBe('--net=/var/run/netns/sp-1');

    await driver.pause('i-one');
    expect(fake.vm!.state).toBe('Paused');
    await driver.resume('i-one');
    expect(fake.vm!.state).toBe('Running');

    const snapDir = join(dir, 'snap');
    const ref = await driver.snapshot('i-one', snapDir);
    expect(fake.violations).toEqual([]);
    expect(fake.vm!.state).toBe('Running');
    expect(fake.calls.slice(-4).map((c) => c.path)).toEqual([
      `${CH_API}/vm.info`,
      `${CH_API}/vm.pause`,
      `${CH_API}/vm.snapshot`,
      `${CH_API}/vm.resume`,
    ]);
    expect(fake.calls.at(-2)!.body).toEqual({ destination_url: `file://${snapDir}` });
    for (const f of ['config.json', 'state.json', 'memory-ranges', 'disk.img', 'snapshot.json'])
      expect(existsSync(join(snapDir, f))).toBe(true);
    expect(JSON.parse(readFileSync(join(snapDir, 'snapshot.json'), 'utf8'))).toEqual(ref);

    const restored = await driver.restore(ref, testRestoreSpec('i-two', 'sp-2', image));
    expect(restored).toMatchObject({ instanceId: 'i-two', state: 'running' });
    const fake2 = fakeOf('i-two');
    // the snapshot's disk path resolved to i-two's own copy through its bind mount
    expect(fake2.violations).toEqual([]);
    expect(fake2.calls.map((c) => `${c.method} ${c.path} ${c.status}`)).toEqual([
      `GET ${CH_API}/vmm.ping 200`,
      `PUT ${CH_API}/vm.restore 204`,
    ]);
    expect(fake2.calls[1]!.body).toEqual({ source_url: `file://${snapDir}`, resume: true });
    expect(existsSync(join(dir, 'state', 'cloud-hypervisor', 'i-two', 'vm', 'disk.img'))).toBe(true);
    expect(fakes.reg.launches[1]!.args[0]).toBe('--net=/var/run/netns/sp-2');

    const again = make();
    expect((await again.list()).map((i) => [i.instanceId, i.state]).sort()).toEqual([
      ['i-one', 'running'],
      ['i-two', 'running'],
    ]);
    expect((await again.adopt('i-two')).pid).toBe(restored.pid);
    expect((await again.stats('i-two')).memoryBytes).toBeGreaterThan(0);

    await again.destroy('i-one');
    expect(fake.calls.at(-1)!.path).toBe(`${CH_API}/vmm.shutdown`);
    await again.destroy('i-one');
    expect(pidAlive(info.pid)).toBe(false);
    expect(existsSync(join(dir, 'state', 'cloud-hypervisor', 'i-one'))).toBe(false);
    await expect(again.adopt('i-one')).rejects.toMatchObject({ code: 'INSTANCE_LOST' });

    process.kill(restored.pid!, 'SIGKILL');
    await fake2.close();
    await expect(again.adopt('i-two')).rejects.toMatchObject({ code: 'INSTANCE_LOST' });
    await again.destroy('i-two');
    expect(await again.list()).toEqual([]);
  });

  it('a VMM error answer becomes DRIVER_FAILED with its text, and the unwind removes all it made', async () => {
    fakes.launcher = faultOnFirstLaunch(fakes.launcher, fakes.reg, {
      method: 'PUT',
      path: `${CH_API}/vm.boot`,
      status: 500,
      message: 'Error booting VM: InvalidPayload',
    });
    driver = make();
    const err = await driver.create(testSpec('i-bad', 'sp-1', image)).catch((e: unknown) => e);
    expect(err).toMatchObject({ code: 'DRIVER_FAILED' });
    expect((err as Error).message).toContain(
      'PUT /api/v1/vm.boot: HTTP 500 Error booting VM: InvalidPayload',
    );
    expect(pidAlive(fakes.reg.pids[0])).toBe(false);
    expect(existsSync(join(dir, 'state', 'cloud-hypervisor', 'i-bad'))).toBe(false);
  });

  it('preflight names the missing binary', async () => {
    const d = new CloudHypervisorDriver({ stateDir: dir, cloudHypervisorBinary: join(dir, 'nope') });
    await expect(d.preflight()).rejects.toThrow(
      `cloud-hypervisor not found or not executable at ${dir}/nope`,
    );
  });
});

describe('the Cloud Hypervisor fake itself holds the contract', () => {
  let dir: string;
  let fake: FakeCloudHypervisor;
  beforeEach(async () => {
    dir = await mkdtemp(join(tmpdir(), 'ch-fake-'));
    fake = new FakeCloudHypervisor(join(dir, 'api.sock'), (p) => p);
    await fake.listen();
    await writeFile(join(dir, 'vmlinux'), 'k');
  });
  afterEach(async () => {
    await fake.close();
    await rm(dir, { recursive: true, force: true });
  });
  const call = (path: string, body?: unknown) =>
    apiRequest(fake.socketPath, 'PUT', `${CH_API}/${path}`, body);

  it('rejects unknown fields, boot before create, snapshot while running, restore on a used VMM', async () => {
    const payload = { kernel: join(dir, 'vmlinux') };
    expect((await call('vm.boot')).status).toBe(404);
    expect((await call('vm.create', { payload, memory: { size: 1, bogus: true } })).status).toBe(400);
    expect((await call('vm.create', { payload })).status).toBe(204);
    expect((await call('vm.pause')).status).toBe(405); // created, not booted
    expect((await call('vm.boot')).status).toBe(204);
    expect((await call('vm.snapshot', { destination_url: `file://${dir}` })).status).toBe(405);
    expect((await call('vm.restore', { source_url: `file://${dir}` })).status).toBe(404);
    expect(fake.violations.length).toBe(5);
  });
});
