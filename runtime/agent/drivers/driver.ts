/**
 * The driver seam: how one node makes, controls, snapshots, restores and re-adopts sandbox
 * instances. It is shaped for a VM; gVisor is the special case.
 *
 * - A driver declares what it can do in a {@link DriverCapabilities} record; the agent and the API
 *   read it instead of asking "which driver is this?".
 * - *Create from template* ({@link Driver.create}) and *restore from snapshot* ({@link Driver.restore})
 *   are separate entry points. Each keeps a {@link CleanupStack}: any failure undoes exactly what that
 *   call made, in reverse order, and nothing else.
 * - Every instance is reached through its guest daemon over a {@link GuestEndpoint} (TCP over the
 *   sandbox's link today). The guest's per-instance secret is delivered by the driver inside the
 *   instance's own writable disk (a root-only file the guest deletes once read): never a host bind
 *   mount, never the kernel command line (`/proc/cmdline` is world-readable inside a VM).
 * - Networking: `network.ts` makes the namespace and the host veth for every driver, so the egress
 *   rules never depend on the driver. gVisor takes the namespace's veth end itself
 *   ({@link NetworkAttachment} `veth`); VM drivers get a tap inside the namespace (`tap`), see
 *   `SandboxNetworks.attachTap`.
 * - {@link Driver.adopt} re-attaches to an instance (its VMM process and API socket) after an agent
 *   restart.
 *
 * An *instance* is one VM/container. The agent binds a sandbox id to an instance when it claims it
 * (from the warm pool, a snapshot restore or a cold create), so instance ids are the driver's and
 * never reused.
 */
import type { DriverName } from '../../core/drivers.ts';
import { GUEST_PORT } from '../../core/guest-protocol.ts';
import type { TemplateStart } from '../image/templates.ts';

export type { DriverName };

/** How the agent's link to the guest daemon is carried. */
export type GuestLinkKind = 'tcp' | 'vsock';

/** How an instance's network is attached inside its namespace. */
export type NetworkAttachment = 'veth' | 'tap';

/** What a driver can do on this node. Read by the agent (and reported to the API in the heartbeat). */
export interface DriverCapabilities {
  /** Freeze in memory and thaw (`pause`/`resume`). */
  pause: boolean;
  /** Write a snapshot of a live instance (`snapshot`). */
  snapshot: boolean;
  /** Start a new instance from a snapshot (`restore`). */
  restore: boolean;
  /** Report memory use ({@link Driver.stats}). */
  memoryStats: boolean;
  /** Inflate/deflate a memory balloon. */
  balloon: boolean;
  /** Guest link kinds the VMM offers; the first is the one used. */
  guestLinks: GuestLinkKind[];
  network: NetworkAttachment;
  /** The root filesystem the driver boots: a directory (overlay lower) or an ext4 image. */
  rootfs: 'directory' | 'ext4';
  /** Whether each instance runs its own kernel (a VM) rather than a user-space kernel. */
  ownKernel: boolean;
}

/** Where the agent reaches an instance's guest daemon. */
export interface GuestEndpoint {
  host: string;
  port: number;
  /** Secret the guest daemon requires (`Authorization: Bearer`), so sandbox processes can't drive it. */
  token: string;
}

/** The network made for one instance by `network.ts` before the driver starts it. */
export interface SandboxNetwork {
  /** Network namespace name (`ip netns` name); its path is `/var/run/netns/<name>`. */
  netns: string;
  /** Host-side interface name. */
  hostIf: string;
  /** Address of the host end (the sandbox's gateway), e.g. 10.77.0.1. */
  hostAddress: string;
  /** Address of the sandbox end as the host sees it, e.g. 10.77.0.2. */
  sandboxAddress: string;
  /** Prefix length of the point-to-point link (30). */
  prefixLength: number;
  /** Present once a tap was attached for a VM (`SandboxNetworks.attachTap`). */
  tap?: TapAttachment;
}

/**
 * A tap inside the sandbox's namespace for a VM's NIC. The guest always has the same addresses
 * ({@link GUEST_NET}), so a snapshot restores into any namespace; the namespace translates between
 * them and the sandbox's own address (`sandboxAddress`), which is all the host and its egress rules
 * ever see.
 */
export interface TapAttachment {
  /** Tap device name inside the namespace. */
  name: string;
  /** MAC address of the guest's NIC. */
  guestMac: string;
}

