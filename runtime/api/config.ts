/** Settings of the control-plane API (env names, defaults with units, docs). */
import { ConfigError, type ConfigOf, loadConfig, setting } from '../core/config.ts';
import type { TeamQuotas } from '../core/tenancy.ts';

/**
 * Node flags the API's process runs with (`space up`, and the image's command in
 * providers/runtime-settings.ts). They size V8's young generation (semi-spaces, MiB): a burst of
 * creates allocates mostly request-scoped objects (~300 KiB per create, sampled 2026-12-05), and a
 * larger young generation collects them less often.
 * - `--max-semi-space-size=64` (Node's default 16 on 64-bit) lets it grow in bursts. Measured on
 *   a 2-vCPU VM: the API's CPU for a wave of 32 one-request warm creates, median of 12 settled
 *   waves, 70 ms with it against 90 ms without (four `space up --warm 32` stacks interleaved;
 *   `/proc` at 10 ms resolution).
 * - `--min-semi-space-size=16` keeps it from shrinking back to 1 MiB between bursts, where the
 *   first waves of a burst ran ~15 scavenges. Measured the same way (2026-12-05, 20 waves each):
 *   the API's CPU per wave 85–95 ms with it against 115 ms without; the slowest create of a wave,
 *   median, 120 against 136 ms.
 * The agent's CPU stayed the same with either flag, so only the API gets them. Each semi-space
 * stays between 16 and 64 MiB (Node's defaults: 1 and 16): up to 2 × 48 MiB more resident memory
 * than without them, and 2 × 16 MiB held even when idle. The API's was 158 MiB after the waves
 * with the first flag alone.
 */
export const API_NODE_FLAGS = ['--min-semi-space-size=16', '--max-semi-space-size=64'] as const;

