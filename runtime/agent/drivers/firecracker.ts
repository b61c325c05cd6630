/**
 * The Firecracker driver: one jailed Firecracker process per instance, configured over its API socket.
 *
 * Facts used here come from Firecracker's API description
 * (https://github.com/firecracker-microvm/firecracker/blob/main/src/firecracker/swagger/firecracker.yaml:
 * paths and `definitions`) and its guides: the boot call sequence
 * (https://github.com/firecracker-microvm/firecracker/blob/main/docs/getting-started.md), snapshots
 * (https://github.com/firecracker-microvm/firecracker/tree/main/docs/snapshotting) and the jailer
 * (https://github.com/firecracker-microvm/firecracker/blob/main/docs/jailer.md).
 *
 * The jailer (`jailerArgs`) runs Firecracker as a per-instance uid, in its own mount and pid
 * namespaces, chrooted in `<chrootBase>/<exec file name>/<id>/root`, inside the sandbox's network
 * namespace (`--netns /var/run/netns/<ns>`, where `network.ts` made `tap0`) and a cgroup
 * `<parent>/<id>` limiting memory and CPU. Every path in an API body is relative to that chroot
 * ({@link JAIL_FILES}):
 * ```
 * <chrootBase>/firecracker/<id>/root/     owned by root; the jailer adds firecracker, dev/{kvm,net/tun,urandom}
 *   vmlinux initrd rootfs.ext4            template image files, hard-linked (copied across filesystems)
 *   disk.img                              the instance's writable disk (uid-owned, 0600)
 *   firecracker.log [metrics.json]        logger / metrics sinks (uid-owned)
 *   run/firecracker.socket                the API socket (run/ uid-owned)
 *   firecracker.pid                       Firecracker's pid, written by the jailer
 *   snapshot/{vm.state,memory}            snapshot files being written, or loaded on restore
 * <stateDir>/firecracker/<id>/            instance.json, console.log (jailer + guest serial output)
 * ```
 * A snapshot directory holds `vm.state` and `memory` (group `jailGid`, 0440, so any jailed instance can
 * map them read-only), `disk.img` and `snapshot.json`. A restore hard-links the first two into the new
 * chroot (the memory file is mapped MAP_PRIVATE: it must not change while clones run) and copies the disk.
 * Because every chroot has the same relative paths and every namespace the same tap name and guest
 * address, the snapshot's device paths resolve in any new instance; no `network_overrides` needed.
 *
 * Guest link: capabilities offer `tcp` (used: the guest daemon over the tap, as with every driver)
 * and `vsock` (Firecracker has a vsock device, but Node cannot listen on AF_VSOCK and Firecracker's
 * host side is a Unix-socket bridge with its own CONNECT handshake, so no vsock device is attached yet).
 */
import { existsSync } from 'node:fs';
import { chmod, chown, mkdir, readdir, rename, rm, rmdir, stat, writeFile } from 'node:fs/promises';
import { basename, join } from 'node:path';
import { shapeProblem } from '../../core/drivers.ts';
import type { CleanupStack, DriverCapabilities, InstanceSpec, SnapshotRef } from './driver.ts';
import { makeInstanceDisk, vmKernelCmdline } from './vm-common.ts';
import { apiCall } from './vmm-api.ts';
import {
  copyDisk,
  linkOrCopy,
  mapVmmState,
  type PersistedVm,
  type PreparedVmm,
  VMM_CAPABILITIES,
  VmmDriver,
  type VmmDriverConfig,
} from './vmm-common.ts';

/** Configuration of {@link FirecrackerDriver}. */
export interface FirecrackerConfig extends VmmDriverConfig {
  /** Firecracker binary (the jailer copies it into each chroot). */
  firecrackerBinary: string;
  jailerBinary: string;
  /** Jailer `--chroot-base-dir` (default `<stateDir>/jailer`: same filesystem as the images, for hard links). */
  chrootBaseDir?: string;
  /** Instance uids are `uidBase + 1 …` (one per live instance); default 100 000. */
  uidBase?: number;
  /** Group of every jailed Firecracker (reads snapshot files); default `uidBase`. */
  jailGid?: number;
  /** cgroup version the jailer uses (default: 2 when `/sys/fs/cgroup/cgroup.controllers` exists, else 1). */
  cgroupVersion?: 1 | 2;
  /** Jailer `--parent-cgroup` (default `space`, as gVisor's `/space/<id>`). */
  parentCgroup?: string;
  /** Also configure Firecracker's metrics file (default false: stats come from /proc). */
  metrics?: boolean;
}

