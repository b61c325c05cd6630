/**
 * The Cloud Hypervisor driver: one `cloud-hypervisor` process per instance, driven over its REST API
 * on a Unix socket (`--api-socket`), base path `/api/v1` (Cloud Hypervisor's OpenAPI
 * description, https://github.com/cloud-hypervisor/cloud-hypervisor/blob/main/vmm/src/api/openapi/cloud-hypervisor.yaml:
 * `servers` and `paths`; bodies are `components/schemas`).
 *
 * Cold boot: `PUT vm.create` ({@link chVmConfig}), then `PUT vm.boot`. Restore: a fresh process, then
 * `PUT vm.restore` (`RestoreConfig` with `source_url` and `resume: true`). Pause/resume: `vm.pause` /
 * `vm.resume`. Snapshot: `vm.snapshot` (`VmSnapshotConfig.destination_url`, `file://<dir>`) while
 * paused. Stop: `vmm.shutdown`, then the process is killed.
 *
 * Stable paths for snapshots: Cloud Hypervisor records the disk and serial paths in its snapshot, so a
 * restore into a new instance must find its own files at the same paths. Each VMM therefore runs in a
 * private mount namespace where the instance's `vm/` directory is bind-mounted on one fixed path,
 * `<stateDir>/cloud-hypervisor.vm` ({@link chCommand}); it also runs inside the sandbox's network
 * namespace, where `network.ts` made `tap0` (same name and guest address in every namespace).
 * ```
 * <stateDir>/cloud-hypervisor/<id>/   instance.json, console.log (VMM output), api.sock
 *   vm/disk.img vm/serial.log         seen by the VMM as <stateDir>/cloud-hypervisor.vm/…
 * ```
 * The template image, kernel and initrd are used in place (read-only, content-addressed, so the same
 * paths on every instance of an image). A snapshot directory holds Cloud Hypervisor's own files, a copy
 * of `disk.img` and `snapshot.json`.
 *
 * Guest link: `tcp` over the tap (used), `vsock` offered by the VMM but not attached (Node cannot
 * listen on AF_VSOCK).
 */
import { mkdir } from 'node:fs/promises';
import { join } from 'node:path';
import { ipv4Netmask } from '../../core/net-address.ts';
import type { CleanupStack, DriverCapabilities, InstanceSpec, SnapshotRef } from './driver.ts';
import { GUEST_NET } from './driver.ts';
import { makeInstanceDisk, vmKernelCmdline } from './vm-common.ts';
import { apiCall } from './vmm-api.ts';
import {
  copyDisk,
  mapVmmState,
  type PersistedVm,
  type PreparedVmm,
  VMM_CAPABILITIES,
  VmmDriver,
  type VmmDriverConfig,
} from './vmm-common.ts';

/** Configuration of {@link CloudHypervisorDriver}. */
export interface CloudHypervisorConfig extends VmmDriverConfig {
  cloudHypervisorBinary: string;
}

/** API base path (the spec's `servers[0].url`). */
export const CH_API = '/api/v1';

/** Host-side paths an instance's VM config names, as the VMM sees them. */
export interface ChPaths {
  kernel: string;
  initramfs: string;
  rootfs: string;
  /** The instance disk under the fixed mount point. */
  disk: string;
  /** Serial console file under the fixed mount point. */
  serial: string;
}

/** Dotted netmask of a prefix length (30 → 255.255.255.252). Pure. */
export const prefixToMask: (prefix: number) => string = ipv4Netmask;

/**
 * The `vm.create` body (`VmConfig`). Units: `memory.size` in **bytes** (`MemoryConfig.size`, int64);
 * vCPUs fixed (`boot_vcpus` = `max_vcpus`). Disks in `VM_DISKS` order (template image read-only first,
 * instance disk second). The tap's address is given explicitly (the same the namespace set) so the
 * spec's `NetConfig.ip` default never reconfigures it. Serial to a file, virtio console off. Pure.
 */
export function chVmConfig(spec: InstanceSpec, paths: ChPaths): Record<string, unknown> {
  const tap = spec.network.tap!;
  return {
    cpus: { boot_vcpus: spec.vcpus, max_vcpus: spec.vcpus },
    memory: { size: spec.memoryMiB * 1024 * 1024 },
    payload: { kernel: paths.kernel, initramfs: paths.initramfs, cmdline: vmKernelCmdline() },
    disks: [
      { id: 'rootfs', path: paths.rootfs, readonly: true },
      { id: 'disk', path: paths.disk, readonly: false },
    ],
    net: [
      {
        id: 'net0',
        tap: tap.name,
        mac: tap.guestMac,
        ip: GUEST_NET.gatewayAddress,
        mask: prefixToMask(GUEST_NET.prefixLength),
      },
    ],
    rng: { src: '/dev/urandom' },
    serial: { mode: 'File', file: paths.serial },
    console: { mode: 'Off' },
  };
}

/** Inputs of {@link chCommand}. */
export interface ChCommandInputs {
  binary: string;
  netns: string;
  /** The instance's `vm/` directory. */
  vmDir: string;
  /** The fixed path it is bound on inside the VMM's mount namespace. */
  mountPoint: string;
  apiSocket: string;
}

/**
 * `nsenter --net=<netns> -- unshare --mount --propagation private -- sh -c 'mount --bind vm/ <fixed>
 * && exec cloud-hypervisor --api-socket path=<sock>'`: the VMM in the sandbox's network namespace and
 * a private mount namespace (see the module doc). Each step execs the next, so the launcher's pid is
 * the VMM's. Pure.
 */
