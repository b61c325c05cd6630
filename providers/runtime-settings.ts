/**
 * What both deployment components (Kubernetes, systemd) agree on: ports, paths, the image, the
 * service commands and the environment of each service. Names and defaults follow the runtime's
 * own config declarations (`runtime/{api,agent,gateway,router}/config.ts`), which the
 * `apiEnv`/`agentEnv`/`gatewayEnv` overrides are checked against. Those config modules are the
 * only part of the runtime read here (their public settings tables and the few names they export
 * for deployments); nothing reaches into a service's internals.
 */

import { agentSettings, HOST_IF_PREFIX } from '../runtime/agent/config.ts';
import { API_NODE_FLAGS, apiSettings } from '../runtime/api/config.ts';
import { OTEL_SETTING } from '../runtime/core/vm-config.ts';
import { gatewaySettings } from '../runtime/gateway/config.ts';
import { routerSettings } from '../runtime/router/config.ts';
import type { NodePool } from './node-pool.ts';

/** TCP port of the API (`SPACE_API_PORT`). */
export const API_PORT = 8080;
/** TCP port of the node agent: data plane for clients plus internal dispatch (`SPACE_AGENT_PORT`). */
export const AGENT_PORT = 8081;
/** TCP port of the data-plane router, the clients' only way to sandboxes (`SPACE_ROUTER_PORT`). */
export const ROUTER_PORT = 8082;
/** TCP port of Redis. */
export const REDIS_PORT = 6379;

/**
 * Persistence of the one Redis (the state of record), the same on Kubernetes and VMs, as
 * `redis-server` option/value pairs: the append-only file on, fsync'd every second (at most about
 * one second of writes lost on a crash; redis.io/docs/latest/operate/oss_and_stack/management/
 * persistence/, "AOF" and "fsync policies"), rewritten when it doubles. RDB snapshots keep
 * Redis's defaults. Backups: scripts/redis-backup.sh (docs/deployment.md "Redis").
 */
export const REDIS_PERSISTENCE: readonly (readonly [string, string])[] = [
  ['appendonly', 'yes'],
  ['appendfsync', 'everysec'],
  ['auto-aof-rewrite-percentage', '100'],
  ['auto-aof-rewrite-min-size', '64mb'],
];

/** TCP port of Redis Sentinel (its documented default; redis.io/docs/latest/operate/oss_and_stack/management/sentinel/). */
export const SENTINEL_PORT = 26379;
/**
 * The primary's name in every sentinel's `sentinel monitor` line and in `SPACE_REDIS_URL`
 * (`redis-sentinel://…/space`), in both deployment modes.
 */
export const REDIS_PRIMARY_NAME = 'space';

/**
 * What every data server of a Sentinel deployment adds to {@link REDIS_PERSISTENCE}, as
 * `redis-server` option/value pairs: a primary that has not heard from at least one replica for
 * 10 s refuses writes (`min-replicas-to-write 1`, `min-replicas-max-lag 10`; redis.io "Replication",
 * "Allow writes only with N attached replicas"). That bounds what an old primary cut off from the
 * others, which the sentinels have replaced, can accept and then lose at its demotion, to about
 * 10 s of writes; a primary with no replica left at all refuses writes until one is back.
 */
export const REDIS_REPLICATION: readonly (readonly [string, string])[] = [
  ['min-replicas-to-write', '1'],
  ['min-replicas-max-lag', '10'],
];

/**
 * How the sentinels judge and replace a primary, both modes: down after 5 s without a valid
 * answer (`down-after-milliseconds`), a failover retried after 30 s (`failover-timeout`), replicas
 * re-pointed one at a time (`parallel-syncs 1`, so the others keep serving reads). Redis's own
 * defaults are 30 s and 180 s (sentinel.conf of the redis distribution).
 */
export const SENTINEL_TIMING = { downAfterMs: 5000, failoverTimeoutMs: 30000, parallelSyncs: 1 } as const;

/**
 * The sentinels' quorum for `n` sentinels: a majority, `floor(n/2)+1`. A failover also needs a
 * majority of all sentinels to elect the one that runs it, so with a majority quorum the two
 * rules agree. Pure.
 */
export const sentinelQuorum = (n: number): number => Math.floor(n / 2) + 1;

