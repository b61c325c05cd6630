import { existsSync, readFileSync, statSync } from 'node:fs';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import {
  argAfter,
  type FakeFirecracker,
  type FakeRegistry,
  faultOnFirstLaunch,
  firecrackerLauncher,
  firecrackerSpec,
  testImage,
  testRestoreSpec,
  testSpec,
} from '../../../test/vmm-fake.ts';
import type { TemplateImage } from './driver.ts';
import {
  bootRequests,
  FirecrackerDriver,
  JAIL_FILES,
  jailerArgs,
  jailPaths,
  VMM_OVERHEAD_MIB,
} from './firecracker.ts';
import { pidAlive } from './vmm-common.ts';

describe('jailer command line and chroot layout (reference/firecracker.md §6)', () => {
  const inputs = {
    id: 'i-abc123',
    firecrackerBinary: '/usr/local/bin/firecracker',
    uid: 100001,
    gid: 100000,
    chrootBaseDir: '/srv/jailer',
    netns: 'sp-7',
    cgroupVersion: 2 as const,
    parentCgroup: 'space',
    vcpus: 2,
    memoryMiB: 512,
    diskMiB: 1024,
  };

  it('names the id, exec file, uid/gid, chroot base, netns path and cgroup v2 limits', () => {
    const a = jailerArgs(inputs);
    expect(argAfter(a, '--id')).toBe('i-abc123');
    expect(argAfter(a, '--exec-file')).toBe('/usr/local/bin/firecracker');
    expect(argAfter(a, '--uid')).toBe('100001');
    expect(argAfter(a, '--gid')).toBe('100000');
    expect(argAfter(a, '--chroot-base-dir')).toBe('/srv/jailer');
    expect(argAfter(a, '--netns')).toBe('/var/run/netns/sp-7');
    expect(argAfter(a, '--cgroup-version')).toBe('2');
    expect(argAfter(a, '--parent-cgroup')).toBe('space');
    const cgroups = a.flatMap((x, i) => (x === '--cgroup' ? [a[i + 1]] : []));
    expect(cgroups).toEqual([`memory.max=${(512 + VMM_OVERHEAD_MIB) * 1048576}`, 'cpu.max=200000 100000']);
    const limits = a.flatMap((x, i) => (x === '--resource-limit' ? [a[i + 1]] : []));
    expect(limits).toEqual([`fsize=${(1024 + VMM_OVERHEAD_MIB) * 1048576}`, 'no-file=2048']);
    expect(a).toContain('--new-pid-ns');
    expect(a).not.toContain('--daemonize');
    // Firecracker's own arguments follow `--`; the socket is a path inside the chroot
    expect(a.slice(a.indexOf('--') + 1)).toEqual(['--api-sock', '/run/firecracker.socket']);
    // the jailer's flags all come before `--`
    expect(a.indexOf('--new-pid-ns')).toBeLessThan(a.indexOf('--'));
  });

  it('uses cgroup v1 file names under v1', () => {
    const a = jailerArgs({ ...inputs, cgroupVersion: 1 });
    const cgroups = a.flatMap((x, i) => (x === '--cgroup' ? [a[i + 1]] : []));
    expect(cgroups).toEqual([
      `memory.limit_in_bytes=${(512 + VMM_OVERHEAD_MIB) * 1048576}`,
      'cpu.cfs_period_us=100000',
      'cpu.cfs_quota_us=200000',
    ]);
  });

  it('puts the chroot at <base>/<exec file name>/<id>/root with socket and pid file inside', () => {
    const p = jailPaths('/srv/jailer', '/opt/fc/firecracker-v1.16.1', 'i-1');
    expect(p.jailDir).toBe('/srv/jailer/firecracker-v1.16.1/i-1');
    expect(p.root).toBe('/srv/jailer/firecracker-v1.16.1/i-1/root');
    expect(p.apiSocket).toBe('/srv/jailer/firecracker-v1.16.1/i-1/root/run/firecracker.socket');
    expect(p.pidFile).toBe('/srv/jailer/firecracker-v1.16.1/i-1/root/firecracker.pid');
  });

  it('every boot body validates against the spec (closed objects) and names chroot-relative files', () => {
    const spec = firecrackerSpec();
    const image = { template: 'b', digest: 'd', lowerDirs: [] } as TemplateImage;
    for (const [method, path, body] of bootRequests(testSpec('i-1', 'sp-1', image), true)) {
      const op = spec.operation(method, path);
      expect(op, `${method} ${path}`).toBeDefined();
      const v = spec.bodyValidator(op!.op)!;
      expect(v(body), `${path}: ${JSON.stringify(v.errors)}`).toBe(true);
      for (const [k, val] of Object.entries(body as object))
        if (k.endsWith('_path') || k === 'path_on_host') expect(val).not.toMatch(/^\//);
    }
  });
});

describe('FirecrackerDriver against the spec-checked fake', () => {
  let dir: string;
  let image: TemplateImage;
  let fakes: ReturnType<typeof firecrackerLauncher>;
  let driver: FirecrackerDriver;
  let guestWaits: string[];

  const make = () =>
    new FirecrackerDriver({
      stateDir: join(dir, 'state'),
      firecrackerBinary: '/usr/local/bin/firecracker',
      jailerBinary: '/usr/local/bin/jailer',
      launcher: fakes.launcher,
      cgroupVersion: 2,
      metrics: true,
      // the guest "answers" once the fake VM runs
      waitForGuest: async (host) => {
        guestWaits.push(host);
        const running = [...fakes.reg.fakes.values()].some((f) => f.state === 'Running');
        if (!running) throw new Error('guest never booted');
      },
    });
  const fakeOf = (reg: FakeRegistry<FakeFirecracker>, id: string) =>
    [...reg.fakes.values()].find((f) => f.root.includes(`/${id}/`))!;

  beforeEach(async () => {
    dir = await mkdtemp(join(tmpdir(), 'fc-test-'));
    image = testImage(dir);
    fakes = firecrackerLauncher();
    guestWaits = [];
    driver = make();
  });
  afterEach(async () => {
    await fakes.reg.closeAll();
    await rm(dir, { recursive: true, force: true });
  });

  it('cold boot → pause/resume → snapshot → restore in another namespace → adopt → destroy', async () => {
    const spec = testSpec('i-one', 'sp-1', image);
    const info = await driver.create(spec);
    expect(info).toMatchObject({ instanceId: 'i-one', state: 'running', vcpus: 2, memoryMiB: 256 });
    expect(info.guest).toMatchObject({ host: '10.77.0.2', token: 'token-of-i-one' });
    const fake = fakeOf(fakes.reg, 'i-one');
    expect(fake.violations).toEqual([]);
    expect(fake.calls.map((c) => `${c.method} ${c.path} ${c.status}`)).toEqual([
      'GET / 200',
      'PUT /logger 204',
      'PUT /metrics 204',
      'PUT /machine-config 204',
      'PUT /boot-source 204',
      'PUT /drives/rootfs 204',
      'PUT /drives/disk 204',
      'PUT /network-interfaces/eth0 204',
      'PUT /actions 204',
    ]);
    expect(fake.configured.get('/network-interfaces/{iface_id}:eth0')).toMatchObject({
      host_dev_name: 'tap0',
      guest_mac: '06:00:ac:1f:00:02',
    });
    expect(fake.configured.get('/machine-config')).toEqual({ vcpu_count: 2, mem_size_mib: 256, smt: false });

    // the jail: template files hard-linked, the disk uid-owned 0600, socket and pid inside
    const root = fake.root;
    expect(root).toBe(join(dir, 'state', 'jailer', 'firecracker', 'i-one', 'root'));
    expect(statSync(join(root, JAIL_FILES.rootfs)).ino).toBe(statSync(image.rootfsImage!).ino);
    expect(statSync(join(root, JAIL_FILES.kernel)).ino).toBe(statSync(image.kernel!.vmlinux!).ino);
    const disk = statSync(join(root, JAIL_FILES.disk));
    expect(disk.uid).toBe(100_001);
    expect(disk.mode & 0o777).toBe(0o600);
    expect(disk.size).toBe(16 * 1048576);
    expect(statSync(join(root, 'run')).uid).toBe(100_001);
    const launch = fakes.reg.launches[0]!;
    expect(launch.cmd).toBe('/usr/local/bin/jailer');
    expect(launch.args[launch.args.indexOf('--netns') + 1]).toBe('/var/run/netns/sp-1');

    await driver.pause('i-one');
    expect(fake.state).toBe('Paused');
    await driver.resume('i-one');
    expect(fake.state).toBe('Running');

    const snapDir = join(dir, 'snap');
    const ref = await driver.snapshot('i-one', snapDir);
    expect(fake.violations).toEqual([]);
    expect(fake.state).toBe('Running'); // paused for the snapshot, resumed after
    const snapCalls = fake.calls.slice(-4).map((c) => `${c.method} ${c.path}`);
    expect(snapCalls).toEqual(['GET /', 'PATCH /vm', 'PUT /snapshot/create', 'PATCH /vm']);
    expect(ref).toMatchObject({ driver: 'firecracker', imageDigest: 'd1g35t', vcpus: 2, memoryMiB: 256 });
    for (const f of ['vm.state', 'memory', 'disk.img', 'snapshot.json'])
      expect(existsSync(join(snapDir, f))).toBe(true);
    expect(statSync(join(snapDir, 'memory')).mode & 0o777).toBe(0o440);
    expect(statSync(join(snapDir, 'memory')).gid).toBe(100_000);
    expect(JSON.parse(readFileSync(join(snapDir, 'snapshot.json'), 'utf8'))).toEqual(ref);

    const restored = await driver.restore(ref, testRestoreSpec('i-two', 'sp-2', image));
    expect(restored).toMatchObject({ instanceId: 'i-two', state: 'running', vcpus: 2 });
    // the new instance's own token, recorded for adopt; the guest inside holds the snapshot's
    // ('token-of-i-one') until the caller rotates it
    expect(restored.guest.token).toBe('new-token');
    const fake2 = fakeOf(fakes.reg, 'i-two');
    expect(fake2.violations).toEqual([]);
    expect(fake2.calls.map((c) => `${c.method} ${c.path} ${c.status}`)).toEqual([
      'GET / 200',
      'PUT /logger 204',
      'PUT /metrics 204',
      'PUT /snapshot/load 204',
    ]);
    expect(fake2.calls.at(-1)!.body).toEqual({
      snapshot_path: 'snapshot/vm.state',
      mem_backend: { backend_type: 'File', backend_path: 'snapshot/memory' },
      track_dirty_pages: false,
      resume_vm: true,
    });
    expect(statSync(join(fake2.root, JAIL_FILES.snapMemory)).ino).toBe(statSync(join(snapDir, 'memory')).ino);
    expect(statSync(join(fake2.root, JAIL_FILES.disk)).uid).toBe(100_002); // a uid of its own
    const launch2 = fakes.reg.launches[1]!;
    expect(launch2.args[launch2.args.indexOf('--netns') + 1]).toBe('/var/run/netns/sp-2');

    // an agent restart: a new driver object finds both and re-attaches
    const again = make();
    const listed = await again.list();
    expect(listed.map((i) => [i.instanceId, i.state]).sort()).toEqual([
      ['i-one', 'running'],
      ['i-two', 'running'],
    ]);
    expect((await again.adopt('i-one')).pid).toBe(info.pid);
    expect((await again.stats('i-one')).memoryBytes).toBeGreaterThan(0);

    // its VMM dies: adopt says so
    process.kill(restored.pid!, 'SIGKILL');
    await fake2.close();
    await expect(again.adopt('i-two')).rejects.toMatchObject({ code: 'INSTANCE_LOST' });

    await again.destroy('i-one');
    await again.destroy('i-one'); // idempotent
    expect(pidAlive(info.pid)).toBe(false);
    expect(existsSync(join(dir, 'state', 'jailer', 'firecracker', 'i-one'))).toBe(false);
    expect(existsSync(join(dir, 'state', 'firecracker', 'i-one'))).toBe(false);
    await again.destroy('i-two');
    expect(await again.list()).toEqual([]);
  });

  it('a 400 {fault_message} becomes DRIVER_FAILED with that message, and everything made is undone', async () => {
    fakes.launcher = faultOnFirstLaunch(fakes.launcher, fakes.reg, {
      method: 'PUT',
      path: '/boot-source',
      status: 400,
      message: 'Invalid kernel path: no such file',
    });
    driver = make();
    const err = await driver.create(testSpec('i-bad', 'sp-1', image)).catch((e: unknown) => e);
    expect(err).toMatchObject({ code: 'DRIVER_FAILED' });
    expect((err as Error).message).toContain('PUT /boot-source: HTTP 400 Invalid kernel path: no such file');
    expect(pidAlive(fakes.reg.pids[0])).toBe(false);
    expect(existsSync(join(dir, 'state', 'jailer', 'firecracker', 'i-bad'))).toBe(false);
    expect(existsSync(join(dir, 'state', 'firecracker', 'i-bad'))).toBe(false);
    // the uid was given back
    await driver.create(testSpec('i-good', 'sp-1', image));
    expect(statSync(join(dir, 'state', 'jailer', 'firecracker', 'i-good', 'root', 'disk.img')).uid).toBe(
      100_001,
    );
  });

  it('a failure before launch unwinds only what was made and never starts the VMM', async () => {
    const broken = { ...image, kernel: { ...image.kernel!, initrd: join(dir, 'missing-initrd') } };
    const err = await driver.create(testSpec('i-x', 'sp-1', broken)).catch((e: unknown) => e);
    expect(err).toMatchObject({ code: 'DRIVER_FAILED' });
    expect((err as Error).message).toContain('missing-initrd');
    expect(fakes.reg.launches).toEqual([]);
    expect(existsSync(join(dir, 'state', 'jailer', 'firecracker', 'i-x'))).toBe(false);
    expect(existsSync(join(dir, 'state', 'firecracker', 'i-x'))).toBe(false);
    expect(existsSync(image.rootfsImage!)).toBe(true); // the template's files are untouched
  });

  it('refuses shapes Firecracker cannot run and images without a vmlinux, before making anything', async () => {
    const odd = { ...testSpec('i-odd', 'sp-1', image), vcpus: 3 };
    await expect(driver.create(odd)).rejects.toThrow(/1 or an even number of vCPUs/);
    const noElf = { ...image, kernel: { ...image.kernel!, vmlinux: undefined } };
    await expect(driver.create(testSpec('i-bz', 'sp-1', noElf))).rejects.toThrow(/uncompressed vmlinux/);
    expect(fakes.reg.launches).toEqual([]);
  });

  it('a snapshot of a paused instance leaves it paused; restore refuses another image', async () => {
    await driver.create(testSpec('i-p', 'sp-1', image));
    await driver.pause('i-p');
    const ref = await driver.snapshot('i-p', join(dir, 's'));
    expect(fakeOf(fakes.reg, 'i-p').state).toBe('Paused');
    const other = { ...image, digest: 'other' };
    await expect(
      driver.restore(ref, { ...testSpec('i-q', 'sp-2', other), instanceId: 'i-q' }),
    ).rejects.toThrow(/needs image d1g35t/);
  });

  it('preflight names every missing binary', async () => {
    const d = new FirecrackerDriver({
      stateDir: dir,
      firecrackerBinary: join(dir, 'no-firecracker'),
      jailerBinary: join(dir, 'no-jailer'),
    });
    const err = await d.preflight().catch((e: unknown) => e);
    expect(err).toMatchObject({ code: 'DRIVER_FAILED' });
    expect((err as Error).message).toContain(
      `firecracker not found or not executable at ${dir}/no-firecracker`,
    );
    expect((err as Error).message).toContain(`jailer not found or not executable at ${dir}/no-jailer`);
  });
});

describe('the Firecracker fake itself holds the contract', () => {
  let dir: string;
  let fake: FakeFirecracker;
  beforeEach(async () => {
    dir = await mkdtemp(join(tmpdir(), 'fc-fake-'));
    const { FakeFirecracker: F } = await import('../../../test/vmm-fake.ts');
    fake = new F(join(dir, 'api.sock'), dir);
    await fake.listen();
    await writeFile(join(dir, 'vmlinux'), 'k');
  });
  afterEach(async () => {
    await fake.close();
    await rm(dir, { recursive: true, force: true });
  });
  const put = async (method: string, path: string, body: unknown) => {
    const { apiRequest } = await import('./vmm-api.ts');
    return apiRequest(fake.socketPath, method, path, body);
  };

  it('rejects unknown fields, config after start, snapshot create while running, load after config', async () => {
    expect((await put('PUT', '/machine-config', { vcpu_count: 1, mem_size_mib: 128, extra: 1 })).status).toBe(
      400,
    );
    expect((await put('PUT', '/machine-config', { vcpu_count: 1, mem_size_mib: 128 })).status).toBe(204);
    const load = { snapshot_path: 's', mem_backend: { backend_type: 'File', backend_path: 'm' } };
    expect((await put('PUT', '/snapshot/load', load)).text).toContain('fresh Firecracker process');
    expect((await put('PUT', '/actions', { action_type: 'InstanceStart' })).status).toBe(400); // no boot source
    expect((await put('PUT', '/boot-source', { kernel_image_path: 'vmlinux' })).status).toBe(204);
    expect((await put('PUT', '/actions', { action_type: 'InstanceStart' })).status).toBe(204);
    expect((await put('PUT', '/boot-source', { kernel_image_path: 'vmlinux' })).status).toBe(400);
    const snap = { snapshot_path: 's', mem_file_path: 'm' };
    expect((await put('PUT', '/snapshot/create', snap)).text).toContain('paused');
    expect((await put('PATCH', '/vm', { state: 'Frozen' })).status).toBe(400); // not in the enum
    expect(fake.violations.length).toBe(6);
  });
});

describe('createDriver', () => {
  it('builds both VMM drivers from the node configuration', async () => {
    const { createDriver } = await import('./index.ts');
    const { CloudHypervisorDriver } = await import('./cloud-hypervisor.ts');
    const c = {
      driver: 'auto' as const,
      kvm: 'auto' as const,
      gvisorPlatform: 'ptrace' as const,
      gvisorSnapshots: 'off' as const,
      runscBinary: 'runsc',
      qemuBinary: 'qemu-system-x86_64',
      firecrackerBinary: '/opt/fc/firecracker',
      jailerBinary: '/opt/fc/jailer',
      cloudHypervisorBinary: '/opt/ch/cloud-hypervisor',
    };
    const fc = createDriver('firecracker', c, { stateDir: '/s' }, true);
    expect(fc).toBeInstanceOf(FirecrackerDriver);
    expect(fc.capabilities).toMatchObject({
      snapshot: true,
      restore: true,
      network: 'tap',
      guestLinks: ['tcp', 'vsock'],
    });
    expect(createDriver('cloud-hypervisor', c, { stateDir: '/s' }, true)).toBeInstanceOf(
      CloudHypervisorDriver,
    );
  });
});
