/**
 * The node-pool contract every cloud shares: a pool names its driver, instance type, count and
 * labels; a pool that asks for a VMM driver must sit on an instance type the catalogue marks as
 * having KVM. `validateNodePools` reports every problem with its config path, so a stack fails
 * with one clear message before any resource is created.
 */
import { DRIVER_NAMES, type DriverName } from '../runtime/core/drivers.ts';
import { type Cloud, instanceType, instanceTypeNames } from './catalogue.ts';

/** How a node makes sandboxes: the drivers the agent knows, declared once (runtime/core/drivers.ts). */
export type Driver = DriverName;

/** Every driver. */
export const DRIVERS = DRIVER_NAMES;

/** Drivers that run a hypervisor and therefore need `/dev/kvm`. */
export const VMM_DRIVERS = ['firecracker', 'cloud-hypervisor', 'qemu'] as const satisfies readonly Driver[];

/** True when `driver` needs `/dev/kvm`. */
export function isVmmDriver(driver: Driver): boolean {
  return (VMM_DRIVERS as readonly Driver[]).includes(driver);
}

/** What each cloud allows and defaults to. */
export interface CloudProfile {
  /** Deployment modes the cloud supports; the first is the default. */
  readonly modes: readonly DeployMode[];
  /** VMM drivers the cloud can run (its inner hypervisor story). */
  readonly vmmDrivers: readonly Driver[];
  /** The driver of the default node pool. */
  readonly defaultDriver: Driver;
  /** The instance type of the default node pool. */
  readonly defaultInstanceType: string;
  /** Whether the default pool opts in to a VMM driver on an `unverified` KVM type. */
  readonly defaultAllowUnverifiedKvm: boolean;
}

/** `kubernetes`: the Kubernetes component on a cluster; `vm`: cloud-init + systemd on plain VMs. */
export type DeployMode = 'kubernetes' | 'vm';

/**
 * Per-cloud capabilities. Akamai defaults to gVisor because Linode KVM is unconfirmed
 * (docs/deployment.md "Akamai (Linode)"); CoreWeave too, because KVM for customer pods on CKS is documented only as a
 * preview (§2.3: bare metal, but unverified); Crusoe to Cloud Hypervisor, the only inner
 * hypervisor it documents (§3.5).
 */
export const cloudProfiles = {
  akamai: {
    modes: ['vm', 'kubernetes'],
    vmmDrivers: ['firecracker', 'cloud-hypervisor', 'qemu'],
    defaultDriver: 'gvisor',
    defaultInstanceType: 'g6-dedicated-4',
    defaultAllowUnverifiedKvm: false,
  },
  coreweave: {
    modes: ['kubernetes'],
    vmmDrivers: ['firecracker', 'cloud-hypervisor', 'qemu'],
    defaultDriver: 'gvisor',
    defaultInstanceType: 'cd-hp-a96-genoa',
    defaultAllowUnverifiedKvm: false,
  },
  crusoe: {
    modes: ['vm'],
    vmmDrivers: ['cloud-hypervisor'],
    defaultDriver: 'cloud-hypervisor',
    defaultInstanceType: 'c1a.8x',
    defaultAllowUnverifiedKvm: false,
  },
  kind: {
    modes: ['kubernetes'],
    vmmDrivers: ['firecracker', 'cloud-hypervisor', 'qemu'],
    defaultDriver: 'gvisor',
    defaultInstanceType: 'host',
    defaultAllowUnverifiedKvm: false,
  },
} as const satisfies Record<Cloud, CloudProfile>;

/** One node pool: identical nodes running one agent each. */
export interface NodePool {
  /** DNS label, unique in the stack (`[a-z][a-z0-9-]*`, ≤ 20 chars); part of resource names: never rename. */
  readonly name: string;
  /** The sandbox driver of this pool's agents (`SPACE_DRIVER`). Default: the cloud's default driver. */
  readonly driver: Driver;
  /** Instance type from the catalogue (`providers/catalogue.ts`). */
  readonly instanceType: string;
  /** Number of nodes (1–100). Default 1. */
  readonly count: number;
  /** Extra Kubernetes node labels / VM tags, `key: value`. Default none. */
  readonly labels: Readonly<Record<string, string>>;
  /** Opt in to a VMM driver on a type whose KVM is `unverified`. Default false. */
  readonly allowUnverifiedKvm: boolean;
}

/** The node label every SPACE pool carries; the agent DaemonSet of the pool selects on it. */
export const POOL_LABEL = 'space.dev/pool';
/** The node label that says a node may run a SPACE agent. */
export const NODE_LABEL = 'space.dev/node';

const POOL_NAME = /^[a-z][a-z0-9-]{0,19}$/;
const LABEL_KEY =
  /^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$/;
const LABEL_VALUE = /^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$/;