/** Paths inside the chroot, as the API bodies name them (relative to the chroot root). */
export const JAIL_FILES = {
  kernel: 'vmlinux',
  initrd: 'initrd',
  rootfs: 'rootfs.ext4',
  disk: 'disk.img',
  log: 'firecracker.log',
  metrics: 'metrics.json',
  apiSocket: 'run/firecracker.socket',
  pidFile: 'firecracker.pid',
  snapState: 'snapshot/vm.state',
  snapMemory: 'snapshot/memory',
} as const;

/** The jailer's `--api-sock` argument for Firecracker (an absolute path inside the chroot). */
export const JAIL_API_SOCK = `/${JAIL_FILES.apiSocket}`;

/** Memory the cgroup allows beyond the guest's RAM (VMM ≤ 5 MiB per its spec, plus page cache), MiB. */
export const VMM_OVERHEAD_MIB = 64;

/** CFS period for the CPU limit, µs. */
export const FC_CPU_PERIOD_US = 100_000;

/** `no-file` rlimit given to Firecracker (the jailer's own default, `resource_limits.rs`). */
export const FC_NOFILE = 2048;

/** Where the jailer puts one instance. Pure. */
export function jailPaths(chrootBaseDir: string, firecrackerBinary: string, id: string) {
  const jailDir = join(chrootBaseDir, basename(firecrackerBinary), id);
  const root = join(jailDir, 'root');
  return {
    /** `<base>/<exec file name>/<id>`: removed on destroy. */
    jailDir,
    /** The chroot: Firecracker's `/`. */
    root,
    apiSocket: join(root, JAIL_FILES.apiSocket),
    pidFile: join(root, JAIL_FILES.pidFile),
  };
}

/** Inputs of {@link jailerArgs}. */
export interface JailerInputs {
  id: string;
  firecrackerBinary: string;
  uid: number;
  gid: number;
  chrootBaseDir: string;
  /** Network namespace name (`/var/run/netns/<netns>`). */
  netns: string;
  cgroupVersion: 1 | 2;
  parentCgroup: string;
  vcpus: number;
  /** Guest RAM, MiB. */
  memoryMiB: number;
  /** Instance disk, MiB (bounds the file-size rlimit). */
  diskMiB: number;
  /** Extra Firecracker args after `--` (e.g. `--boot-timer`). */
  firecrackerArgs?: string[];
}

/**
 * The jailer's argv (Firecracker's jailer guide, linked above): per-instance uid/gid, chroot base, netns, cgroup
 * limits (memory = guest RAM + {@link VMM_OVERHEAD_MIB} MiB in bytes; CPU = vcpus × period µs),
 * rlimits (`fsize` ≥ the largest file Firecracker writes: the memory snapshot or the disk), a new pid
 * namespace (killing Firecracker ends the jail; the jailer writes the pid file), and Firecracker's own
 * args after `--`. No `--daemonize`: the launcher detaches it, keeping the serial console in a log. Pure.
 */
export function jailerArgs(i: JailerInputs): string[] {
  const memBytes = (i.memoryMiB + VMM_OVERHEAD_MIB) * 1024 * 1024;
  const quota = i.vcpus * FC_CPU_PERIOD_US;
  const cgroups =
    i.cgroupVersion === 2
      ? [`memory.max=${memBytes}`, `cpu.max=${quota} ${FC_CPU_PERIOD_US}`]
      : [
          `memory.limit_in_bytes=${memBytes}`,
          `cpu.cfs_period_us=${FC_CPU_PERIOD_US}`,
          `cpu.cfs_quota_us=${quota}`,
        ];
  const fsize = (Math.max(i.memoryMiB, i.diskMiB) + VMM_OVERHEAD_MIB) * 1024 * 1024;
  return [
    '--id',
    i.id,
    '--exec-file',
    i.firecrackerBinary,
    '--uid',
    String(i.uid),
    '--gid',
    String(i.gid),
    '--chroot-base-dir',
    i.chrootBaseDir,
    '--netns',
    `/var/run/netns/${i.netns}`,
    '--cgroup-version',
    String(i.cgroupVersion),
    '--parent-cgroup',
    i.parentCgroup,
    ...cgroups.flatMap((c) => ['--cgroup', c]),
    '--resource-limit',
    `fsize=${fsize}`,
    '--resource-limit',
    `no-file=${FC_NOFILE}`,
    '--new-pid-ns',
    '--',
    '--api-sock',
    JAIL_API_SOCK,
    ...(i.firecrackerArgs ?? []),
  ];
}