export const apiSettings = {
  host: setting.string('SPACE_API_HOST', 'Address the API listens on.', '127.0.0.1'),
  port: setting.int('SPACE_API_PORT', 'TCP port of the API.', 8080, 0, 65535),
  redisUrl: setting.redisUrl('The state of record.'),
  redisWaitReplicas: setting.int(
    'SPACE_REDIS_WAIT_REPLICAS',
    'Redis replicas that must acknowledge the writes of each changing request and each operation end (Redis WAIT) before the API answers; 503 WRITE_NOT_REPLICATED when fewer do. 0 (off) for one Redis server; 1 with Sentinel.',
    0,
    0,
    16,
  ),
  redisWaitTimeoutMs: setting.int(
    'SPACE_REDIS_WAIT_TIMEOUT_MS',
    'Longest wait for those acknowledgements, ms.',
    1000,
    1,
    60_000,
  ),
  signingKeyFile: setting.string(
    'SPACE_SIGNING_KEY_FILE',
    'PKCS#8 PEM Ed25519 private key that signs session and dispatch tokens.',
  ),
  bootstrapKeyFile: setting.optionalString(
    'SPACE_BOOTSTRAP_API_KEY_FILE',
    'If set and absent, a first API key is created at start and written to this file (mode 0600).',
  ),
  bootstrapKeySha256: setting.optionalString(
    'SPACE_BOOTSTRAP_API_KEY_SHA256',
    'SHA-256 (hex) of an API key the deployment made (Pulumi holds the key as a secret): imported once at start as an admin of the default team; a revoked one stays revoked.',
  ),
  logLevel: setting.oneOf(
    'SPACE_LOG_LEVEL',
    'pino log level.',
    ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'],
    'info',
  ),
  bodyLimitBytes: setting.int(
    'SPACE_API_BODY_LIMIT_BYTES',
    'Largest accepted JSON body, bytes (1 MiB).',
    1_048_576,
    1024,
  ),
  defaultTimeoutSec: setting.int(
    'SPACE_DEFAULT_TIMEOUT_SEC',
    'Sandbox lifetime when a create names none, s.',
    300,
    1,
  ),
  maxTimeoutSec: setting.int(
    'SPACE_MAX_TIMEOUT_SEC',
    'Longest sandbox lifetime a client may ask for, s (24 h).',
    86_400,
    1,
  ),
  sessionTokenTtlSec: setting.int(
    'SPACE_SESSION_TOKEN_TTL_SEC',
    'Lifetime of minted session tokens, s.',
    3600,
    10,
  ),
  workerConcurrency: setting.int(
    'SPACE_WORKER_CONCURRENCY',
    'Operations one API process runs at once.',
    32,
    1,
    1024,
  ),
  dispatchTimeoutMs: setting.int(
    'SPACE_DISPATCH_TIMEOUT_MS',
    'Timeout of one call to a node agent, ms.',
    60_000,
    100,
  ),
  defaultAutoPauseSec: setting.int(
    'SPACE_DEFAULT_AUTO_PAUSE_SEC',
    'Idle seconds before a sandbox is paused when its create names none (0: never), s.',
    300,
    0,
  ),
  pausedRetentionSec: setting.int(
    'SPACE_PAUSED_RETENTION_SEC',
    'How long a paused sandbox is kept before it is killed (reason `retention`), s (7 days).',
    604_800,
    1,
  ),
  pauseMode: setting.oneOf(
    'SPACE_PAUSE_MODE',
    'How a pause that names no mode (and every auto-pause) holds a sandbox: `frozen` (in memory), `hibernated` (snapshot to disk, capacity freed) or `auto` (hibernated when the node can snapshot and its reserved memory is above SPACE_HIBERNATE_ABOVE_PERCENT, else frozen).',
    ['auto', 'frozen', 'hibernated'],
    'auto',
  ),
  hibernateAbovePercent: setting.int(
    'SPACE_HIBERNATE_ABOVE_PERCENT',
    'With SPACE_PAUSE_MODE=auto: reserved memory share of the node (%) above which pauses hibernate.',
    70,
    0,
    100,
  ),
  resumeTimeoutMs: setting.int(
    'SPACE_RESUME_TIMEOUT_MS',
    'How long a command on a paused sandbox waits for it to resume, ms.',
    60_000,
    100,
  ),
  tlsCertFile: setting.optionalString(
    'SPACE_API_TLS_CERT_FILE',
    'PEM certificate (chain) of the API. With the key: HTTPS; without: plain HTTP (behind a TLS-terminating load balancer).',
  ),
  tlsKeyFile: setting.optionalString('SPACE_API_TLS_KEY_FILE', 'PEM private key of the API certificate.'),
  publicDataPlaneUrl: setting.optionalString(
    'SPACE_ROUTER_URL',
    'Public base URL of the router; data-plane URLs handed to clients point there. Empty: the node agent’s own URL.',
  ),
  nodeLostGraceMs: setting.int(
    'SPACE_NODE_LOST_GRACE_MS',
    'How long a node may miss heartbeats (an agent restart, a rolling upgrade) before its sandboxes are declared lost and the node is fenced, ms (2 min).',
    120_000,
    1000,
  ),
  reaperIntervalMs: setting.int(
    'SPACE_REAPER_INTERVAL_MS',
    'How often expired sandboxes are collected, ms.',
    500,
    50,
  ),
  teamMaxSandboxes: setting.int(
    'SPACE_TEAM_MAX_SANDBOXES',
    'Default quota: sandboxes a team may hold at once (every state but killed; 0: unlimited). Per-team overrides: `PATCH /v1/teams/:id`.',
    200,
    0,
  ),
  teamMaxVcpus: setting.int(
    'SPACE_TEAM_MAX_VCPUS',
    'Default quota: vCPUs a team’s sandboxes may reserve at once (0: unlimited).',
    400,
    0,
  ),
  teamMaxMemoryMiB: setting.int(
    'SPACE_TEAM_MAX_MEMORY_MIB',
    'Default quota: memory a team’s sandboxes may reserve at once, MiB (0: unlimited; 800 GiB).',
    819_200,
    0,
  ),
  teamCreatesPerMinute: setting.int(
    'SPACE_TEAM_CREATES_PER_MINUTE',
    'Default rate limit: sandbox creates a team may make in any 60 s window (0: unlimited).',
    600,
    0,
  ),
  teamMaxStreams: setting.int(
    'SPACE_TEAM_MAX_STREAMS',
    'Default quota: command output streams a team may hold open at once, through the router or on agents directly (0: unlimited). Carried in the session tokens minted from then on; over it: RATE_LIMITED.',
    1000,
    0,
  ),
  keyRotationOverlapSec: setting.int(
    'SPACE_KEY_ROTATION_OVERLAP_SEC',
    'How long a rotated API key keeps working beside its successor when the rotation names no overlap, s (1 h).',
    3600,
    0,
  ),
  auditRetentionSec: setting.int(
    'SPACE_AUDIT_RETENTION_SEC',
    'How long audit entries are kept, s (90 days).',
    7_776_000,
    60,
  ),
  auditMaxEntries: setting.int(
    'SPACE_AUDIT_MAX_ENTRIES',
    'Most audit entries kept per team (older ones are trimmed first).',
    100_000,
    100,
  ),
};

/** The default quotas of a team (config), as {@link TeamQuotas}. Pure. */
export function defaultQuotas(c: ApiConfig): TeamQuotas {
  return {
    sandboxes: c.teamMaxSandboxes,
    vcpus: c.teamMaxVcpus,
    memoryMiB: c.teamMaxMemoryMiB,
    createsPerMinute: c.teamCreatesPerMinute,
    streams: c.teamMaxStreams,
  };
}

export type ApiConfig = ConfigOf<typeof apiSettings>;

/** Reads the API settings from the environment; throws ConfigError listing every problem. */
export function loadApiConfig(env: NodeJS.ProcessEnv = process.env): ApiConfig {
  const config = loadConfig('api', apiSettings, env);
  if (Boolean(config.tlsCertFile) !== Boolean(config.tlsKeyFile)) {
    throw new ConfigError('api', [
      'SPACE_API_TLS_CERT_FILE and SPACE_API_TLS_KEY_FILE: set both (HTTPS) or neither (plain HTTP)',
    ]);
  }
  if (config.bootstrapKeySha256 && !/^[0-9a-f]{64}$/.test(config.bootstrapKeySha256)) {
    throw new ConfigError('api', ['SPACE_BOOTSTRAP_API_KEY_SHA256: must be 64 lower-case hex digits']);
  }
  return config;
}
