/**
 * The instance catalogue: every instance type a SPACE stack may put nodes on, per cloud, with the
 * facts the deployment and the benchmarks need (vCPU, memory, KVM, hourly price, where each fact
 * comes from and when it was read). One `as const` table per cloud, keyed by the type name, so a
 * pool naming an unknown type fails validation and code naming one fails to compile.
 *
 * Facts come from the providers' public type lists and price pages each entry names as its source
 * (the `§…` tags in those strings are section ids of the cloud survey they were read in). Prices change: re-read the source before relying on a figure, and
 * update `asOf` with it. The benchmarks read this module (`catalogue`, `instanceType`).
 */

/** Clouds a stack can target. `kind` is a local Kubernetes-in-Docker cluster (no cloud). */
export type Cloud = 'akamai' | 'coreweave' | 'crusoe' | 'kind';

/** Every cloud, in documentation order. */
export const CLOUDS = ['akamai', 'coreweave', 'crusoe', 'kind'] as const satisfies readonly Cloud[];

/**
 * Whether a guest on this instance type can use hardware virtualisation (`/dev/kvm`):
 * `yes` — documented by the cloud; `no` — documented or observed absent; `unverified` — nobody has
 * checked yet (a pool may still ask for a VMM driver there, but only with `allowUnverifiedKvm`).
 */
export type Kvm = 'yes' | 'no' | 'unverified';

/** One catalogue row. */
export interface InstanceTypeFacts {
  /** Virtual CPUs of one instance; null when the source does not say (kind: the host's). */
  readonly vcpus: number | null;
  /** Memory of one instance, GiB (the clouds' "GB"); null when unknown. */
  readonly memoryGiB: number | null;
  /** Hardware virtualisation inside the instance; see {@link Kvm}. */
  readonly kvm: Kvm;
  /** On-demand price of one instance, USD per hour; null when no public price is known. */
  readonly usdPerHour: number | null;
  /** Where vCPU, memory and price were read (a URL or a repository path). */
  readonly source: string;
  /** When the source was read (ISO date). */
  readonly asOf: string;
  /** Caveats a reader must know (conditions for KVM, inferred shapes). */
  readonly note?: string;
}

const LINODE_TYPES = 'https://api.linode.com/v4/linode/types (probe of 2026-09-17, clouds.md §1.8)';
const LINODE_KVM =
  'Nested KVM on Linode is unconfirmed and the only evidence is negative (clouds.md §1.7): probe one ' +
  'instance (`test -e /dev/kvm`) before opting a pool in to a VMM driver.';

/** Akamai (Linode) Dedicated CPU plans, g6 generation. Hourly billing up to a monthly cap. */
export const akamaiInstanceTypes = {
  'g6-dedicated-2': {
    vcpus: 2,
    memoryGiB: 4,
    kvm: 'unverified',
    usdPerHour: 0.054,
    source: LINODE_TYPES,
    asOf: '2026-09-17',
    note: LINODE_KVM,
  },
  'g6-dedicated-4': {
    vcpus: 4,
    memoryGiB: 8,
    kvm: 'unverified',
    usdPerHour: 0.108,
    source: LINODE_TYPES,
    asOf: '2026-09-17',
    note: LINODE_KVM,
  },
  'g6-dedicated-8': {
    vcpus: 8,
    memoryGiB: 16,
    kvm: 'unverified',
    usdPerHour: 0.216,
    source: LINODE_TYPES,
    asOf: '2026-09-17',
    note: LINODE_KVM,
  },
  'g6-dedicated-16': {
    vcpus: 16,
    memoryGiB: 32,
    kvm: 'unverified',
    usdPerHour: 0.432,
    source: LINODE_TYPES,
    asOf: '2026-09-17',
    note: LINODE_KVM,
  },
  'g6-dedicated-32': {
    vcpus: 32,
    memoryGiB: 64,
    kvm: 'unverified',
    usdPerHour: 0.864,
    source: LINODE_TYPES,
    asOf: '2026-09-17',
    note: LINODE_KVM,
  },
  'g6-dedicated-48': {
    vcpus: 48,
    memoryGiB: 96,
    kvm: 'unverified',
    usdPerHour: 1.296,
    source: LINODE_TYPES,
    asOf: '2026-09-17',
    note: LINODE_KVM,
  },
  'g6-dedicated-50': {
    vcpus: 50,
    memoryGiB: 128,
    kvm: 'unverified',
    usdPerHour: 1.728,
    source: LINODE_TYPES,
    asOf: '2026-09-17',
    note: LINODE_KVM,
  },
  'g6-dedicated-56': {
    vcpus: 56,
    memoryGiB: 256,
    kvm: 'unverified',
    usdPerHour: 3.456,
    source: LINODE_TYPES,
    asOf: '2026-09-17',
    note: LINODE_KVM,
  },
} as const satisfies Record<string, InstanceTypeFacts>;

const CW_PRICING = 'https://www.coreweave.com/pricing (capture of 2026-09-20, clouds.md §2.4)';
/**
 * Why CoreWeave KVM is `unverified`: CKS nodes are bare metal, but the only VM path CoreWeave
 * documents is a Kata-based private preview that needs Support enablement and a virtualization
 * node pool (docs.coreweave.com/products/cks/container-runtimes; docs/deployment.md "What only a real
 * cloud account can confirm"). KVM for customer pods is not a general product.
 */