/** Request bodies of a cold boot, in call order (Firecracker's getting-started guide, linked above). Pure. */
export function bootRequests(spec: InstanceSpec, metrics: boolean): [string, string, unknown][] {
  const tap = spec.network.tap!;
  return [
    ...observabilityRequests(metrics),
    ['PUT', '/machine-config', { vcpu_count: spec.vcpus, mem_size_mib: spec.memoryMiB, smt: false }],
    [
      'PUT',
      '/boot-source',
      {
        kernel_image_path: JAIL_FILES.kernel,
        initrd_path: JAIL_FILES.initrd,
        // virtio-mmio only (no --enable-pci): the guest needs no PCI probe
        boot_args: vmKernelCmdline(['pci=off']),
      },
    ],
    // attach order = guest order: template image is vda, instance disk vdb (VM_DISKS)
    [
      'PUT',
      '/drives/rootfs',
      { drive_id: 'rootfs', path_on_host: JAIL_FILES.rootfs, is_root_device: false, is_read_only: true },
    ],
    [
      'PUT',
      '/drives/disk',
      { drive_id: 'disk', path_on_host: JAIL_FILES.disk, is_root_device: false, is_read_only: false },
    ],
    [
      'PUT',
      '/network-interfaces/eth0',
      { iface_id: 'eth0', host_dev_name: tap.name, guest_mac: tap.guestMac },
    ],
    ['PUT', '/actions', { action_type: 'InstanceStart' }],
  ];
}

/** Logger (and metrics) configuration: the only calls allowed before a snapshot load. Pure. */
export function observabilityRequests(metrics: boolean): [string, string, unknown][] {
  return [
    [
      'PUT',
      '/logger',
      { log_path: JAIL_FILES.log, level: 'Warning', show_level: true, show_log_origin: false },
    ],
    ...(metrics
      ? [['PUT', '/metrics', { metrics_path: JAIL_FILES.metrics }] as [string, string, unknown]]
      : []),
  ];
}

/** `PUT /snapshot/load` body: file-backed memory, resumed at once. Pure. */
export function snapshotLoadBody(): Record<string, unknown> {
  return {
    snapshot_path: JAIL_FILES.snapState,
    mem_backend: { backend_type: 'File', backend_path: JAIL_FILES.snapMemory },
    track_dirty_pages: false,
    resume_vm: true,
  };
}

/** Firecracker (+ jailer) implementation of the driver seam. */
export class FirecrackerDriver extends VmmDriver {
  readonly name = 'firecracker' as const;
  readonly capabilities: DriverCapabilities = VMM_CAPABILITIES;
  protected readonly vmm = 'firecracker';
  protected readonly probePath = '/';
  private readonly fc: Required<Omit<FirecrackerConfig, keyof VmmDriverConfig>>;
  /** uids handed to instances being made (persisted ones are read from their records). */
  readonly #reservedUids = new Set<number>();

  constructor(c: FirecrackerConfig) {
    super(c);
    const uidBase = c.uidBase ?? 100_000;
    this.fc = {
      firecrackerBinary: c.firecrackerBinary,
      jailerBinary: c.jailerBinary,
      chrootBaseDir: c.chrootBaseDir ?? join(c.stateDir, 'jailer'),
      uidBase,
      jailGid: c.jailGid ?? uidBase,
      cgroupVersion: c.cgroupVersion ?? (existsSync('/sys/fs/cgroup/cgroup.controllers') ? 2 : 1),
      parentCgroup: c.parentCgroup ?? 'space',
      metrics: c.metrics ?? false,
    };
  }

  protected binaries(): [string, string][] {
    return [
      ['firecracker', this.fc.firecrackerBinary],
      ['jailer', this.fc.jailerBinary],
    ];
  }

