import { describe, expect, it } from 'vitest';
import type { InstanceSpec } from './driver.ts';
import { GvisorDriver } from './gvisor.ts';
import { guestProcessLimit, hostTaskLimit, shmSizeMiB, tmpSizeMiB } from './gvisor-limits.ts';
import { DEFAULT_GVISOR_PLATFORM } from './gvisor-platform.ts';
import {
  buildOciSpec,
  checkpointFailureReason,
  MIN_RUNSC_RELEASE,
  mapRunscStatus,
  overlayOptions,
  runscCheckpointArgs,
  runscCmdArgs,
  runscGlobalArgs,
  runscRelease,
  runscRestoreCommand,
  runscRunCommand,
} from './gvisor-runsc.ts';

const spec: InstanceSpec = {
  instanceId: 'i-abc',
  guestToken: 'tok',
  diskMiB: 512,
  template: 'base',
  image: { template: 'base', digest: 'd', lowerDirs: ['/cache/guest/layer', '/cache/base/rootfs'] },
  vcpus: 1.5,
  memoryMiB: 512,
  pidsLimit: 100,
  network: {
    netns: 'sp-abc',
    hostIf: 'spvabc',
    hostAddress: '10.77.0.1',
    sandboxAddress: '10.77.0.2',
    prefixLength: 30,
  },
};

describe('gvisor pure helpers', () => {
  it('builds runsc argv', () => {
    const g = runscGlobalArgs({ root: '/r', platform: 'ptrace', debugLogDir: '/d/logs' });
    expect(g).toEqual([
      '--root=/r',
      '--platform=ptrace',
      '--net-disconnect-ok',
      '--overlay2=none',
      '--debug-log=/d/logs/',
    ]);
    expect(runscGlobalArgs({ root: '/r', debug: true })).toEqual([
      '--root=/r',
      `--platform=${DEFAULT_GVISOR_PLATFORM}`,
      '--net-disconnect-ok',
      '--overlay2=none',
      '--debug',
    ]);
    expect(runscCmdArgs(['--root=/r'], ['delete', '--force'], 'i-1')).toEqual([
      '--root=/r',
      'delete',
      '--force',
      'i-1',
    ]);
    expect(runscCheckpointArgs(['--root=/r'], 'i-1', '/s', 'none')).toEqual([
      '--root=/r',
      'checkpoint',
      '--leave-running',
      '--image-path=/s',
      '--compression=none',
      'i-1',
    ]);
    const restore = runscRestoreCommand('runsc', ['--root=/r'], '/b', '/snap', 'i-2');
    expect(restore.cmd).toBe('unshare');
    expect(restore.args.slice(-8)).toEqual([
      'runsc',
      '--root=/r',
      'restore',
      '--detach',
      '--bundle=/b',
      '--image-path=/snap',
      '--pid-file=/b/sandbox.pid',
      'i-2',
    ]);
    expect(restore.args.join(' ')).toMatch(/mount -t tmpfs .* \/proc\/sys\/net && exec "\$@"/);
    const run = runscRunCommand('runsc', ['--root=/r'], '/b', 'i-1');
    expect(run.cmd).toBe('unshare');
    expect(run.args.slice(-7)).toEqual([
      'runsc',
      '--root=/r',
      'run',
      '--detach',
      '--bundle=/b',
      '--pid-file=/b/sandbox.pid',
      'i-1',
    ]);
    expect(run.args.join(' ')).toMatch(/mount -t tmpfs .* \/proc\/sys\/net && exec "\$@"/);
  });

  it('advertises snapshot/restore only when configured to', () => {
    expect(new GvisorDriver({ stateDir: '/x' }).capabilities).toMatchObject({
      snapshot: false,
      restore: false,
    });
    expect(new GvisorDriver({ stateDir: '/x', snapshots: true }).capabilities).toMatchObject({
      snapshot: true,
      restore: true,
    });
    expect(new GvisorDriver({ stateDir: '/x' }).capabilities.snapshot).toBe(false);
  });

  it('keys snapshots by what a checkpoint holds beyond the image: guest argv and platform', () => {
    const base = new GvisorDriver({ stateDir: '/x', snapshots: true });
    expect(base.snapshotKey).toMatch(/^[0-9a-f]{16}$/);
    // settings a checkpoint does not hold leave the key alone
    expect(new GvisorDriver({ stateDir: '/y', snapshots: true, healthTimeoutMs: 5 }).snapshotKey).toBe(
      base.snapshotKey,
    );
    const argv = new GvisorDriver({ stateDir: '/x', guestArgv: ['/bin/node', '--jitless', '/main.cjs'] });
    expect(argv.snapshotKey).not.toBe(base.snapshotKey);
    expect(new GvisorDriver({ stateDir: '/x', platform: 'ptrace' }).snapshotKey).not.toBe(
      new GvisorDriver({ stateDir: '/x', platform: 'systrap' }).snapshotKey,
    );
  });

  it('reads the runsc release date from --version output', () => {
    expect(runscRelease('runsc version 0.0~20240729.0\nspec: 1.2.0\n')).toBe(20240729);
    expect(runscRelease('runsc version release-20250512.0\nspec: 1.1.0\n')).toBe(20250512);
    expect(runscRelease('runsc version 0.0~20221219.0\n')! < MIN_RUNSC_RELEASE).toBe(true);
    expect(runscRelease('something else')).toBeUndefined();
  });

  it('builds the OCI spec with limits and netns path, and mounts nothing from the host', () => {
    const oci = buildOciSpec({
      spec,
      rootPath: '/s/rootfs',
      guestArgv: ['/opt/space/bin/tini', '--', 'x'],
    }) as {
      process: { args: string[]; user: { uid: number }; rlimits: unknown[] };
      root: { path: string; readonly: boolean };
      hostname: string;
      mounts: { destination: string; source: string; options?: string[] }[];
      linux: {
        cgroupsPath: string;
        namespaces: { type: string; path?: string }[];
        resources: {
          cpu: { quota: number; period: number };
          memory: { limit: number };
          pids: { limit: number };
        };
      };
    };
    expect(oci.process.args).toEqual(['/opt/space/bin/tini', '--', 'x']);
    expect(oci.process.user.uid).toBe(0);
    expect(oci.root).toEqual({ path: '/s/rootfs', readonly: false });
    expect(oci.hostname).toBe('sandbox');
    expect(oci.linux.cgroupsPath).toBe('/space/i-abc');
    expect(oci.linux.namespaces).toContainEqual({ type: 'network', path: '/var/run/netns/sp-abc' });
    expect(oci.linux.resources).toEqual({
      cpu: { quota: 150_000, period: 100_000 },
      memory: { limit: 512 * 1024 * 1024 },
      pids: { limit: 100 * 16 + 256 },
    });
    expect(oci.process.rlimits).toContainEqual({ type: 'RLIMIT_NPROC', hard: 100, soft: 100 });
    expect(oci.mounts).toContainEqual(expect.objectContaining({ destination: '/tmp', type: 'tmpfs' }));
    expect(JSON.stringify(oci.mounts)).toContain('size=256m');
    // only kernel filesystems: no bind mount of any host path
    expect(oci.mounts.map((m) => m.source).sort()).toEqual([
      'devpts',
      'proc',
      'shm',
      'sysfs',
      'tmp',
      'tmpfs',
    ]);
    expect(oci.mounts.some((m) => (m as { type?: string }).type === 'bind')).toBe(false);
  });

  it('overlay options, status mapping, checkpoint error', () => {
    expect(overlayOptions(['/g', '/l'], '/u', '/w')).toBe('lowerdir=/g:/l,upperdir=/u,workdir=/w');
    expect(() => overlayOptions(['/l,x'], '/u', '/w')).toThrow();
    expect(() => overlayOptions(['/l:x'], '/u', '/w')).toThrow();
    expect(() => overlayOptions([], '/u', '/w')).toThrow();
    expect(mapRunscStatus('running')).toBe('running');
    expect(mapRunscStatus('paused')).toBe('paused');
    expect(mapRunscStatus(undefined)).toBe('stopped');
    expect(
      checkpointFailureReason(
        'checkpoint failed: x: encoding error at object tcp.endpoint{...}: save rejected due to unsupported networking state: endpoint cannot be saved in connected state: local 1:2, remote 3:4:\ngoroutine 1',
      ),
    ).toMatch(/^save rejected due to unsupported networking state/);
  });
});