/** Where the services find their key files (mounted Secret / files written on the VM). */
export const KEY_DIR = '/etc/space/keys';
/** Private Ed25519 key (PKCS#8 PEM) of the API. */
export const SIGNING_KEY_FILE = `${KEY_DIR}/signing.pem`;
/** Public Ed25519 key (SPKI PEM) of the agents. */
export const VERIFY_KEY_FILE = `${KEY_DIR}/verify.pem`;
/** Agent state (sandbox records, spools): a host path, so a restarted agent re-adopts. */
export const AGENT_STATE_DIR = '/var/lib/space/agent';
/** Template build cache: a host path. */
export const CACHE_DIR = '/var/lib/space';
/** Where the API writes its bootstrap API key when none exists. */
export const BOOTSTRAP_API_KEY_FILE = '/var/lib/space/api/api-key';

/**
 * Host directory the gateway and the agent of a node share: the gateway's control socket lives
 * there (mode 0600, so both run as root). A host path in both modes (hostPath / a VM directory).
 */
export const GATEWAY_RUN_DIR = '/run/space';
/** The gateway's control socket: `SPACE_GATEWAY_CONTROL_SOCKET`, the same path on both sides. */
export const GATEWAY_CONTROL_SOCKET = `${GATEWAY_RUN_DIR}/gateway.sock`;
/**
 * The gateway's listening ports (host network, bound on 0.0.0.0). The agent redirects sandbox DNS,
 * TCP 80 and TCP 443 to these; a host firewall ({@link gatewayGuardRuleset}) closes them to anything
 * but sandbox interfaces.
 */
export const GATEWAY_PORTS = { dns: 15053, http: 15080, tls: 15443 } as const;
/**
 * The gateway's Prometheus endpoint (`SPACE_GATEWAY_METRICS_PORT`). Not a sandbox-facing port: the
 * guard table leaves it alone; cloud firewalls do not open it to the internet.
 */
export const GATEWAY_METRICS_PORT = 15090;
/** Path of every service's Prometheus endpoint. */
export const METRICS_PATH = '/metrics';

/**
 * Pod annotations that ask Prometheus to scrape `port` at {@link METRICS_PATH}. The names are the
 * convention of the prometheus-community chart's `kubernetes-pods` job (prometheus-community/
 * helm-charts `charts/prometheus/values.yaml`), not a Kubernetes API: Prometheus's own example
 * (prometheus/prometheus `documentation/examples/prometheus-kubernetes.yml`, job `kubernetes-pods`)
 * leaves the annotation names to the operator's relabelling.
 */
export function scrapeAnnotations(port: number): Record<string, string> {
  return {
    'prometheus.io/scrape': 'true',
    'prometheus.io/port': String(port),
    'prometheus.io/path': METRICS_PATH,
  };
}

/** Where the per-deployment CA is: cert + key for the gateway, only the cert for the agent. */
export const GATEWAY_CA_DIR = '/etc/space/gateway-ca';
/** PEM certificate of the gateway CA (public: sandboxes trust it through `SPACE_TRUSTED_CA_FILE`). */
export const GATEWAY_CA_CERT_FILE = `${GATEWAY_CA_DIR}/ca.crt`;
/** PEM private key of the gateway CA (mode 0600/0400, root only, gateway only). */
export const GATEWAY_CA_KEY_FILE = `${GATEWAY_CA_DIR}/ca.key`;

/**
 * The services of the one image, with the command each runs (working directory /opt/space). The
 * agent runs under tini as a subreaper: `runsc run --detach` leaves each sandbox's processes
 * behind, re-parented to the nearest subreaper, and `runsc delete` waits until its sandbox process
 * has been reaped, so the agent does not depend on how promptly the node's init or the container
 * runtime reaps (README, Operating notes).
 */
export const SERVICE_COMMANDS = {
  api: ['node', ...API_NODE_FLAGS, 'runtime/api/server.ts'],
  agent: ['tini', '-s', '--', 'node', 'runtime/agent/server.ts'],
  gateway: ['node', 'runtime/gateway/server.ts'],
  router: ['node', 'runtime/router/server.ts'],
} as const;

/** A SPACE service deployed by the components. */
export type Service = keyof typeof SERVICE_COMMANDS;

/** Default image repository (one image, one command per service). */
export const DEFAULT_IMAGE_REPOSITORY = 'ghcr.io/space-sandbox/space';