  private jail(id: string) {
    return jailPaths(this.fc.chrootBaseDir, this.fc.firecrackerBinary, id);
  }

  /** The lowest uid above `uidBase` that no instance holds. */
  private async allocateUid(): Promise<number> {
    const held = new Set(this.#reservedUids);
    for (const p of await this.records()) if (typeof p.extra?.uid === 'number') held.add(p.extra.uid);
    let uid = this.fc.uidBase + 1;
    while (held.has(uid) || this.#reservedUids.has(uid)) uid++;
    this.#reservedUids.add(uid);
    return uid;
  }

  /** Chroot with run/, snapshot/, log sinks and the template's read-only files; returns the jail's uid. */
  private async makeJail(spec: InstanceSpec, undo: CleanupStack): Promise<{ uid: number; root: string }> {
    const id = spec.instanceId;
    const uid = await this.allocateUid();
    undo.push('uid', async () => this.#reservedUids.delete(uid));
    const gid = this.fc.jailGid;
    const { jailDir, root } = this.jail(id);
    if (existsSync(jailDir)) throw new Error(`jail ${jailDir} already exists`);
    await mkdir(root, { recursive: true, mode: 0o755 });
    undo.push('jail', () => rm(jailDir, { recursive: true, force: true }));
    for (const d of ['run', 'snapshot']) {
      await mkdir(join(root, d), { mode: 0o700 });
      await chown(join(root, d), uid, gid);
    }
    for (const f of [JAIL_FILES.log, ...(this.fc.metrics ? [JAIL_FILES.metrics] : [])]) {
      await writeFile(join(root, f), '', { mode: 0o600 });
      await chown(join(root, f), uid, gid);
    }
    await this.placeReadOnly(spec.image.rootfsImage!, join(root, JAIL_FILES.rootfs), uid);
    return { uid, root };
  }

  /** Links a read-only input into the chroot; copies (uid-owned, 0400) one others cannot read. */
  private async placeReadOnly(src: string, dst: string, uid: number): Promise<void> {
    const st = await stat(src);
    if (st.mode & 0o004) return linkOrCopy(src, dst);
    await copyDisk(src, dst);
    await chown(dst, uid, this.fc.jailGid);
    await chmod(dst, 0o400);
  }

  private prepared(spec: InstanceSpec, uid: number): PreparedVmm {
    const id = spec.instanceId;
    const j = this.jail(id);
    return {
      launch: {
        cmd: this.fc.jailerBinary,
        args: jailerArgs({
          id,
          firecrackerBinary: this.fc.firecrackerBinary,
          uid,
          gid: this.fc.jailGid,
          chrootBaseDir: this.fc.chrootBaseDir,
          netns: spec.network.netns,
          cgroupVersion: this.fc.cgroupVersion,
          parentCgroup: this.fc.parentCgroup,
          vcpus: spec.vcpus,
          memoryMiB: spec.memoryMiB,
          diskMiB: spec.diskMiB,
        }),
        logFile: join(this.instanceDir(id), 'console.log'),
        apiSocket: j.apiSocket,
      },
      pidFile: j.pidFile,
      extra: { uid },
    };
  }

  /** @throws Error when the shape breaks Firecracker's rules or the image lacks a vmlinux. */
  protected async prepareCreate(spec: InstanceSpec, undo: CleanupStack): Promise<PreparedVmm> {
    const problem = shapeProblem('firecracker', { vcpus: spec.vcpus, memoryMiB: spec.memoryMiB });
    if (problem) throw new Error(problem);
    const kernel = spec.image.kernel!;
    if (!kernel.vmlinux)
      throw new Error(
        `image ${spec.image.digest} has no uncompressed vmlinux (Firecracker needs an ELF kernel)`,
      );
    const { uid, root } = await this.makeJail(spec, undo);
    await this.placeReadOnly(kernel.vmlinux, join(root, JAIL_FILES.kernel), uid);
    await this.placeReadOnly(kernel.initrd, join(root, JAIL_FILES.initrd), uid);
    const disk = join(root, JAIL_FILES.disk);
    await makeInstanceDisk(disk, spec.diskMiB, spec.guestToken);
    await chown(disk, uid, this.fc.jailGid);
    await chmod(disk, 0o600);
    return this.prepared(spec, uid);
  }

  protected async boot(p: PersistedVm): Promise<void> {
    for (const [method, path, body] of bootRequests(p.spec, this.fc.metrics)) {
      await apiCall(this.vmm, p.apiSocket, method, path, body);
    }
  }

  protected async prepareRestore(
    snap: SnapshotRef,
    spec: InstanceSpec,
    undo: CleanupStack,
  ): Promise<PreparedVmm> {
    const { uid, root } = await this.makeJail(spec, undo);
    await linkOrCopy(join(snap.path, 'vm.state'), join(root, JAIL_FILES.snapState));
    await linkOrCopy(join(snap.path, 'memory'), join(root, JAIL_FILES.snapMemory));
    const disk = join(root, JAIL_FILES.disk);
    await copyDisk(join(snap.path, 'disk.img'), disk);
    await chown(disk, uid, this.fc.jailGid);
    await chmod(disk, 0o600);
    return this.prepared(spec, uid);
  }

  /** Logger (+ metrics), then `PUT /snapshot/load` on the fresh process (its spec: "Pre-boot only"). */
  protected async load(p: PersistedVm): Promise<void> {
    for (const [method, path, body] of observabilityRequests(this.fc.metrics)) {
      await apiCall(this.vmm, p.apiSocket, method, path, body);
    }
    await apiCall(this.vmm, p.apiSocket, 'PUT', '/snapshot/load', snapshotLoadBody(), 60_000);
  }

  protected async pauseVm(p: PersistedVm): Promise<void> {
    await apiCall(this.vmm, p.apiSocket, 'PATCH', '/vm', { state: 'Paused' });
  }

  protected async resumeVm(p: PersistedVm): Promise<void> {
    await apiCall(this.vmm, p.apiSocket, 'PATCH', '/vm', { state: 'Resumed' });
  }

  /** Full snapshot into the chroot's snapshot/, then moved into `dir` (group jailGid, 0440). */
  protected async snapshotVm(p: PersistedVm, dir: string): Promise<void> {
    const root = this.jail(p.spec.instanceId).root;
    await apiCall(
      this.vmm,
      p.apiSocket,
      'PUT',
      '/snapshot/create',
      { snapshot_type: 'Full', snapshot_path: JAIL_FILES.snapState, mem_file_path: JAIL_FILES.snapMemory },
      120_000,
    );
    for (const [from, to] of [
      [JAIL_FILES.snapState, 'vm.state'],
      [JAIL_FILES.snapMemory, 'memory'],
    ] as const) {
      const src = join(root, from);
      const dst = join(dir, to);
      await rename(src, dst).catch(async (err: NodeJS.ErrnoException) => {
        if (err.code !== 'EXDEV') throw err;
        await copyDisk(src, dst);
        await rm(src, { force: true });
      });
      await chown(dst, 0, this.fc.jailGid);
      await chmod(dst, 0o440);
    }
  }

  protected async vmState(p: PersistedVm): Promise<'running' | 'paused' | 'stopped'> {
    const info = await apiCall<{ state?: string }>(this.vmm, p.apiSocket, 'GET', '/', undefined, 2000);
    return mapVmmState(info?.state);
  }

  protected diskPath(p: PersistedVm): string {
    return join(this.jail(p.spec.instanceId).root, JAIL_FILES.disk);
  }

  /** Firecracker has no graceful stop worth waiting for (a guest reboot makes it exit); it is killed. */
  protected async shutdownVm(): Promise<void> {}

  /** The jail directory and the jailer's cgroups; frees the uid. */
  protected async removeExtras(instanceId: string, p: PersistedVm | undefined): Promise<void> {
    await rm(this.jail(instanceId).jailDir, { recursive: true, force: true });
    await removeJailCgroups(this.fc.parentCgroup, instanceId);
    if (typeof p?.extra?.uid === 'number') this.#reservedUids.delete(p.extra.uid);
  }
}

/** Removes `<parent>/<id>` in the unified hierarchy and in every v1 controller. Never throws. */
export async function removeJailCgroups(parent: string, id: string, root = '/sys/fs/cgroup'): Promise<void> {
  const candidates = [join(root, parent, id)];
  for (const ctrl of await readdir(root).catch(() => [] as string[]))
    candidates.push(join(root, ctrl, parent, id));
  for (const c of candidates) if (existsSync(c)) await rmdir(c).catch(() => {});
}
