/**
 * Every Redis key SPACE uses, in one place. Keys carry a schema version (`space:v1:`) so an
 * upgrade can migrate them side by side. See `runtime/core/REDIS.md` for the table of keys,
 * TTLs and the atomic flows (place, release, transition, expire).
 *
 * Scripts touch keys they compute from ids (nodes during placement), so SPACE needs a single
 * Redis primary (or Redis Cluster with all keys in one slot via the `{space}` hash tag — not yet).
 */

import { DEFAULT_TEAM } from './tenancy.ts';

/** Version prefix of every key. */
export const KEY_PREFIX = 'space:v1:';

/** How long a node counts as alive after its last heartbeat (ms): three missed 5 s beats. */
export const NODE_ALIVE_TTL_MS = 15_000;
/** How long an Idempotency-Key is remembered (s): a day covers any sane client retry loop. */
export const IDEMPOTENCY_TTL_SEC = 24 * 3600;
/** How long a finished operation is kept (s): a week, for audit and late pollers. */
export const OPERATION_TTL_SEC = 7 * 24 * 3600;
/** How long a killed sandbox's record is kept (s): a week, so clients can read why it ended. */
export const KILLED_SANDBOX_TTL_SEC = 7 * 24 * 3600;
/**
 * How long a stored envd access token is served (s): its token's lifetime less a minute, so a
 * stored token always has a minute left; after that the E2B routes mint and store a new one.
 */
export const envdTokenTtlSec = (tokenTtlSec: number): number => Math.max(60, tokenTtlSec - 60);
/** How long usage data (minute buckets, per-sandbox totals after the end) is kept (s): 35 days. */
export const USAGE_RETENTION_SEC = 35 * 24 * 3600;

/**
 * String: the SPACE version VM deployments should run (`PUT /v1/deployment/target-version`).
 * Outside the runtime's prefix, like the VM verify key: a deployment key, read by the
 * `space-version-sync` timer on every VM (providers/systemd/cloud-init.ts), which upgrades in place.
 */
export const DEPLOY_TARGET_VERSION_KEY = 'space:deploy:target-version';
/** What a target version may look like: an image tag (docs.docker.com "image tag" grammar). */
export const VERSION_TAG = /^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$/;
/**
 * Hash: the deployment's VM configuration (`PUT /v1/deployment/vm-config`): field = a VM service
 * ({@link VM_SERVICE}, e.g. `space-api`, `space-agent@default`), value = its settings as a JSON
 * object (`core/vm-config.ts`). Outside the runtime's prefix: read by the `space-config-sync` timer
 * on every VM (providers/systemd/sync.ts), which checks a changed field against the VM's own
 * policy, then rewrites the service's env file and restarts it when the file changed. No TTL: it
 * is the deployment's desired state.
 */
export const DEPLOY_VM_CONFIG_KEY = 'space:deploy:vm-config';
/** A VM service name in {@link DEPLOY_VM_CONFIG_KEY}: a unit, and for agents `@<pool>`. */
export const VM_SERVICE = /^space-[a-z][a-z0-9-]{0,40}(@[a-z0-9][a-z0-9-]{0,40})?$/;