describe('sandbox limits', () => {
  it('the process limit follows memory up to pidsLimit; the host limit stays above it', () => {
    expect(guestProcessLimit({ memoryMiB: 512, pidsLimit: 1024 })).toBe(256);
    expect(guestProcessLimit({ memoryMiB: 8192, pidsLimit: 1024 })).toBe(1024);
    expect(guestProcessLimit({ memoryMiB: 64, pidsLimit: 1024 })).toBe(256);
    expect(guestProcessLimit({ memoryMiB: 64, pidsLimit: 100 })).toBe(100);
    // R13's fork loop (1,100 sleeps) meets the guest's limit, never the host's
    const n = guestProcessLimit({ memoryMiB: 512, pidsLimit: 1024 });
    expect(n).toBeLessThan(1100);
    expect(hostTaskLimit(n)).toBeGreaterThan(n * 9); // up to ~8.6 host tasks per guest process measured
    expect(tmpSizeMiB(512)).toBe(256);
  });

  it('every memory-backed filesystem the user can write is sized, together within the sandbox memory (R20)', () => {
    expect(shmSizeMiB(512)).toBe(128);
    expect(shmSizeMiB(16)).toBe(8);
    for (const memoryMiB of [64, 256, 512, 4096]) {
      const oci = buildOciSpec({
        spec: { ...spec, memoryMiB },
        rootPath: '/r',
        guestArgv: ['/init'],
      }) as { mounts: { destination: string; type: string; options?: string[] }[] };
      // `/dev` is root's alone (mode 755; gVisor ignores a size there)
      expect(oci.mounts.find((m) => m.destination === '/dev')?.options).toContain('mode=755');
      const tmpfs = oci.mounts.filter((m) => m.type === 'tmpfs' && m.destination !== '/dev');
      expect(tmpfs.map((m) => m.destination).sort()).toEqual(['/dev/shm', '/tmp']);
      const mib = tmpfs.map((m) => {
        const size = m.options?.find((o) => o.startsWith('size='));
        expect(size, `${m.destination} has a size`).toBeDefined();
        const [, n, unit] = /^size=(\d+)([km])$/.exec(size!)!;
        return Number(n) / (unit === 'k' ? 1024 : 1);
      });
      expect(mib.reduce((a, b) => a + b, 0)).toBeLessThanOrEqual(Math.max(64, memoryMiB) * 0.8);
    }
  });
});
