/** Settings of the egress gateway (env names, defaults with units, docs). */
import { type ConfigOf, loadConfig, setting } from '../core/config.ts';
import { DEFAULT_DENY_CIDRS } from './addresses.ts';

export const gatewaySettings = {
  bindHost: setting.string(
    'SPACE_GATEWAY_BIND_HOST',
    'Address the DNS, HTTP and TLS listeners bind (nftables decides who reaches them).',
    '0.0.0.0',
  ),
  dnsPort: setting.int(
    'SPACE_GATEWAY_DNS_PORT',
    'DNS port (UDP and TCP); 0 = any free port.',
    15053,
    0,
    65535,
  ),
  httpPort: setting.int(
    'SPACE_GATEWAY_HTTP_PORT',
    'Transparent HTTP port (TCP 80 is redirected here).',
    15080,
    0,
    65535,
  ),
  tlsPort: setting.int(
    'SPACE_GATEWAY_TLS_PORT',
    'Transparent TLS port (TCP 443 is redirected here).',
    15443,
    0,
    65535,
  ),
  controlSocket: setting.string(
    'SPACE_GATEWAY_CONTROL_SOCKET',
    'Unix socket of the control API (mode 0600: only root, i.e. the agent).',
    '/run/space/gateway.sock',
  ),
  metricsPort: setting.int(
    'SPACE_GATEWAY_METRICS_PORT',
    'If not 0, also serve /metrics at this port on SPACE_GATEWAY_METRICS_HOST.',
    0,
    0,
    65535,
  ),
  metricsHost: setting.string(
    'SPACE_GATEWAY_METRICS_HOST',
    'Address the /metrics listener binds (a deployment sets the node address so Prometheus can scrape it).',
    '127.0.0.1',
  ),
  upstreamDns: setting.string(
    'SPACE_GATEWAY_UPSTREAM_DNS',
    'The resolver the gateway itself asks, `ip:port` (comma-separated for several).',
    '1.1.1.1:53',
  ),
  upstreamHttpPort: setting.int(
    'SPACE_GATEWAY_UPSTREAM_HTTP_PORT',
    'Port dialled upstream for HTTP.',
    80,
    1,
    65535,
  ),
  upstreamTlsPort: setting.int(
    'SPACE_GATEWAY_UPSTREAM_TLS_PORT',
    'Port dialled upstream for TLS.',
    443,
    1,
    65535,
  ),
  denyCidrs: setting.string(
    'SPACE_GATEWAY_DENY_CIDRS',
    'Comma-separated CIDRs never dialled nor answered (loopback, link-local, multicast are always added).',
    DEFAULT_DENY_CIDRS.join(','),
  ),
  dnsAnswerTtlSec: setting.int(
    'SPACE_GATEWAY_DNS_TTL_SEC',
    'Longest TTL in answers to sandboxes, s.',
    30,
    0,
    86_400,
  ),
  resolveCacheMaxSec: setting.int(
    'SPACE_GATEWAY_RESOLVE_CACHE_SEC',
    'Longest time an upstream answer is cached (capped by its TTL), s.',
    30,
    0,
    3600,
  ),
  resolveTimeoutMs: setting.int(
    'SPACE_GATEWAY_RESOLVE_TIMEOUT_MS',
    'Upstream DNS query timeout, ms.',
    2000,
    50,
  ),
  dnsQueriesPerSec: setting.int(
    'SPACE_GATEWAY_DNS_QPS',
    'DNS queries per second one sandbox may make (burst: twice this).',
    50,
    1,
  ),
  maxConnections: setting.int(
    'SPACE_GATEWAY_MAX_CONNECTIONS',
    'Concurrent TCP connections (HTTP, TLS, DNS over TCP) per sandbox.',
    256,
    1,
  ),
  handshakeTimeoutMs: setting.int(
    'SPACE_GATEWAY_HANDSHAKE_TIMEOUT_MS',
    'Deadline to receive a whole ClientHello or HTTP request head, ms.',
    5000,
    50,
  ),
  idleTimeoutMs: setting.int(
    'SPACE_GATEWAY_IDLE_TIMEOUT_MS',
    'A connection with no bytes either way for this long is closed, ms (5 min).',
    300_000,
    100,
  ),
  dialTimeoutMs: setting.int(
    'SPACE_GATEWAY_DIAL_TIMEOUT_MS',
    'Upstream TCP connect timeout, ms.',
    10_000,
    50,
  ),
  maxConnectionBytes: setting.int(
    'SPACE_GATEWAY_MAX_CONNECTION_BYTES',
    'Bytes (both directions) one connection may carry, bytes (4 GiB).',
    4 * 1024 ** 3,
    1024,
  ),
  maxHelloBytes: setting.int(
    'SPACE_GATEWAY_MAX_HELLO_BYTES',
    'Largest ClientHello accepted (all records), bytes (32 KiB).',
    32 * 1024,
    512,
    1024 * 1024,
  ),
  maxHeaderBytes: setting.int(
    'SPACE_GATEWAY_MAX_HEADER_BYTES',
    'Largest HTTP request head, bytes (32 KiB).',
    32 * 1024,
    1024,
    1024 * 1024,
  ),
  maxBodyBytes: setting.int(
    'SPACE_GATEWAY_MAX_BODY_BYTES',
    'Largest request body and response body on an intercepted (credential) connection, bytes (100 MiB).',
    100 * 1024 ** 2,
    1024,
  ),
  maxUnpackedBytes: setting.int(
    'SPACE_GATEWAY_MAX_UNPACKED_BYTES',
    'Largest unpacked size of one gzip response body from a credential host (unpacked in a worker to mask real values; larger is refused), bytes (32 MiB).',
    32 * 1024 ** 2,
    1024,
  ),
  unpackTimeoutMs: setting.int(
    'SPACE_GATEWAY_UNPACK_TIMEOUT_MS',
    'Longest time one gzip response body may take to unpack and mask in a worker (the body is refused past it), ms.',
    5000,
    10,
  ),
  unpackWorkers: setting.int(
    'SPACE_GATEWAY_UNPACK_WORKERS',
    'Worker threads that unpack and mask gzip response bodies of credential hosts (off the event loop).',
    1,
    1,
    16,
  ),
  caCertFile: setting.string(
    'SPACE_GATEWAY_CA_CERT_FILE',
    'PEM certificate of the per-deployment CA that signs intercepted leaves (created with the key if both are absent).',
    '/var/lib/space/gateway/ca.crt',
  ),
  caKeyFile: setting.string(
    'SPACE_GATEWAY_CA_KEY_FILE',
    'PEM private key of the per-deployment CA (mode 0600).',
    '/var/lib/space/gateway/ca.key',
  ),
  upstreamCaFile: setting.optionalString(
    'SPACE_GATEWAY_UPSTREAM_CA_FILE',
    'Extra PEM CA bundle trusted (with the system CAs) when re-originating intercepted TLS.',
  ),
  redisUrl: setting.redisUrl(
    'The state of record: credential values are read from it when a request needs them.',
  ),
  credentialCacheMs: setting.int(
    'SPACE_GATEWAY_CREDENTIAL_CACHE_MS',
    'Longest time a credential read (value or "revoked") is reused, ms: the bound on how late a revocation or rotation lands.',
    2000,
    0,
    60_000,
  ),
  nodeCidrs: setting.string(
    'SPACE_GATEWAY_NODE_CIDRS',
    "Comma-separated addresses/CIDRs of the node and its cluster (node IPs, pod and service ranges, load balancers), denied on top of the node's own interface addresses.",
    '',
  ),
  nodeCidrsFile: setting.string(
    'SPACE_GATEWAY_NODE_CIDRS_FILE',
    'If set, a file of further node/cluster CIDRs (comma or newline separated), re-read at every refresh so a deployment can keep it current.',
    '',
  ),
  nodeRefreshMs: setting.int(
    'SPACE_GATEWAY_NODE_REFRESH_MS',
    "How often the node's interface addresses, its local routing table and the node CIDRs file are read again, ms (route changes the kernel reports are read at once as well).",
    5000,
    100,
  ),
  newConnectionsPerSec: setting.int(
    'SPACE_GATEWAY_NEW_CONNECTIONS_PER_SEC',
    'New TCP connections per second one sandbox may open through the gateway (burst: twice this).',
    100,
    1,
  ),
  maxHandshakes: setting.int(
    'SPACE_GATEWAY_MAX_HANDSHAKES',
    'Connections per sandbox that may be in their TLS/HTTP handshake (before a name is decided) at once.',
    32,
    1,
  ),
  logLevel: setting.oneOf(
    'SPACE_LOG_LEVEL',
    'pino log level.',
    ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'],
    'info',
  ),
};

export type GatewayConfig = ConfigOf<typeof gatewaySettings>;

/** Reads the gateway settings from the environment; throws ConfigError listing every problem. */
export function loadGatewayConfig(env: NodeJS.ProcessEnv = process.env): GatewayConfig {
  return loadConfig('gateway', gatewaySettings, env);
}

/** Every setting at its default (for tests), with `overrides` applied. */
export function gatewayConfigWith(overrides: Partial<GatewayConfig>): GatewayConfig {
  return Object.freeze({ ...loadConfig('gateway', gatewaySettings, {}), ...overrides });
}
