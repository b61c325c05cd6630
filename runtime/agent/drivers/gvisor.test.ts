import { describe, expect, it } from 'vitest';
import type { InstanceSpec } from './driver.ts';
import {
  buildOciSpec,
  checkpointFailureReason,
  mapRunscStatus,
  overlayOptions,
  runscCheckpointArgs,
  runscCmdArgs,
  runscGlobalArgs,
  runscRunCommand,
} from './gvisor.ts';

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
    const g = runscGlobalArgs({ root: '/r', debugLogDir: '/d/logs' });
    expect(g).toEqual(['--root=/r', '--platform=ptrace', '--debug-log=/d/logs/']);
    expect(runscGlobalArgs({ root: '/r', debug: true })).toEqual([
      '--root=/r',
      '--platform=ptrace',
      '--debug',
    ]);
    expect(runscCmdArgs(['--root=/r'], ['kill'], 'i-1', ['KILL'])).toEqual([
      '--root=/r',
      'kill',
      'i-1',
      'KILL',
    ]);
    expect(runscCheckpointArgs(['--root=/r'], 'i-1', '/s')).toEqual([
      '--root=/r',
      'checkpoint',
      '--leave-running',
      '--image-path=/s',
      'i-1',
    ]);
    const run = runscRunCommand('runsc', ['--root=/r'], '/b', 'i-1');
    expect(run.cmd).toBe('unshare');
    expect(run.args.slice(-6)).toEqual(['runsc', '--root=/r', 'run', '--detach', '--bundle=/b', 'i-1']);
    expect(run.args.join(' ')).toMatch(/mount -t tmpfs .* \/proc\/sys\/net && exec "\$@"/);
  });

  it('builds the OCI spec with limits and netns path, and mounts nothing from the host', () => {
    const oci = buildOciSpec({
      spec,
      rootPath: '/s/rootfs',
      guestArgv: ['/opt/space/bin/tini', '--', 'x'],
    }) as {
      process: { args: string[]; user: { uid: number } };
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
      pids: { limit: 100 },
    });
    // only kernel filesystems: no bind mount of any host path
    expect(oci.mounts.map((m) => m.source).sort()).toEqual(['devpts', 'proc', 'shm', 'sysfs', 'tmpfs']);
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
