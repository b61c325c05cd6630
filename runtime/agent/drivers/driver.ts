/**
 * The VM driver interface: how one node makes, controls and re-adopts sandbox instances.
 * gVisor (`gvisor.ts`) implements it today; the microVM drivers (Firecracker, Cloud Hypervisor,
 * QEMU microvm) implement the same shape — each instance is reached through its guest daemon
 * over TCP ({@link GuestEndpoint}) and gets its network from {@link SandboxNetwork}.
 *
 * An *instance* is one VM/container. The agent binds a sandbox id to an instance when it claims it
 * (from the warm pool or a cold create), so instance ids are the driver's and never reused.
 */

/** Names of the drivers SPACE knows. */
export type DriverName = 'gvisor' | 'firecracker' | 'cloud-hypervisor' | 'qemu';

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
  /** Address of the sandbox end, e.g. 10.77.0.2. */
  sandboxAddress: string;
  /** Prefix length of the point-to-point link (30). */
  prefixLength: number;
}

/** What the driver needs to make an instance. */
export interface InstanceSpec {
  /** Driver-unique id, `i-<random>`; also names the runsc container / VM. */
  instanceId: string;
  /** Template name, e.g. `base`. */
  template: string;
  /** Absolute path of the template's read-only root filesystem (directory) or image. */
  templateRootfs: string;
  /** vCPUs (fractions allowed for gVisor CPU quota). */
  vcpus: number;
  /** Memory limit in MiB. */
  memoryMiB: number;
  /** Size of the sandbox's writable disk (its own filesystem), MiB. */
  diskMiB: number;
  /** Max processes/threads in the sandbox. */
  pidsLimit: number;
  /** Secret handed to the guest daemon at boot (its environment, never a file in the sandbox). */
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
  /** Epoch ms when it was created. */
  createdAt: number;
}

/** Reference to a snapshot a driver made. */
export interface SnapshotRef {
  instanceId: string;
  /** Directory holding the snapshot files. */
  path: string;
}

/**
 * One driver per node. Every method is idempotent where the wording allows (destroying a
 * destroyed instance succeeds). Methods throw `SpaceError('DRIVER_FAILED' | 'SNAPSHOT_UNSUPPORTED', …)`.
 */
export interface Driver {
  readonly name: DriverName;
  /** Checks host prerequisites (binaries, KVM) and throws one DRIVER_FAILED error listing what is missing. */
  preflight(): Promise<void>;
  /** Makes and boots an instance; resolves when the guest daemon answers /health. Cleans up on failure. */
  create(spec: InstanceSpec): Promise<InstanceInfo>;
  pause(instanceId: string): Promise<void>;
  resume(instanceId: string): Promise<void>;
  /** Writes a snapshot of the (paused or running) instance; SNAPSHOT_UNSUPPORTED where impossible. */
  snapshot(instanceId: string, dir: string): Promise<SnapshotRef>;
  /** Kills the instance and removes everything the driver made for it (not the network). */
  destroy(instanceId: string): Promise<void>;
  /** Instances that exist on this node (from the driver's on-disk state + the VMM), for re-adoption. */
  list(): Promise<InstanceInfo[]>;
}