export const keys = {
  /** Hash: one sandbox record (fields of `Sandbox`, metadata/env as JSON). */
  sandbox: (id: string) => `${KEY_PREFIX}sandbox:${id}`,
  /** Sorted set: every sandbox id, score = createdAt ms (listing order, cursor pagination). */
  sandboxIndex: () => `${KEY_PREFIX}sandboxes`,
  /** Sorted set: running/paused sandbox ids, score = deadline ms (lifetime enforcement). */
  deadlines: () => `${KEY_PREFIX}deadlines`,
  /** Hash: one operation. */
  operation: (id: string) => `${KEY_PREFIX}operation:${id}`,
  /** Stream: operations waiting for a worker (consumer group `workers`). */
  operationQueue: () => `${KEY_PREFIX}operations:queue`,
  /** Pub/sub channel announcing an operation's change (message = state). */
  operationChannel: (id: string) => `${KEY_PREFIX}operation:${id}:events`,
  /** Hash: an Idempotency-Key's outcome (`bodyHash`, `sandboxId`, `operationId`). */
  idempotency: (scope: string, key: string) => `${KEY_PREFIX}idempotency:${scope}:${key}`,
  /**
   * Hash: an API key, by the SHA-256 hex of its secret (`id`, `name`, `team`, `scopes` space-separated,
   * `createdAt`, `expiresAtMs` ('' = never), `lastUsedAt`, `rotatedTo`). Keys written before teams
   * hold only `name` and `createdAt` (api/api-keys.ts migrates them).
   */
  apiKey: (sha256Hex: string) => `${KEY_PREFIX}apikey:${sha256Hex}`,
  /** String: an API key's id → the SHA-256 hex of its secret (revoke, rotate, list by id). */
  apiKeyById: (id: string) => `${KEY_PREFIX}apikey-id:${id}`,
  /**
   * String: set once a deployment-provisioned key (`SPACE_BOOTSTRAP_API_KEY_SHA256`) was imported,
   * so a revoked one is not brought back by the next API start. No TTL.
   */
  bootstrapKeyImported: (sha256Hex: string) => `${KEY_PREFIX}apikey-bootstrap:${sha256Hex}`,
  /** Set: ids of a team's API keys. */
  teamApiKeys: (team: string) => `${KEY_PREFIX}team:${team}:keys`,
  /** Hash: a team (`id`, `createdAt`, `quotas` JSON of overrides). */
  team: (id: string) => `${KEY_PREFIX}team:${id}`,
  /** Set: every team id. */
  teamIndex: () => `${KEY_PREFIX}teams`,
  /** Hash: what a team's live sandboxes reserve (`sandboxes`, `vcpusMilli`, `memoryMiB`); admit.lua, transition.lua. */
  teamUsage: (team: string) => `${KEY_PREFIX}team:${team}:reserved`,
  /**
   * Sorted set: a team's sandboxes (member id, score = createdAt ms), written with the global index
   * by admit.lua; the team's listing reads only this (pruned lazily like the global one).
   */
  teamSandboxes: (team: string) => `${KEY_PREFIX}team:${team}:sandboxes`,
  /**
   * Sorted set: the team's sandboxes not yet killed (member id, score = createdAt ms). admit.lua
   * adds, transition.lua removes on `killed`; a listing filtered to states other than `killed`
   * reads only this, not the week of killed records {@link teamSandboxes} also holds.
   */
  teamLiveSandboxes: (team: string) => `${KEY_PREFIX}team:${team}:sandboxes:live`,
  /** Sorted set: a team's sandbox creates of the last minute (member sandbox id, score ms); admit.lua. */
  teamCreates: (team: string) => `${KEY_PREFIX}team:${team}:creates`,
  /**
   * Sorted set: a team's open command streams (member = stream id, score = lease expiry ms on
   * Redis's clock); agents admit, renew and remove them (`agent/scripts/team-stream.lua`).
   */
  teamStreams: (team: string) => `${KEY_PREFIX}team:${team}:streams`,
  /** Stream: a team's audit log (every mutating API call), trimmed by age and length. */
  teamAudit: (team: string) => `${KEY_PREFIX}team:${team}:audit`,
  /**
   * Hash: a registered credential (`domains` JSON, `header`, `format`, `envVar`, `value`). The
   * default team's keep the key they had before teams (`credential:<name>`); another team's are
   * `credential:<team>:<name>` (names hold no `:`, so the two never meet).
   */
  credential: (team: string, name: string) =>
    team === DEFAULT_TEAM ? `${KEY_PREFIX}credential:${name}` : `${KEY_PREFIX}credential:${team}:${name}`,
  /** Set: names of a team's registered credentials (the default team's keeps its pre-team key). */
  credentialIndex: (team: string) =>
    team === DEFAULT_TEAM ? `${KEY_PREFIX}credentials` : `${KEY_PREFIX}team:${team}:credentials`,
  /** Set: ids of every registered node. */
  nodeIndex: () => `${KEY_PREFIX}nodes`,
  /** Hash: a node's registration, capacity and reservations. */
  node: (id: string) => `${KEY_PREFIX}node:${id}`,
  /** String with TTL {@link NODE_ALIVE_TTL_MS}: present while the node heartbeats. */
  nodeAlive: (id: string) => `${KEY_PREFIX}node:${id}:alive`,
  /** Hash: template → warm slots ready on the node. */
  nodeWarm: (id: string) => `${KEY_PREFIX}node:${id}:warm`,
  /** Set: sandbox ids the node's agent reported running at its last heartbeat (`inventoryAt` in the node hash). */
  nodeInventory: (id: string) => `${KEY_PREFIX}node:${id}:inventory`,
  /** Hash: sandbox id → why the node saw it end on its own (e.g. it crashed); read by reconciliation. */
  nodeEnded: (id: string) => `${KEY_PREFIX}node:${id}:ended`,
  /** Set: sandbox ids placed on the node (reconciliation). */
  nodeSandboxes: (id: string) => `${KEY_PREFIX}node:${id}:sandboxes`,
  /** Hash: a sandbox's open activity interval (`state` active|idle|paused, `since` ms, Redis clock). */
  usageOpen: (id: string) => `${KEY_PREFIX}usage:open:${id}`,
  /** Set: sandbox ids with an open activity interval. */
  usageOpenIndex: () => `${KEY_PREFIX}usage:open`,
  /** Hash: a sandbox's usage totals (`activeMs`, `idleMs`, `pausedMs`) and dimensions. */
  usageSandbox: (id: string) => `${KEY_PREFIX}usage:sandbox:${id}`,
  /** Hash: one minute's usage, field `<sandboxId>|<state>` → ms (minute = epoch ms / 60000). */
  usageMinute: (minute: number) => `${KEY_PREFIX}usage:m:${minute}`,
  /** Sorted set: idle running sandboxes, score = when the idle timer pauses them (ms). */
  autoPause: () => `${KEY_PREFIX}autopause`,
  /**
   * String: the envd access token the E2B routes hand out for a sandbox (a session token), kept so
   * every create/connect/get answers the same one and the router can check `/files` URLs the SDK
   * signed with it. TTL {@link envdTokenTtlSec}; `transition.lua` deletes it when the sandbox is killed.
   */
  e2bEnvdToken: (id: string) => `${KEY_PREFIX}e2b:envd-token:${id}`,
} as const;

/** Consumer group of {@link keys.operationQueue}. */
export const OPERATION_GROUP = 'workers';
