/**
 * The drivers SPACE knows and the sandbox shapes each accepts, declared once for the API (which
 * refuses a shape no alive node's driver can run, with a clear error) and the agent (which checks
 * again before booting).
 *
 * Sources: Firecracker's `PUT /machine-config` takes `vcpu_count` 1–32 and, as its API description
 * says, 1 or an even number (MachineConfiguration in
 * https://github.com/firecracker-microvm/firecracker/blob/main/src/firecracker/swagger/firecracker.yaml);
 * Cloud Hypervisor's `CpusConfig` takes integer `boot_vcpus` ≥ 1 (its `max_vcpus` limit is 254 on
 * x86-64 KVM); QEMU's microvm machine takes integer `-smp`; gVisor limits CPU with a CFS quota,
 * so fractions work.
 */

/** Names of the drivers SPACE knows. */
export const DRIVER_NAMES = ['gvisor', 'qemu', 'firecracker', 'cloud-hypervisor'] as const;
export type DriverName = (typeof DRIVER_NAMES)[number];

/** A requested sandbox shape. */
export interface SandboxShape {
  vcpus: number;
  /** MiB. */
  memoryMiB: number;
}

/** Shape limits of one driver. */
export interface ShapeRules {
  /** Whether vCPUs must be a whole number. */
  integerVcpus: boolean;
  minVcpus: number;
  maxVcpus: number;
  /** Firecracker: 1 or an even number. */
  oneOrEvenVcpus: boolean;
  /** MiB. */
  minMemoryMiB: number;
  /** Memory must be a multiple of this, MiB. */
  memoryStepMiB: number;
}

/** Shape rules per driver (sources in the module doc). */
export const SHAPE_RULES: Readonly<Record<DriverName, ShapeRules>> = {
  gvisor: {
    integerVcpus: false,
    minVcpus: 0.25,
    maxVcpus: 64,
    oneOrEvenVcpus: false,
    minMemoryMiB: 128,
    memoryStepMiB: 1,
  },
  qemu: {
    integerVcpus: true,
    minVcpus: 1,
    maxVcpus: 64,
    oneOrEvenVcpus: false,
    minMemoryMiB: 128,
    memoryStepMiB: 2,
  },
  firecracker: {
    integerVcpus: true,
    minVcpus: 1,
    maxVcpus: 32,
    oneOrEvenVcpus: true,
    minMemoryMiB: 128,
    memoryStepMiB: 2,
  },
  'cloud-hypervisor': {
    integerVcpus: true,
    minVcpus: 1,
    maxVcpus: 254,
    oneOrEvenVcpus: false,
    minMemoryMiB: 128,
    memoryStepMiB: 2,
  },
};

/**
 * Why `shape` cannot run on `driver`, or null when it can. Pure.
 * @returns a sentence naming the rule that fails (for SHAPE_UNSUPPORTED's message).
 */
export function shapeProblem(driver: DriverName, shape: SandboxShape): string | null {
  const r = SHAPE_RULES[driver];
  const { vcpus, memoryMiB } = shape;
  if (r.integerVcpus && !Number.isInteger(vcpus))
    return `${driver} needs a whole number of vCPUs (got ${vcpus})`;
  if (vcpus < r.minVcpus || vcpus > r.maxVcpus)
    return `${driver} takes ${r.minVcpus}–${r.maxVcpus} vCPUs (got ${vcpus})`;
  if (r.oneOrEvenVcpus && vcpus !== 1 && vcpus % 2 !== 0)
    return `${driver} takes 1 or an even number of vCPUs (got ${vcpus})`;
  if (memoryMiB < r.minMemoryMiB)
    return `${driver} needs at least ${r.minMemoryMiB} MiB of memory (got ${memoryMiB})`;
  if (memoryMiB % r.memoryStepMiB !== 0)
    return `${driver} needs memory in multiples of ${r.memoryStepMiB} MiB (got ${memoryMiB})`;
  return null;
}

/** The drivers that can run `shape` (in {@link DRIVER_NAMES} order). Pure. */
export function acceptingDrivers(shape: SandboxShape): DriverName[] {
  return DRIVER_NAMES.filter((d) => shapeProblem(d, shape) === null);
}

/** True when `value` names a known driver. */
export function isDriverName(value: unknown): value is DriverName {
  return typeof value === 'string' && (DRIVER_NAMES as readonly string[]).includes(value);
}
