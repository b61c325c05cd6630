/**
 * The QEMU driver's command lines (qemu.ts runs them): the microvm argv of an instance, the guest
 * clock arguments for the host CPU, running QEMU inside a sandbox's namespace, and how QMP's run
 * states map to the driver's. Reads `/proc/cpuinfo`; runs nothing.
 */
import { readFile } from 'node:fs/promises';
import type { InstanceInfo } from './driver.ts';
/** Inputs of {@link qemuArgv}. */
export interface QemuArgvInputs {
  /** `-name` (the instance id). */
  name: string;
  kvm: boolean;
  /** vCPUs (rounded up to a whole number, at least 1). */
  vcpus: number;
  memoryMiB: number;
  kernel: string;
  initrd: string;
  cmdline: string;
  /** Template image (read-only, first disk); omitted for a probe boot with no disks. */
  rootfsImage?: string;
  /** Instance disk (second disk). */
  disk?: string;
  /** Tap name inside the namespace and the guest NIC's MAC; omitted: no NIC. */
  tap?: { name: string; mac: string };
  /** QMP socket path; omitted: no QMP. */
  qmpSocket?: string;
  /** Serial console: a file path, or `stdio`. */
  console: string;
  /** Daemonize and write the pid here. */
  pidFile?: string;
  /** Wait for an incoming migration (`-incoming defer`, started paused). */
  incoming?: boolean;
}

/** QEMU's argv (without the binary) for one microvm. Pure. */
export function qemuArgv(i: QemuArgvInputs): string[] {
  const a = [
    '-name',
    i.name,
    '-M',
    `microvm,accel=${i.kvm ? 'kvm' : 'tcg'}`,
    '-cpu',
    i.kvm ? 'host' : 'max',
    '-smp',
    String(Math.max(1, Math.ceil(i.vcpus))),
    '-m',
    `${i.memoryMiB}M`,
    '-nodefaults',
    '-no-user-config',
    '-display',
    'none',
    '-no-reboot',
    '-serial',
    i.console === 'stdio' ? 'stdio' : `file:${i.console}`,
    '-kernel',
    i.kernel,
    '-initrd',
    i.initrd,
    '-append',
    i.cmdline,
  ];
  if (i.rootfsImage) {
    a.push('-drive', `id=rootfs,file=${i.rootfsImage},format=raw,if=none,readonly=on`);
    a.push('-device', 'virtio-blk-device,drive=rootfs');
  }
  if (i.disk) {
    a.push('-drive', `id=disk,file=${i.disk},format=raw,if=none,discard=unmap`);
    a.push('-device', 'virtio-blk-device,drive=disk');
  }
  if (i.tap) {
    a.push('-netdev', `tap,id=net0,ifname=${i.tap.name},script=no,downscript=no`);
    a.push('-device', `virtio-net-device,netdev=net0,mac=${i.tap.mac}`);
  }
  if (i.qmpSocket) a.push('-qmp', `unix:${i.qmpSocket},server=on,wait=off`);
  if (i.pidFile) a.push('-daemonize', '-pidfile', i.pidFile);
  if (i.incoming) a.push('-S', '-incoming', 'defer');
  return a;
}

/**
 * Kernel parameters the guest needs under software emulation: the TSC frequency
 * (`tsc_early_khz`, from the host's `/proc/cpuinfo` "cpu MHz": a TCG guest's TSC runs at the host's
 * rate). Without it, on a loaded host the guest's TSC calibration fails ("could not calculate TSC
 * khz") and the kernel hangs before printing anything. Empty under KVM (kvmclock). Pure.
 */
export function guestClockArgs(kvm: boolean, cpuinfo: string): string[] {
  if (kvm) return [];
  const mhz = Number(/^cpu MHz\s*:\s*([\d.]+)/m.exec(cpuinfo)?.[1]);
  return [`tsc_early_khz=${Number.isFinite(mhz) && mhz > 0 ? Math.round(mhz * 1000) : 2_000_000}`];
}

let cpuinfoText: string | undefined;
/** `/proc/cpuinfo`, read once per process ('' when unreadable). */
export async function cpuinfo(): Promise<string> {
  cpuinfoText ??= await readFile('/proc/cpuinfo', 'utf8').catch(() => '');
  return cpuinfoText;
}

/** The command that runs QEMU inside a network namespace (`nsenter --net=/var/run/netns/<ns>`). Pure. */
export function inNetns(netns: string, binary: string, argv: string[]): { cmd: string; args: string[] } {
  return { cmd: 'nsenter', args: [`--net=/var/run/netns/${netns}`, '--', binary, ...argv] };
}

/** Maps QMP `query-status` status to the driver's state. Pure. */
export function mapQmpStatus(status: string | undefined): InstanceInfo['state'] {
  if (status === 'running') return 'running';
  if (
    status === undefined ||
    status === 'shutdown' ||
    status === 'internal-error' ||
    status === 'guest-panicked'
  )
    return 'stopped';
  return 'paused'; // paused, postmigrate, prelaunch, inmigrate, finish-migrate, suspended …
}

/** Memory file and disk copy names inside a snapshot directory. */
export const SNAPSHOT_FILES = { memory: 'memory.bin', disk: 'disk.img', ref: 'snapshot.json' } as const;