/** The default pool of `cloud` (one node). */
export function defaultNodePools(cloud: Cloud): NodePool[] {
  const p = cloudProfiles[cloud];
  return [
    {
      name: 'default',
      driver: p.defaultDriver,
      instanceType: p.defaultInstanceType,
      count: 1,
      labels: {},
      allowUnverifiedKvm: p.defaultAllowUnverifiedKvm,
    },
  ];
}

/**
 * Checks raw pool objects (from `space:nodePools`) against the contract, filling defaults.
 * Returns the pools and every problem as `path: message`; the pools are only meaningful when
 * there are no problems.
 */
export function parseNodePools(
  cloud: Cloud,
  raw: unknown,
  path = 'space:nodePools',
): { pools: NodePool[]; problems: string[] } {
  const problems: string[] = [];
  if (raw === undefined) return { pools: defaultNodePools(cloud), problems };
  if (!Array.isArray(raw) || raw.length === 0) {
    return { pools: [], problems: [`${path}: must be a non-empty list of pools`] };
  }
  const profile: CloudProfile = cloudProfiles[cloud];
  const pools: NodePool[] = [];
  const seen = new Set<string>();
  raw.forEach((item: unknown, i) => {
    const at = `${path}[${i}]`;
    if (typeof item !== 'object' || item === null || Array.isArray(item)) {
      problems.push(`${at}: must be an object`);
      return;
    }
    const o = item as Record<string, unknown>;
    for (const k of Object.keys(o)) {
      if (!['name', 'driver', 'instanceType', 'count', 'labels', 'allowUnverifiedKvm'].includes(k))
        problems.push(`${at}.${k}: unknown property`);
    }
    const name = o['name'];
    if (typeof name !== 'string' || !POOL_NAME.test(name)) {
      problems.push(`${at}.name: must match ${POOL_NAME.source} (got ${JSON.stringify(name)})`);
    } else if (seen.has(name)) problems.push(`${at}.name: "${name}" is used by another pool`);
    else seen.add(name);

    const driver = o['driver'] ?? profile.defaultDriver;
    if (typeof driver !== 'string' || !(DRIVERS as readonly string[]).includes(driver)) {
      problems.push(`${at}.driver: must be one of ${DRIVERS.join(', ')} (got ${JSON.stringify(driver)})`);
    }
    const type = o['instanceType'] ?? profile.defaultInstanceType;
    const facts = typeof type === 'string' ? instanceType(cloud, type) : undefined;
    if (!facts) {
      problems.push(
        `${at}.instanceType: ${JSON.stringify(type)} is not in the ${cloud} catalogue (known: ${instanceTypeNames(cloud).join(', ')})`,
      );
    }
    const count = o['count'] ?? 1;
    if (typeof count !== 'number' || !Number.isInteger(count) || count < 1 || count > 100) {
      problems.push(`${at}.count: must be an integer from 1 to 100 (got ${JSON.stringify(count)})`);
    }
    const allow = o['allowUnverifiedKvm'] ?? profile.defaultAllowUnverifiedKvm;
    if (typeof allow !== 'boolean') problems.push(`${at}.allowUnverifiedKvm: must be a boolean`);
    const labels = o['labels'] ?? {};
    if (typeof labels !== 'object' || labels === null || Array.isArray(labels)) {
      problems.push(`${at}.labels: must be an object of string values`);
    } else {
      for (const [k, v] of Object.entries(labels)) {
        if (!LABEL_KEY.test(k) || k.length > 317) problems.push(`${at}.labels.${k}: not a valid label key`);
        if (typeof v !== 'string' || !LABEL_VALUE.test(v))
          problems.push(`${at}.labels.${k}: value must be a valid label value (≤ 63 chars)`);
        if (k.startsWith('space.dev/')) problems.push(`${at}.labels.${k}: the space.dev/ prefix is reserved`);
      }
    }

    if (typeof driver === 'string' && (VMM_DRIVERS as readonly string[]).includes(driver)) {
      if (!profile.vmmDrivers.includes(driver as Driver)) {
        problems.push(
          `${at}.driver: ${cloud} cannot run "${driver}" (supported VMM drivers there: ${profile.vmmDrivers.join(', ')}; or use gvisor)`,
        );
      }
      if (facts?.kvm === 'no') {
        problems.push(`${at}: driver "${driver}" needs KVM but instance type "${type}" has none; use gvisor`);
      } else if (facts?.kvm === 'unverified' && allow !== true) {
        problems.push(
          `${at}: driver "${driver}" needs KVM but KVM on "${type}" is unverified; use gvisor, or set allowUnverifiedKvm: true after probing a node (the agent refuses a VMM driver at boot when /dev/kvm is unusable)`,
        );
      }
    }
    if (problems.length === 0 || !problems.some((p) => p.startsWith(at))) {
      pools.push({
        name: name as string,
        driver: driver as Driver,
        instanceType: type as string,
        count: count as number,
        labels: labels as Record<string, string>,
        allowUnverifiedKvm: allow as boolean,
      });
    }
  });
  return { pools, problems };
}