const CW_KVM =
  'CKS nodes are bare metal (docs.coreweave.com/products/cks/clusters/introduction), but the only documented ' +
  'VM path is a Kata-based private preview needing enablement (docs.coreweave.com/products/cks/container-runtimes): ' +
  'that a privileged pod may open /dev/kvm is unverified. Ask CoreWeave, then probe a node (`space doctor`).';

/** CoreWeave CKS CPU node types (whole servers). */
export const coreweaveInstanceTypes = {
  'cd-hp-a96-genoa': {
    vcpus: 96,
    memoryGiB: 768,
    kvm: 'unverified',
    usdPerHour: 6.42,
    source: CW_PRICING,
    asOf: '2026-09-20',
    note: `AMD Genoa 9274F High Performance. ${CW_KVM}`,
  },
  'cd-gp-a192-genoa': {
    vcpus: 192,
    memoryGiB: 1536,
    kvm: 'unverified',
    usdPerHour: 7.78,
    source: CW_PRICING,
    asOf: '2026-09-20',
    note: `AMD Genoa 9454 General Purpose. ${CW_KVM}`,
  },
  'turin-gp': {
    vcpus: 192,
    memoryGiB: 1536,
    kvm: 'unverified',
    usdPerHour: null,
    source: 'https://docs.coreweave.com/platform/instances/cpu/turin-gp',
    asOf: '2026-09-20',
    note: `AMD Turin 9655P, 7.68 TB local disk; no public price in the 2026-09 capture. ${CW_KVM}`,
  },
} as const satisfies Record<string, InstanceTypeFacts>;

const CRUSOE_PRICING =
  'https://crusoe.ai/cloud/pricing ($0.04 per vCPU-hour, capture of 2026-09-20, clouds.md §3.5)';
const CRUSOE_KVM =
  'KVM only with nested virtualisation: a Support feature flag, `virtualization_features.nested_virtualization` ' +
  'at creation, Ubuntu 22.04+, and Cloud Hypervisor as the only supported inner hypervisor.';
const CRUSOE_SHAPE =
  'Shape inferred from the `.Nx` naming (4 GB per vCPU); list real shapes with GET compute/vms/types.';

/** Crusoe general-purpose CPU VM types (c1a family). */
export const crusoeInstanceTypes = {
  'c1a.2x': {
    vcpus: 2,
    memoryGiB: 8,
    kvm: 'yes',
    usdPerHour: 0.08,
    source: CRUSOE_PRICING,
    asOf: '2026-09-20',
    note: `${CRUSOE_KVM} A third-party log saw $0.10/h on 2026-10-08.`,
  },
  'c1a.4x': {
    vcpus: 4,
    memoryGiB: 16,
    kvm: 'yes',
    usdPerHour: 0.16,
    source: CRUSOE_PRICING,
    asOf: '2026-09-20',
    note: `${CRUSOE_KVM} ${CRUSOE_SHAPE}`,
  },
  'c1a.8x': {
    vcpus: 8,
    memoryGiB: 32,
    kvm: 'yes',
    usdPerHour: 0.32,
    source: CRUSOE_PRICING,
    asOf: '2026-09-20',
    note: `${CRUSOE_KVM} ${CRUSOE_SHAPE}`,
  },
  'c1a.16x': {
    vcpus: 16,
    memoryGiB: 64,
    kvm: 'yes',
    usdPerHour: 0.64,
    source: CRUSOE_PRICING,
    asOf: '2026-09-20',
    note: `${CRUSOE_KVM} ${CRUSOE_SHAPE}`,
  },
} as const satisfies Record<string, InstanceTypeFacts>;

/** kind: nodes are containers on the operator's machine; KVM is whatever the host has. */
export const kindInstanceTypes = {
  host: {
    vcpus: null,
    memoryGiB: null,
    kvm: 'unverified',
    usdPerHour: 0,
    source: 'kind (kubernetes-sigs/kind): nodes are Docker containers on this machine',
    asOf: '2026-11-30',
    note: 'Rootful Docker passes the host /dev/kvm through (clouds.md §5.4); rootless Docker does not.',
  },
} as const satisfies Record<string, InstanceTypeFacts>;

/** Instance type names per cloud (a union per cloud, so a missing entry fails to compile). */
export type AkamaiInstanceType = keyof typeof akamaiInstanceTypes;
export type CoreweaveInstanceType = keyof typeof coreweaveInstanceTypes;
export type CrusoeInstanceType = keyof typeof crusoeInstanceTypes;
export type KindInstanceType = keyof typeof kindInstanceTypes;

/** The whole catalogue, by cloud. */
export const catalogue = {
  akamai: akamaiInstanceTypes,
  coreweave: coreweaveInstanceTypes,
  crusoe: crusoeInstanceTypes,
  kind: kindInstanceTypes,
} as const satisfies Record<Cloud, Record<string, InstanceTypeFacts>>;

/** The facts of `type` on `cloud`, or undefined when the catalogue has no such row. */
export function instanceType(cloud: Cloud, type: string): InstanceTypeFacts | undefined {
  const table: Record<string, InstanceTypeFacts> = catalogue[cloud];
  return Object.hasOwn(table, type) ? table[type] : undefined;
}

/** Instance type names known for `cloud`, in table order. */
export function instanceTypeNames(cloud: Cloud): string[] {
  return Object.keys(catalogue[cloud]);
}