export function chCommand(i: ChCommandInputs): { cmd: string; args: string[] } {
  return {
    cmd: 'nsenter',
    args: [
      `--net=/var/run/netns/${i.netns}`,
      '--',
      'unshare',
      '--mount',
      '--propagation',
      'private',
      '--',
      '/bin/sh',
      '-c',
      'mount --bind "$1" "$2" && shift 2 && exec "$@"',
      'sh',
      i.vmDir,
      i.mountPoint,
      i.binary,
      '--api-socket',
      `path=${i.apiSocket}`,
    ],
  };
}

/** Cloud Hypervisor implementation of the driver seam. */
export class CloudHypervisorDriver extends VmmDriver {
  readonly name = 'cloud-hypervisor' as const;
  readonly capabilities: DriverCapabilities = VMM_CAPABILITIES;
  protected readonly vmm = 'cloud-hypervisor';
  protected readonly probePath = `${CH_API}/vmm.ping`;
  private readonly binary: string;
  /** The fixed path every instance's `vm/` is bound on (in the VMM's own mount namespace). */
  readonly mountPoint: string;

  constructor(c: CloudHypervisorConfig) {
    super(c);
    this.binary = c.cloudHypervisorBinary;
    this.mountPoint = join(c.stateDir, 'cloud-hypervisor.vm');
  }

  protected binaries(): [string, string][] {
    return [['cloud-hypervisor', this.binary]];
  }

  private vmDir(id: string): string {
    return join(this.instanceDir(id), 'vm');
  }

  private async prepared(spec: InstanceSpec): Promise<PreparedVmm> {
    const id = spec.instanceId;
    await mkdir(this.mountPoint, { recursive: true, mode: 0o700 });
    const apiSocket = join(this.instanceDir(id), 'api.sock');
    const { cmd, args } = chCommand({
      binary: this.binary,
      netns: spec.network.netns,
      vmDir: this.vmDir(id),
      mountPoint: this.mountPoint,
      apiSocket,
    });
    return { launch: { cmd, args, apiSocket, logFile: join(this.instanceDir(id), 'console.log') } };
  }

  /** The instance disk in `vm/` (the instance dir itself is undone by the base class). */
  protected async prepareCreate(spec: InstanceSpec, _undo: CleanupStack): Promise<PreparedVmm> {
    await mkdir(this.vmDir(spec.instanceId), { mode: 0o700 });
    await makeInstanceDisk(join(this.vmDir(spec.instanceId), 'disk.img'), spec.diskMiB, spec.guestToken);
    return this.prepared(spec);
  }

  protected async boot(p: PersistedVm): Promise<void> {
    const { kernel, rootfsImage } = p.spec.image;
    const config = chVmConfig(p.spec, {
      // direct boot of the ELF vmlinux (PVH); the bzImage only when the image has no vmlinux
      kernel: kernel!.vmlinux ?? kernel!.bzImage,
      initramfs: kernel!.initrd,
      rootfs: rootfsImage!,
      disk: join(this.mountPoint, 'disk.img'),
      serial: join(this.mountPoint, 'serial.log'),
    });
    await apiCall(this.vmm, p.apiSocket, 'PUT', `${CH_API}/vm.create`, config);
    await apiCall(this.vmm, p.apiSocket, 'PUT', `${CH_API}/vm.boot`);
  }

  protected async prepareRestore(
    snap: SnapshotRef,
    spec: InstanceSpec,
    _undo: CleanupStack,
  ): Promise<PreparedVmm> {
    await mkdir(this.vmDir(spec.instanceId), { mode: 0o700 });
    await copyDisk(join(snap.path, 'disk.img'), join(this.vmDir(spec.instanceId), 'disk.img'));
    return this.prepared(spec);
  }

  /** `vm.restore` on the fresh VMM, resumed at once. */
  protected async load(p: PersistedVm, snap: SnapshotRef): Promise<void> {
    await apiCall(
      this.vmm,
      p.apiSocket,
      'PUT',
      `${CH_API}/vm.restore`,
      { source_url: `file://${snap.path}`, resume: true },
      120_000,
    );
  }

  protected async pauseVm(p: PersistedVm): Promise<void> {
    await apiCall(this.vmm, p.apiSocket, 'PUT', `${CH_API}/vm.pause`);
  }

  protected async resumeVm(p: PersistedVm): Promise<void> {
    await apiCall(this.vmm, p.apiSocket, 'PUT', `${CH_API}/vm.resume`);
  }

  protected async snapshotVm(p: PersistedVm, dir: string): Promise<void> {
    await apiCall(
      this.vmm,
      p.apiSocket,
      'PUT',
      `${CH_API}/vm.snapshot`,
      { destination_url: `file://${dir}` },
      120_000,
    );
  }

  protected async vmState(p: PersistedVm): Promise<'running' | 'paused' | 'stopped'> {
    const info = await apiCall<{ state?: string }>(
      this.vmm,
      p.apiSocket,
      'GET',
      `${CH_API}/vm.info`,
      undefined,
      2000,
    );
    return mapVmmState(info?.state);
  }

  protected diskPath(p: PersistedVm): string {
    return join(this.vmDir(p.spec.instanceId), 'disk.img');
  }

  protected async shutdownVm(p: PersistedVm): Promise<void> {
    await apiCall(this.vmm, p.apiSocket, 'PUT', `${CH_API}/vmm.shutdown`, undefined, 2000);
  }

  /** Everything lives in the instance dir; the mount namespace ends with the process. */
  protected async removeExtras(): Promise<void> {}
}
