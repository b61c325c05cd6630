/**
 * The shapes the node's sandbox verbs share: what the API asks for ({@link CreateSandbox}), a
 * sandbox this node runs ({@link LocalSandbox}), where a hibernated one is ({@link Hibernation}) and
 * what the manager is built from ({@link SandboxManagerOptions}).
 */
import type { Logger } from 'pino';
import type { CredentialGrant } from '../../core/credentials.ts';
import type { EgressPolicy } from '../../core/egress.ts';
import type { Command } from '../commands/commands.ts';
import type { SpoolRetention } from '../commands/retention.ts';
import type { Driver, InstanceInfo, TemplateImage } from '../drivers/driver.ts';
import type { GuestClient } from '../guest-client.ts';
import type { GatewayClient } from '../host/gateway-client.ts';
import type { SandboxNetworks } from '../host/network.ts';
import type { ActivityMeter } from './activity.ts';

/** What the API sends to create a sandbox. */
export interface CreateSandbox {
  sandboxId: string;
  sessionId: string;
  template: string;
  vcpus: number;
  memoryMiB: number;
  env: Record<string, string>;
  expiresAtMs: number;
  egress: EgressPolicy;
  credentials: CredentialGrant[];
}

/** How a sandbox's instance came to be: a warm-pool claim, a snapshot restore, or a cold boot. */
export type InstanceSource = 'warm' | 'snapshot' | 'boot';

/** Where a hibernated sandbox is: its store's name and its folder there. */
export interface Hibernation {
  store: string;
  path: string;
}

/**
 * What a pause answers: the mode it is in, where a hibernated one is, and how long ago (ms, by this
 * node's clock) its instance stopped running, so whoever closes the metering interval uses the
 * instance's moment rather than its own (a duration, so the node's and Redis's clocks need not
 * agree).
 */
export interface PauseOutcome {
  mode: 'frozen' | 'hibernated';
  hibernation?: Hibernation;
  pausedForMs?: number;
}

/** What a resume answers; `runningForMs`: how long ago (ms) the instance ran again, when known. */
export interface ResumeOutcome {
  instanceId: string;
  how: 'thawed' | 'restored';
  runningForMs?: number;
}

/** A sandbox this node runs. */
export interface LocalSandbox {
  id: string;
  sessionId: string;
  template: string;
  instance: InstanceInfo;
  guest: GuestClient;
  source: InstanceSource;
  commands: Map<string, Command>;
  /** Open data-plane streams (bounded by config). */
  streams: number;
  /**
   * Aborts of open guest streams that are not commands (directory watches): cut before the guest
   * connection closes, which would otherwise wait for them to end on their own.
   */
  guestStreams: Set<AbortController>;
  /**
   * `frozen` while a pause holds its instance in memory, `pausing` while a pause waits for the
   * guest calls in flight to finish (new ones are refused); null when it runs.
   */
  paused: 'frozen' | 'pausing' | null;
  /**
   * Epoch ms (this node's clock) when its instance last stopped running for a pause (the driver's
   * pause returned); undefined while it runs. What the pause's metering boundary is taken from.
   */
  pausedAt?: number;
  /** Epoch ms (this node's clock) when its instance last ran again after a pause (thaw or restore). */
  resumedAt?: number;
  /** Guest calls in flight (data-plane requests that need the guest, command starts). */
  guestCalls: number;
  /** Set once the sandbox was found dead on its own: why (its end message). */
  crashed?: string;
  egress: EgressPolicy;
  credentials: CredentialGrant[];
}

/** A running sandbox of request `req` on instance `inst`, with nothing open yet. Pure. */
export function localSandbox(
  req: Pick<CreateSandbox, 'sandboxId' | 'sessionId' | 'template' | 'egress' | 'credentials'>,
  inst: InstanceInfo,
  guest: GuestClient,
  source: InstanceSource,
): LocalSandbox {
  return {
    id: req.sandboxId,
    sessionId: req.sessionId,
    template: req.template,
    instance: inst,
    guest,
    source,
    commands: new Map(),
    streams: 0,
    guestStreams: new Set(),
    guestCalls: 0,
    paused: null,
    egress: req.egress,
    credentials: req.credentials,
  };
}

/**
 * What the sandbox verbs use of the node's networks (`network.ts` `SandboxNetworks`; a unit test
 * hands in one kept in memory).
 */
export type HostNetworks = Pick<
  SandboxNetworks,
  'allocate' | 'attachTap' | 'setCidrAllows' | 'release' | 'sweep'
>;

export interface SandboxManagerOptions {
  stateDir: string;
  driver: Driver;
  networks: HostNetworks;
  /** The image the driver boots for a template; throws TEMPLATE_NOT_FOUND / TEMPLATE_NOT_READY. */
  templateImage: (template: string) => Promise<TemplateImage>;
  pidsLimit: number;
  /** Writable disk per sandbox, MiB. */
  diskMiB: number;
  /** Instances started (booted or restored) at once (SPACE_CREATE_CONCURRENCY). */
  createConcurrency: number;
  /** Of those, warm-pool refills at once (SPACE_WARM_REFILL_CONCURRENCY, ≤ createConcurrency). */
  refillConcurrency: number;
  spoolLimitBytes: number;
  /** How many and how much of a sandbox's command outputs stay on disk, and for how long. */
  spoolRetention: SpoolRetention;
  /** The node's egress gateway; null: sandboxes get no egress at all. */
  gateway: Pick<GatewayClient, 'register' | 'unregister' | 'registryId'> | null;
  /** Environment every command gets (e.g. NODE_EXTRA_CA_CERTS), under the sandbox's own. */
  baseEnv: Record<string, string>;
  /** Folder of the hibernation store: one folder per hibernated sandbox. */
  hibernateDir: string;
  /** Name of the store: nodes with the same name read the same folder (shared storage). */
  hibernateStore: string;
  /** Activity metering (null: not metered, e.g. in unit tests). */
  activity: ActivityMeter | null;
  /**
   * The control plane's record of a sandbox as a create request (recover-record.ts), or null when
   * it has none live here: what adoption rebuilds a torn `sandbox.json` from. Absent: not rebuilt
   * (the sandbox is reported lost).
   */
  recorded?: (sandboxId: string) => Promise<CreateSandbox | null>;
  /**
   * Called before a create or a restore from hibernation takes disk on this node: throws
   * NODE_DISK_FULL when the state disk is under its floor (host/disk-headroom.ts). Absent: admitted.
   */
  admitDisk?: () => Promise<void>;
  log: Logger;
}
