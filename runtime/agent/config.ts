/** Settings of the node agent (env names, defaults with units, docs). */
import { cpus, hostname, totalmem } from 'node:os';
import { type ConfigOf, loadConfig, setting } from '../core/config.ts';
import { DRIVER_NAMES } from '../core/drivers.ts';
import { DEFAULT_GVISOR_PLATFORM } from './drivers/gvisor-platform.ts';
import { DEFAULT_IMAGE_ASSETS_DIR } from './image/assets.ts';

/** Host-end prefix of sandbox veths (`spv<id>`): public for the deploy layer's gateway guard. */
export { HOST_IF_PREFIX } from './host/firewall.ts';

export const agentSettings = {
  nodeId: setting.string('SPACE_NODE_ID', 'Node id (default: the host name).', hostname()),
  host: setting.string(
    'SPACE_AGENT_HOST',
    'Address the agent listens on (data plane + internal routes).',
    '127.0.0.1',
  ),
  port: setting.int('SPACE_AGENT_PORT', 'TCP port of the agent.', 8081, 0, 65535),
  advertiseUrl: setting.optionalString(
    'SPACE_AGENT_URL',
    'URL clients and the API use to reach this agent (default http://<host>:<port>).',
  ),
  redisUrl: setting.redisUrl('The state of record.'),
  verifyKeyFile: setting.string('SPACE_VERIFY_KEY_FILE', 'SPKI PEM Ed25519 public key that verifies tokens.'),
  stateDir: setting.string(
    'SPACE_AGENT_STATE_DIR',
    'Agent state: instances, spools, sandbox records.',
    '/var/lib/space/agent',
  ),
  cacheDir: setting.string('SPACE_CACHE_DIR', 'Template build cache.', '/var/lib/space'),
  imageAssetsDir: setting.string(
    'SPACE_IMAGE_ASSETS_DIR',
    'What the runtime image bakes in: the VM drivers’ guest kernel (`guest-kernel/`) and the default templates (`templates/`), used instead of apt and debootstrap at run time.',
    DEFAULT_IMAGE_ASSETS_DIR,
  ),
  templatesDir: setting.optionalString(
    'SPACE_TEMPLATES_DIR',
    "Folder of template definitions, `<name>.json` (default: the `templates/` folder beside the runtime). A platform team's own templates go here with copies of the ones it keeps.",
  ),
  driver: setting.oneOf(
    'SPACE_DRIVER',
    'VM driver of this node (`auto`: a VMM driver when KVM is usable and its binary is present, else gvisor).',
    ['auto', ...DRIVER_NAMES] as const,
    'auto',
  ),
  gvisorPlatform: setting.oneOf(
    'SPACE_GVISOR_PLATFORM',
    'runsc platform of the gvisor driver (default from measurements: see runtime/agent/drivers/gvisor-platform.ts).',
    ['ptrace', 'systrap'] as const,
    DEFAULT_GVISOR_PLATFORM,
  ),
  guestReadyTimeoutMs: setting.int(
    'SPACE_GUEST_READY_TIMEOUT_MS',
    'How long a booted or restored instance may take until its guest daemon answers, ms (0: the driver’s own, 30 000; QEMU without KVM 180 000). A create that waits longer fails DRIVER_FAILED; raise it on slow hosts (software emulation), with the API’s SPACE_DISPATCH_TIMEOUT_MS above it.',
    0,
    0,
  ),
  gvisorSnapshots: setting.oneOf(
    'SPACE_GVISOR_SNAPSHOTS',
    '`on`: the gvisor driver snapshots each warm template once and creates restore from it (a restore that fails falls back to a boot); `off`: always boot.',
    ['on', 'off'] as const,
    'on',
  ),
  runscBinary: setting.string('SPACE_RUNSC_BINARY', 'runsc binary (gvisor driver).', 'runsc'),
  qemuBinary: setting.string('SPACE_QEMU_BINARY', 'QEMU binary (qemu driver).', 'qemu-system-x86_64'),
  firecrackerBinary: setting.string(
    'SPACE_FIRECRACKER_BINARY',
    'Firecracker binary (firecracker driver).',
    '/usr/local/bin/firecracker',
  ),
  jailerBinary: setting.string('SPACE_JAILER_BINARY', 'Firecracker jailer binary.', '/usr/local/bin/jailer'),
  cloudHypervisorBinary: setting.string(
    'SPACE_CLOUD_HYPERVISOR_BINARY',
    'Cloud Hypervisor binary (cloud-hypervisor driver).',
    '/usr/local/bin/cloud-hypervisor',
  ),
  kvm: setting.oneOf(
    'SPACE_KVM',
    '`auto`: use KVM when a test boot under it succeeds; `off`: never (QEMU falls back to software emulation).',
    ['auto', 'off'] as const,
    'auto',
  ),
  buildTemplates: setting.oneOf(
    'SPACE_BUILD_TEMPLATES',
    'At start, build the templates this node has not built yet: `warm` (the warm templates, debootstrap from the Debian archive: minutes, once per node and definition) or `off` (build them with `space template build`). Deployments set `warm`: their nodes have no shell to build on.',
    ['off', 'warm'] as const,
    'off',
  ),
  warmTemplates: setting.optionalString(
    'SPACE_WARM_TEMPLATES',
    'Comma list of templates to keep warm (default: base).',
  ),
  warmPoolSize: setting.int(
    'SPACE_WARM_POOL_SIZE',
    'Warm instances always kept per template (the pool grows past it with demand, up to SPACE_WARM_POOL_MAX).',
    2,
    0,
    256,
  ),
  warmPoolMax: setting.int(
    'SPACE_WARM_POOL_MAX',
    'Most warm instances kept per template: the pool holds enough for the busiest second of creates in the last minute, times the seconds one refill takes, within this and SPACE_WARM_MEMORY_SHARE (raised to SPACE_WARM_POOL_SIZE when below it).',
    32,
    0,
    1024,
  ),
  warmMemoryShare: setting.number(
    'SPACE_WARM_MEMORY_SHARE',
    'Largest fraction of SPACE_NODE_MEMORY_MIB that demand may fill with warm instances (each counted at SPACE_WARM_MEMORY_MIB, the reservation it becomes once claimed).',
    0.5,
    0,
    1,
  ),
  warmRefillConcurrency: setting.int(
    'SPACE_WARM_REFILL_CONCURRENCY',
    'Warm instances made at once (refills always yield to creates waiting to start).',
    1,
    1,
    64,
  ),
  warmVcpus: setting.number(
    'SPACE_WARM_VCPUS',
    'vCPUs of warm instances (creates with another shape go cold).',
    1,
    0.25,
  ),
  warmMemoryMiB: setting.int('SPACE_WARM_MEMORY_MIB', 'Memory of warm instances, MiB.', 512, 128),
  vcpus: setting.number(
    'SPACE_NODE_VCPUS',
    'vCPUs this node offers (default: 32 × host CPUs: sandboxes idle most of the time; lower it for CPU-bound work).',
    cpus().length * 32,
    0.25,
  ),
  memoryMiB: setting.int(
    'SPACE_NODE_MEMORY_MIB',
    'Memory this node offers, MiB (default: 80 % of host memory).',
    Math.floor((totalmem() / 1048576) * 0.8),
    128,
  ),
  maxSandboxes: setting.int('SPACE_MAX_SANDBOXES', 'Most sandboxes on this node.', 128, 1, 16384),
  pidsLimit: setting.int(
    'SPACE_SANDBOX_PIDS_LIMIT',
    'Most tasks (processes and threads) each user may run inside a sandbox (RLIMIT_NPROC; gVisor: also at most one per 2 MiB of its memory above 256); a fork past it fails with EAGAIN inside.',
    1024,
    16,
  ),
  diskMiB: setting.int(
    'SPACE_SANDBOX_DISK_MIB',
    'Writable disk of each sandbox (a sparse ext4 image of its own), MiB.',
    4096,
    64,
  ),
  networkPool: setting.string(
    'SPACE_NETWORK_POOL',
    'IPv4 pool for sandbox links (a /30 each).',
    '10.77.0.0/16',
  ),
  createConcurrency: setting.int(
    'SPACE_CREATE_CONCURRENCY',
    'Instances started (booted or restored from a snapshot) at once; more creates wait their turn, ahead of warm-pool refills.',
    4,
    1,
    64,
  ),
  watchdogMs: setting.int(
    'SPACE_WATCHDOG_INTERVAL_MS',
    'How often the agent checks its sandboxes are alive and re-registers with the gateway those it may no longer hold (after a gateway restart or a failed registration), ms.',
    5000,
    100,
  ),
  heartbeatMs: setting.int('SPACE_HEARTBEAT_INTERVAL_MS', 'Heartbeat interval, ms.', 5000, 100),
  maxUploadBytes: setting.int(
    'SPACE_MAX_UPLOAD_BYTES',
    'Largest file upload, bytes (1 GiB).',
    1_073_741_824,
    1,
  ),
  spoolLimitBytes: setting.int(
    'SPACE_SPOOL_LIMIT_BYTES',
    'Output kept per command, bytes (256 MiB); later output is dropped with a `truncated` event.',
    268_435_456,
    1024,
  ),
  spoolMaxCommands: setting.int(
    'SPACE_SPOOL_MAX_COMMANDS',
    'Command outputs (spool + record) kept per sandbox; past it the oldest finished ones are reclaimed (running ones never).',
    256,
    1,
  ),
  spoolSandboxBytes: setting.int(
    'SPACE_SPOOL_SANDBOX_BYTES',
    'Bytes of command output kept per sandbox (1 GiB); past it the oldest finished outputs are reclaimed.',
    1_073_741_824,
    1024,
  ),
  spoolRetentionMs: setting.int(
    'SPACE_SPOOL_RETENTION_MS',
    'A finished command’s output is reclaimed this long after it ended (1 h), or 30 s after a reader got its exit event, ms.',
    3_600_000,
    1000,
  ),
  diskReserveBytes: setting.int(
    'SPACE_DISK_RESERVE_BYTES',
    'Free space on the state directory’s file system below which the node takes no new sandboxes (unschedulable, `diskPressure` in its heartbeat; creates answer NODE_DISK_FULL) (1 GiB); running ones go on.',
    1_073_741_824,
    0,
  ),
  diskReservePercent: setting.number(
    'SPACE_DISK_RESERVE_PERCENT',
    'The same floor as a share of the file system’s size, percent; the larger of the two applies.',
    5,
    0,
    100,
  ),
  hibernateDir: setting.optionalString(
    'SPACE_HIBERNATE_DIR',
    'Folder of hibernated sandboxes (snapshots + spools); default `<state dir>/hibernated`. Point several nodes at shared storage to resume on any of them.',
  ),
  hibernateStore: setting.optionalString(
    'SPACE_HIBERNATE_STORE',
    'Name of the hibernation store; nodes with the same name must see the same SPACE_HIBERNATE_DIR (default `node:<node id>`: only this node).',
  ),
  activeGraceMs: setting.int(
    'SPACE_ACTIVE_GRACE_MS',
    'A sandbox stays active (metered, not auto-paused) this long after its last command or data-plane request ends, ms.',
    5000,
    0,
  ),
  maxStreams: setting.int('SPACE_MAX_STREAMS', 'Concurrent data-plane streams per sandbox.', 64, 1),
  onShutdown: setting.oneOf(
    'SPACE_AGENT_ON_SHUTDOWN',
    '`keep` sandboxes running across an agent restart (re-adopted at start), or `destroy` them.',
    ['keep', 'destroy'] as const,
    'keep',
  ),
  drainFile: setting.optionalString(
    'SPACE_DRAIN_FILE',
    'While this file exists the node is draining (e.g. cordoned before the cloud replaces it): heartbeats mark it unschedulable, so no new sandbox is placed here, and at SIGTERM the agent first waits up to SPACE_DRAIN_WAIT_MS for its sandboxes to end. Empty: never.',
  ),
  restartHoldMs: setting.int(
    'SPACE_AGENT_RESTART_HOLD_MS',
    'When the agent stops keeping its sandboxes (SPACE_AGENT_ON_SHUTDOWN=keep) and the node is not draining, it tells the control plane it will be back within this long (the node hash’s `restartBy`): until then the control plane does not declare the node lost, whatever its node-lost grace, so a slow restart or upgrade kills no sandbox. Capped by the API at 30 min. 0: no hold (the node-lost grace alone), ms.',
    600_000,
    0,
  ),
  drainWaitMs: setting.int(
    'SPACE_DRAIN_WAIT_MS',
    'How long a draining agent waits at SIGTERM for its sandboxes to end before it stops (they keep running, or are destroyed, per SPACE_AGENT_ON_SHUTDOWN), ms.',
    0,
    0,
  ),
  gatewaySocket: setting.optionalString(
    'SPACE_GATEWAY_CONTROL_SOCKET',
    'Unix socket of this node’s egress gateway; empty: no gateway, sandboxes have no egress at all.',
  ),
  gatewayDnsPort: setting.int(
    'SPACE_GATEWAY_DNS_PORT',
    'Gateway DNS port (udp+tcp) sandbox DNS is redirected to.',
    15053,
    1,
    65535,
  ),
  gatewayHttpPort: setting.int(
    'SPACE_GATEWAY_HTTP_PORT',
    'Gateway port sandbox TCP 80 is redirected to.',
    15080,
    1,
    65535,
  ),
  gatewayTlsPort: setting.int(
    'SPACE_GATEWAY_TLS_PORT',
    'Gateway port sandbox TCP 443 is redirected to.',
    15443,
    1,
    65535,
  ),
  trustedCaFile: setting.optionalString(
    'SPACE_TRUSTED_CA_FILE',
    'PEM CA certificate added to every sandbox’s trust store (the gateway’s per-deployment CA).',
  ),
  logLevel: setting.oneOf(
    'SPACE_LOG_LEVEL',
    'pino log level.',
    ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] as const,
    'info',
  ),
};

export type AgentConfig = ConfigOf<typeof agentSettings>;

/** Reads the agent settings from the environment; throws ConfigError listing every problem. */
export function loadAgentConfig(env: NodeJS.ProcessEnv = process.env): AgentConfig {
  return loadConfig('agent', agentSettings, env);
}

/** Templates to keep warm. */
export function warmTemplates(c: AgentConfig): string[] {
  return (c.warmTemplates || 'base')
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean);
}

/** The hibernation store this node reads: the configured name, else one of its own. Pure. */
export function hibernateStore(c: Pick<AgentConfig, 'hibernateStore' | 'nodeId'>): string {
  return c.hibernateStore || `node:${c.nodeId}`;
}
