/**
 * Chooses and builds this node's driver from configuration (`SPACE_DRIVER`, per node pool), or
 * detects one (`auto`): a VMM driver when KVM is usable and its binary is present, else gVisor.
 * A VMM driver named explicitly on a node without usable KVM is refused at boot with a remedy
 * (QEMU alone can run without KVM, under software emulation).
 */
import { existsSync } from 'node:fs';
import type { DriverName } from '../../core/drivers.ts';
import { SpaceError } from '../../core/errors.ts';
import type { AgentConfig } from '../config.ts';
import { probeKvm } from '../host/kvm.ts';
import { CloudHypervisorDriver } from './cloud-hypervisor.ts';
import type { Driver } from './driver.ts';
import { FirecrackerDriver } from './firecracker.ts';
import { GvisorDriver } from './gvisor.ts';
import { QemuDriver } from './qemu.ts';

/** What building a driver needs beyond configuration. */
export interface DriverDeps {
  /** Driver state root (instances, sockets). */
  stateDir: string;
  log?: (msg: string, fields?: Record<string, unknown>) => void;
}

/** The driver an `auto` node picks, and why. */
export interface DriverChoice {
  driver: DriverName;
  kvm: boolean;
  reason: string;
}

type DriverConfig = Pick<
  AgentConfig,
  | 'driver'
  | 'kvm'
  | 'gvisorPlatform'
  | 'gvisorSnapshots'
  | 'runscBinary'
  | 'qemuBinary'
  | 'firecrackerBinary'
  | 'jailerBinary'
  | 'cloudHypervisorBinary'
> &
  Partial<Pick<AgentConfig, 'guestReadyTimeoutMs'>>;

/** VMM drivers in the order `auto` prefers them, with the binary each needs. */
function vmmCandidates(
  c: Pick<DriverConfig, 'firecrackerBinary' | 'cloudHypervisorBinary'>,
): [DriverName, string][] {
  return [
    ['firecracker', c.firecrackerBinary],
    ['cloud-hypervisor', c.cloudHypervisorBinary],
  ];
}

/**
 * Resolves `SPACE_DRIVER` (possibly `auto`) to a driver name.
 * @throws SpaceError DRIVER_FAILED when a driver that needs KVM is named and KVM is not usable.
 */
export async function chooseDriver(c: Omit<DriverConfig, 'gvisorSnapshots'>): Promise<DriverChoice> {
  const kvm = c.kvm === 'off' ? { usable: false, reason: 'SPACE_KVM=off' } : await probeKvm();
  if (c.driver !== 'auto') {
    if ((c.driver === 'firecracker' || c.driver === 'cloud-hypervisor') && !kvm.usable) {
      throw new SpaceError(
        'DRIVER_FAILED',
        `SPACE_DRIVER=${c.driver} needs usable KVM, and this node has none (${kvm.reason}). ` +
          'Run `space doctor` on the node; use a KVM-capable instance type, or SPACE_DRIVER=gvisor.',
        { driver: c.driver },
      );
    }
    return { driver: c.driver, kvm: kvm.usable, reason: 'SPACE_DRIVER' };
  }
  if (kvm.usable) {
    for (const [name, bin] of vmmCandidates(c)) {
      if (existsSync(bin)) return { driver: name, kvm: true, reason: `KVM usable and ${bin} present` };
    }
  }
  return {
    driver: 'gvisor',
    kvm: kvm.usable,
    reason: kvm.usable
      ? 'KVM usable but no Firecracker or Cloud Hypervisor binary'
      : `no usable KVM (${kvm.reason})`,
  };
}

/**
 * Builds the driver named `name`.
 * @throws SpaceError DRIVER_FAILED for a driver this build does not have.
 */
export function createDriver(name: DriverName, c: DriverConfig, deps: DriverDeps, kvm: boolean): Driver {
  // undefined: each driver's own default
  const healthTimeoutMs = c.guestReadyTimeoutMs || undefined;
  switch (name) {
    case 'gvisor':
      return new GvisorDriver({
        stateDir: deps.stateDir,
        runscBinary: c.runscBinary,
        platform: c.gvisorPlatform,
        snapshots: c.gvisorSnapshots === 'on',
        healthTimeoutMs,
        log: deps.log,
      });
    case 'firecracker':
      return new FirecrackerDriver({
        stateDir: deps.stateDir,
        firecrackerBinary: c.firecrackerBinary,
        jailerBinary: c.jailerBinary,
        healthTimeoutMs,
        log: deps.log,
      });
    case 'cloud-hypervisor':
      return new CloudHypervisorDriver({
        stateDir: deps.stateDir,
        cloudHypervisorBinary: c.cloudHypervisorBinary,
        healthTimeoutMs,
        log: deps.log,
      });
    case 'qemu':
      // runs without KVM too (software emulation): `kvm` only picks the accelerator
      return new QemuDriver({
        stateDir: deps.stateDir,
        qemuBinary: c.qemuBinary,
        kvm,
        healthTimeoutMs,
        log: deps.log,
      });
    default: {
      const never: never = name;
      throw new Error(`unknown driver ${String(never)}`);
    }
  }
}