/** `repository:version`: the only place an image reference is made, so `space:version` drives every tag. */
export function imageRef(repository: string, version: string): string {
  return `${repository}:${version}`;
}

/** `space:agentDrainSeconds` when the stack sets none, s (both deployment modes). */
export const DEFAULT_AGENT_DRAIN_SECONDS = 120;

/** Settings the deployment owns: an override in `apiEnv`/`agentEnv` is refused. */
export const DEPLOYMENT_OWNED = [
  'SPACE_API_HOST',
  'SPACE_API_PORT',
  'SPACE_REDIS_URL',
  'SPACE_SIGNING_KEY_FILE',
  'SPACE_BOOTSTRAP_API_KEY_FILE',
  'SPACE_NODE_ID',
  'SPACE_AGENT_HOST',
  'SPACE_AGENT_PORT',
  'SPACE_AGENT_URL',
  'SPACE_VERIFY_KEY_FILE',
  'SPACE_AGENT_STATE_DIR',
  'SPACE_CACHE_DIR',
  'SPACE_DRIVER',
  'SPACE_AGENT_ON_SHUTDOWN',
  // Kubernetes: the cordon watcher writes the drain file; the wait (both modes) is space:agentDrainSeconds
  'SPACE_DRAIN_FILE',
  'SPACE_DRAIN_WAIT_MS',
  // gateway ↔ agent wiring: both sides must agree, so neither may change them alone
  'SPACE_GATEWAY_BIND_HOST',
  'SPACE_GATEWAY_CONTROL_SOCKET',
  'SPACE_GATEWAY_DNS_PORT',
  'SPACE_GATEWAY_HTTP_PORT',
  'SPACE_GATEWAY_TLS_PORT',
  'SPACE_GATEWAY_CA_CERT_FILE',
  'SPACE_GATEWAY_CA_KEY_FILE',
  'SPACE_TRUSTED_CA_FILE',
  // the scrape annotations name this port
  'SPACE_GATEWAY_METRICS_PORT',
  'SPACE_GATEWAY_METRICS_HOST',
  // the router and the TLS files of both client-facing services
  'SPACE_ROUTER_HOST',
  'SPACE_ROUTER_PORT',
  'SPACE_ROUTER_TLS_CERT_FILE',
  'SPACE_ROUTER_TLS_KEY_FILE',
  'SPACE_API_TLS_CERT_FILE',
  'SPACE_API_TLS_KEY_FILE',
] as const;

/** Settings with their own stack config key: an override in `gatewayEnv` is refused, naming the key. */
export const OWN_KEY: Readonly<Record<string, string>> = {
  SPACE_GATEWAY_UPSTREAM_DNS: 'space:gatewayUpstreamDns',
  SPACE_GATEWAY_DENY_CIDRS: 'space:gatewayDenyCidrs',
  SPACE_ROUTER_URL: 'space:routerUrl',
};

/** Env names the runtime declares, per service (from its config modules). */
export const KNOWN_ENV = {
  api: new Set(Object.values(apiSettings).map((s) => s.env)),
  agent: new Set(Object.values(agentSettings).map((s) => s.env)),
  gateway: new Set(Object.values(gatewaySettings).map((s) => s.env)),
  router: new Set(Object.values(routerSettings).map((s) => s.env)),
} as const;

/** OpenTelemetry's `OTEL_*` variables: allowed by name pattern for the services that trace. */
export const OTEL_ENV = OTEL_SETTING;

/** Services that export traces (runtime/core/tracing.ts `startTracing`): they take `OTEL_*`. */
export const TRACED: ReadonlySet<keyof typeof KNOWN_ENV> = new Set(['api', 'agent', 'router']);

/** The `OTEL_*` entries of `env` (what turns tracing on), e.g. to give the router the API's. Pure. */
export function tracingEnvironment(env: Readonly<Record<string, string>> = {}): Record<string, string> {
  return Object.fromEntries(Object.entries(env).filter(([k]) => OTEL_ENV.test(k)));
}

/**
 * Checks operator overrides (`space:apiEnv`, `space:agentEnv`, `space:gatewayEnv`): every key must
 * be a setting the service declares (or, for a service that traces, an `OTEL_*` variable) and not
 * one the deployment owns; values must be strings. Returns problems.
 */