/** Fixed addresses of every VM guest's NIC inside its namespace (a /30 of its own per namespace). */
export const GUEST_NET = {
  tapName: 'tap0',
  /** The namespace's end of the tap (the guest's default gateway and DNS server). */
  gatewayAddress: '172.31.0.1',
  /** The guest's own address. */
  guestAddress: '172.31.0.2',
  prefixLength: 30,
  guestMac: '06:00:ac:1f:00:02',
  /**
   * MAC of the namespace's end of the tap. Fixed so a restored guest, whose ARP cache still holds
   * the old tap's address, reaches its gateway at once (a tap drops frames not addressed to it).
   */
  gatewayMac: '06:00:ac:1f:00:01',
} as const;

/**
 * A template as a driver boots it (made by `images.ts`): a read-only base plus the guest layer
 * (guest daemon, its Node runtime, tini), content-addressed.
 */
export interface TemplateImage {
  template: string;
  /** Hex digest naming this exact image (definition + guest layer + builder version). */
  digest: string;
  /** Directories stacked as read-only overlay lowers, topmost first (gVisor). */
  lowerDirs: string[];
  /** ext4 image of the whole root filesystem (VM drivers), when built. */
  rootfsImage?: string;
  /** Guest kernel for direct boot (VM drivers): `vmlinuz` (bzImage) and `vmlinux` (uncompressed ELF). */
  kernel?: { bzImage: string; vmlinux?: string; initrd: string; version: string };
  /**
   * The template's start command and ready check (image/templates.ts `templateStart`): the instance
   * factory runs it on every instance it boots, and an instance is used only once it is ready.
   */
  start?: TemplateStart;
}

/** Instance ids a directory-per-instance driver accepts (they name directories and containers). */
export const INSTANCE_ID_RE = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$/;

/** What the driver needs to make an instance. */
export interface InstanceSpec {
  /** Driver-unique id, `i-<random>`; also names the runsc container / VM. */
  instanceId: string;
  /** Template name, e.g. `base`. */
  template: string;
  image: TemplateImage;
  /** vCPUs (fractions allowed for gVisor CPU quota; see core/drivers.ts for each driver's rules). */
  vcpus: number;
  /** Memory in MiB. */
  memoryMiB: number;
  /** Size of the sandbox's writable disk (its own filesystem), MiB. */
  diskMiB: number;
  /** Max processes/threads in the sandbox. */
  pidsLimit: number;
  /** Secret handed to the guest daemon at boot (see the module doc for how). */
  guestToken: string;
  network: SandboxNetwork;
}

/** A live (or paused) instance as the driver knows it. */
export interface InstanceInfo {
  instanceId: string;
  template: string;
  state: 'running' | 'paused' | 'stopped';
  guest: GuestEndpoint;
  network: SandboxNetwork;
  /** Epoch ms when it was created (or restored). */
  createdAt: number;
  /** vCPUs and memory (MiB) it runs with. */
  vcpus: number;
  memoryMiB: number;
  /** Host pid of the VMM / runsc sandbox process, when known. */
  pid?: number;
}

/**
 * A snapshot a driver wrote (`<path>/snapshot.json`, mode 0600): enough to restore it on this node
 * or, for drivers whose snapshots are portable, on another with the same template image.
 */
export interface SnapshotRef {
  driver: DriverName;
  /** Instance it was taken from. */
  instanceId: string;
  template: string;
  /** Digest of the {@link TemplateImage} it was booted from: a restore needs the same image. */
  imageDigest: string;
  /** Directory holding the snapshot files. */
  path: string;
  vcpus: number;
  memoryMiB: number;
  diskMiB: number;
  /** The guest token inside the snapshot; the agent replaces it right after a restore. */
  guestToken: string;
  /** Epoch ms. */
  createdAt: number;
}

/** What {@link Driver.restore} needs beyond the snapshot: a new identity and network. */
export type RestoreSpec = Omit<InstanceSpec, 'vcpus' | 'memoryMiB' | 'diskMiB'>;

/**
 * The {@link InstanceInfo} of an instance made from `spec` (what every driver persists per
 * instance) in `state`; the guest is reached at the sandbox's address on {@link GUEST_PORT}. Pure.
 */
export function instanceInfo(
  p: { spec: InstanceSpec; createdAt: number; pid?: number },
  state: InstanceInfo['state'],
  vcpus = p.spec.vcpus,
): InstanceInfo {
  return {
    instanceId: p.spec.instanceId,
    template: p.spec.template,
    state,
    guest: { host: p.spec.network.sandboxAddress, port: GUEST_PORT, token: p.spec.guestToken },
    network: p.spec.network,
    createdAt: p.createdAt,
    vcpus,
    memoryMiB: p.spec.memoryMiB,
    ...(p.pid !== undefined ? { pid: p.pid } : {}),
  };
}