export function checkEnvOverrides(service: keyof typeof KNOWN_ENV, env: unknown, path: string): string[] {
  if (env === undefined) return [];
  if (typeof env !== 'object' || env === null || Array.isArray(env)) return [`${path}: must be an object`];
  const problems: string[] = [];
  for (const [k, v] of Object.entries(env)) {
    if (OTEL_ENV.test(k)) {
      if (!TRACED.has(service)) problems.push(`${path}.${k}: the ${service} exports no traces`);
    } else if (!KNOWN_ENV[service].has(k))
      problems.push(`${path}.${k}: not a ${service} setting (see README.md)`);
    else if ((DEPLOYMENT_OWNED as readonly string[]).includes(k))
      problems.push(`${path}.${k}: set by the deployment; cannot be overridden`);
    else if (OWN_KEY[k]) problems.push(`${path}.${k}: set it with ${OWN_KEY[k]}`);
    if (typeof v !== 'string') problems.push(`${path}.${k}: must be a string`);
  }
  return problems;
}

/**
 * Non-secret environment of the API. The Redis URL is not here: it may carry a password, so each
 * component passes it its own way (Kubernetes Secret, or a private-address URL on VMs).
 */
export function apiEnvironment(
  overrides: Readonly<Record<string, string>> = {},
  opts: { routerUrl?: string; tls?: boolean; replicatedRedis?: boolean } = {},
): Record<string, string> {
  return {
    // with replicas, a write a client is told about waits until one has it (a failover then loses
    // none of it: docs/operations.md); `space:apiEnv` may still set another count
    ...(opts.replicatedRedis ? { SPACE_REDIS_WAIT_REPLICAS: '1' } : {}),
    ...overrides,
    // data-plane URLs handed to clients name the router, never an agent's (private) address
    ...(opts.routerUrl ? { SPACE_ROUTER_URL: opts.routerUrl } : {}),
    ...(opts.tls ? { SPACE_API_TLS_CERT_FILE: TLS_CERT_FILE, SPACE_API_TLS_KEY_FILE: TLS_KEY_FILE } : {}),
    SPACE_API_HOST: '0.0.0.0',
    SPACE_API_PORT: String(API_PORT),
    SPACE_SIGNING_KEY_FILE: SIGNING_KEY_FILE,
    SPACE_BOOTSTRAP_API_KEY_FILE: BOOTSTRAP_API_KEY_FILE,
  };
}

/**
 * Where a client-facing service finds its TLS certificate and key: the `kubernetes.io/tls` Secret
 * cert-manager writes (`tls.crt`, `tls.key`) mounted here, or files on the control VM.
 */
export const TLS_DIR = '/etc/space/tls';
/** Certificate chain (PEM) in {@link TLS_DIR}. */
export const TLS_CERT_FILE = `${TLS_DIR}/tls.crt`;
/** Private key (PEM) in {@link TLS_DIR}. */
export const TLS_KEY_FILE = `${TLS_DIR}/tls.key`;

/**
 * Non-secret environment of the router: it needs only Redis (passed by each component, as for the
 * API) and the verify key; with `tls`, it serves HTTPS (ALPN h2 + http/1.1) from {@link TLS_DIR}.
 */
export function routerEnvironment(
  opts: { tls?: boolean; env?: Readonly<Record<string, string>> } = {},
): Record<string, string> {
  return {
    ...opts.env,
    SPACE_ROUTER_HOST: '0.0.0.0',
    SPACE_ROUTER_PORT: String(ROUTER_PORT),
    SPACE_VERIFY_KEY_FILE: VERIFY_KEY_FILE,
    ...(opts.tls
      ? { SPACE_ROUTER_TLS_CERT_FILE: TLS_CERT_FILE, SPACE_ROUTER_TLS_KEY_FILE: TLS_KEY_FILE }
      : {}),
  };
}

/** How the node's egress gateway is deployed (`space:gateway*`). */
export interface GatewayOptions {
  /** Run a gateway beside every agent. False: agents get no control socket = no egress at all. */
  readonly enabled: boolean;
  /** `SPACE_GATEWAY_UPSTREAM_DNS` as a list of `ip:port`. Default: the gateway's own. */
  readonly upstreamDns?: readonly string[];
  /** `SPACE_GATEWAY_DENY_CIDRS` as a list. Default: the gateway's own. */
  readonly denyCidrs?: readonly string[];
  /** Extra gateway settings (`space:gatewayEnv`, checked by the stack config). */
  readonly env?: Readonly<Record<string, string>>;
}