/** Resource use of one instance. */
export interface InstanceStats {
  /** Host memory charged to the instance, bytes. */
  memoryBytes: number;
  /** Memory the guest reports in use (VMs with a balloon/stats device), bytes, when known. */
  guestMemoryBytes?: number;
}

/**
 * One driver per node. Idempotent where the wording allows (destroying a destroyed instance
 * succeeds). Methods throw `SpaceError` with code `DRIVER_FAILED`, `SNAPSHOT_UNSUPPORTED` (a
 * capability the driver lacks) or `INSTANCE_LOST` (adopt: the VMM is gone).
 */
export interface Driver {
  readonly name: DriverName;
  readonly capabilities: DriverCapabilities;
  /**
   * For drivers that snapshot: a short digest (hex) of the settings a snapshot captures beyond
   * the image (the guest's argv, the platform). The agent keeps template snapshots per image and
   * per this key, so changing such a setting makes a new snapshot instead of restoring processes
   * started under the old one. Absent: snapshots are keyed by image only.
   */
  readonly snapshotKey?: string;
  /** Checks host prerequisites (binaries, KVM) and throws one DRIVER_FAILED error listing what is missing. */
  preflight(): Promise<void>;
  /** Makes and boots an instance; resolves when the guest daemon answers /health. Undoes all on failure. */
  create(spec: InstanceSpec): Promise<InstanceInfo>;
  /**
   * Starts a new instance from `snapshot` with `spec`'s id and network; resolves when the guest
   * answers /health. The guest inside still holds `snapshot.guestToken`; the driver records and
   * returns `spec.guestToken` (in `guest.token`, and in its own state for adopt), and the caller
   * rotates the guest to it at once (guest `POST /token`). Undoes all on failure.
   */
  restore(snapshot: SnapshotRef, spec: RestoreSpec): Promise<InstanceInfo>;
  pause(instanceId: string): Promise<void>;
  resume(instanceId: string): Promise<void>;
  /**
   * Writes a snapshot of the instance into `dir` (which it creates). The instance is left in the
   * state it was in (paused stays paused, running is paused for the copy and resumed).
   */
  snapshot(instanceId: string, dir: string): Promise<SnapshotRef>;
  /** Kills the instance and removes everything the driver made for it (not the network). */
  destroy(instanceId: string): Promise<void>;
  /** Instances that exist on this node (from the driver's on-disk state + the VMM). */
  list(): Promise<InstanceInfo[]>;
  /**
   * Re-attaches to a listed instance after an agent restart (its VMM process and API socket).
   * @throws SpaceError INSTANCE_LOST when its VMM is gone.
   */
  adopt(instanceId: string): Promise<InstanceInfo>;
  /** Resource use; SNAPSHOT_UNSUPPORTED-style DRIVER_FAILED when `capabilities.memoryStats` is false. */
  stats(instanceId: string): Promise<InstanceStats>;
  /**
   * Why a stopped instance ended, when the host can tell (its cgroup counted an OOM kill or a
   * refused fork); undefined when it cannot. Read before {@link destroy}, which removes the evidence.
   */
  endCause?(instanceId: string): Promise<InstanceEndCause | undefined>;
  /**
   * The instance's host memory charge now, bytes (synchronous: a cgroup counter, read often by the
   * memory guard); undefined when it cannot be read. Drivers whose guests have no OOM killer of
   * their own implement it (agent/sandboxes/memory-guard.ts); a VM's kernel has one.
   */
  memoryCharge?(instanceId: string): number | undefined;
}

/** A resource whose exhaustion ended a whole instance (see {@link Driver.endCause}). */
export type InstanceEndCause = 'memory' | 'processes';

/**
 * Undo steps of one create/restore, run in reverse on failure. Each step is labelled so a failed
 * undo names what it left behind.
 */
export class CleanupStack {
  readonly #steps: { label: string; undo: () => Promise<unknown> }[] = [];

  /** Registers how to undo something that was just made. */
  push(label: string, undo: () => Promise<unknown>): void {
    this.#steps.push({ label, undo });
  }

  /** Forgets every step (the operation succeeded). */
  release(): void {
    this.#steps.length = 0;
  }

  /**
   * Runs every undo step, last first, even after one fails.
   * @returns labels and messages of the steps that failed (empty when all undid cleanly).
   */
  async unwind(): Promise<string[]> {
    const failed: string[] = [];
    while (this.#steps.length) {
      const s = this.#steps.pop()!;
      try {
        await s.undo();
      } catch (err) {
        failed.push(`${s.label}: ${(err as Error).message}`);
      }
    }
    return failed;
  }
}