/** Non-secret environment of the gateway (the CA files are provided by each component). */
export function gatewayEnvironment(g: GatewayOptions): Record<string, string> {
  return {
    ...g.env,
    ...(g.upstreamDns?.length ? { SPACE_GATEWAY_UPSTREAM_DNS: g.upstreamDns.join(',') } : {}),
    ...(g.denyCidrs?.length ? { SPACE_GATEWAY_DENY_CIDRS: g.denyCidrs.join(',') } : {}),
    SPACE_GATEWAY_BIND_HOST: '0.0.0.0',
    SPACE_GATEWAY_DNS_PORT: String(GATEWAY_PORTS.dns),
    SPACE_GATEWAY_HTTP_PORT: String(GATEWAY_PORTS.http),
    SPACE_GATEWAY_TLS_PORT: String(GATEWAY_PORTS.tls),
    SPACE_GATEWAY_CONTROL_SOCKET: GATEWAY_CONTROL_SOCKET,
    SPACE_GATEWAY_CA_CERT_FILE: GATEWAY_CA_CERT_FILE,
    SPACE_GATEWAY_CA_KEY_FILE: GATEWAY_CA_KEY_FILE,
    SPACE_GATEWAY_METRICS_PORT: String(GATEWAY_METRICS_PORT),
  };
}

/**
 * Host firewall of an agent node (nftables table `inet space_gateway_guard`, idempotent `nft -f`
 * script): the gateway listens on 0.0.0.0 in the host network, so its ports are dropped unless the
 * packet came in on loopback or a sandbox interface (`spv*`, where the agent's nftables redirects
 * sandbox DNS/HTTP/TLS to them). Other chains still apply to what this one lets through. Pure.
 */
export function gatewayGuardRuleset(): string {
  const t = 'inet space_gateway_guard';
  const { dns, http, tls } = GATEWAY_PORTS;
  return [
    '# rendered by providers/runtime-settings.ts (gatewayGuardRuleset): gateway ports only from sandboxes',
    `table ${t}`,
    `delete table ${t}`,
    `table ${t} {`,
    '  chain input {',
    '    type filter hook input priority -10; policy accept;',
    '    iifname "lo" accept',
    `    iifname "${HOST_IF_PREFIX}*" accept`,
    `    tcp dport { ${dns}, ${http}, ${tls} } counter drop`,
    `    udp dport ${dns} counter drop`,
    '  }',
    '}',
    '',
  ].join('\n');
}

/**
 * Non-secret environment of the agent of `pool`. `SPACE_NODE_ID` and `SPACE_AGENT_URL` depend on
 * the node and are set by each component (downward API / a boot-time script). With the gateway,
 * the agent gets its control socket, ports and CA certificate; without, none of them: sandboxes
 * then have no egress at all.
 */
export function agentEnvironment(
  pool: NodePool,
  overrides: Readonly<Record<string, string>> = {},
  gateway: Pick<GatewayOptions, 'enabled'> = { enabled: false },
): Record<string, string> {
  return {
    // a node has no shell to build templates on: the agent builds its warm templates at first start
    SPACE_BUILD_TEMPLATES: 'warm',
    ...overrides,
    ...(gateway.enabled
      ? {
          SPACE_GATEWAY_CONTROL_SOCKET: GATEWAY_CONTROL_SOCKET,
          SPACE_GATEWAY_DNS_PORT: String(GATEWAY_PORTS.dns),
          SPACE_GATEWAY_HTTP_PORT: String(GATEWAY_PORTS.http),
          SPACE_GATEWAY_TLS_PORT: String(GATEWAY_PORTS.tls),
          SPACE_TRUSTED_CA_FILE: GATEWAY_CA_CERT_FILE,
        }
      : {}),
    SPACE_AGENT_HOST: '0.0.0.0',
    SPACE_AGENT_PORT: String(AGENT_PORT),
    SPACE_VERIFY_KEY_FILE: VERIFY_KEY_FILE,
    SPACE_AGENT_STATE_DIR: AGENT_STATE_DIR,
    SPACE_CACHE_DIR: CACHE_DIR,
    SPACE_DRIVER: pool.driver,
    // sandboxes keep running across an agent restart and are re-adopted (upgrades lose nothing)
    SPACE_AGENT_ON_SHUTDOWN: 'keep',
  };
}
