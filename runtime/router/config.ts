/** Settings of the data-plane router (env names, defaults with units, docs). */
import { ConfigError, type ConfigOf, loadConfig, setting } from '../core/config.ts';

export const routerSettings = {
  host: setting.string('SPACE_ROUTER_HOST', 'Address the router listens on.', '127.0.0.1'),
  port: setting.int('SPACE_ROUTER_PORT', 'TCP port of the router.', 8082, 0, 65535),
  redisUrl: setting.redisUrl('The state of record.'),
  verifyKeyFile: setting.string(
    'SPACE_VERIFY_KEY_FILE',
    'SPKI PEM Ed25519 public key that verifies session tokens.',
  ),
  tlsCertFile: setting.optionalString(
    'SPACE_ROUTER_TLS_CERT_FILE',
    'PEM certificate (chain) of the router. With the key: TLS with ALPN h2 + http/1.1; without: plain HTTP/1.1.',
  ),
  tlsKeyFile: setting.optionalString(
    'SPACE_ROUTER_TLS_KEY_FILE',
    'PEM private key of the router certificate.',
  ),
  resumeTimeoutMs: setting.int(
    'SPACE_ROUTER_RESUME_TIMEOUT_MS',
    'How long a request for a paused sandbox waits for it to resume, ms.',
    60_000,
    100,
  ),
  connectTimeoutMs: setting.int(
    'SPACE_ROUTER_CONNECT_TIMEOUT_MS',
    'Timeout of the TCP connection to a node agent, ms.',
    5000,
    100,
  ),
  headersTimeoutMs: setting.int(
    'SPACE_ROUTER_HEADERS_TIMEOUT_MS',
    'How long a bodiless request waits for the agent’s response headers, ms.',
    30_000,
    100,
  ),
  uploadTimeoutMs: setting.int(
    'SPACE_ROUTER_UPLOAD_TIMEOUT_MS',
    'How long a request with a body (upload, stdin) may take until the agent answers, ms (1 h).',
    3_600_000,
    1000,
  ),
  bodyTimeoutMs: setting.int(
    'SPACE_ROUTER_BODY_TIMEOUT_MS',
    'Longest silence of an agent mid-response while the client keeps up, ms (streams send a keepalive every 15 s).',
    60_000,
    1000,
  ),
  maxUploadBytes: setting.int(
    'SPACE_MAX_UPLOAD_BYTES',
    'Largest file upload the router forwards, bytes (1 GiB; the agents’ own limit, same name). A larger `Content-Length` is refused with 413 before anything is forwarded.',
    1_073_741_824,
    1,
  ),
  maxRequests: setting.int(
    'SPACE_ROUTER_MAX_REQUESTS',
    'Requests (streams included) one router forwards at once; more are refused with RATE_LIMITED.',
    10_000,
    1,
  ),
  logLevel: setting.oneOf(
    'SPACE_LOG_LEVEL',
    'pino log level.',
    ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'],
    'info',
  ),
};

export type RouterConfig = ConfigOf<typeof routerSettings>;

/**
 * Reads the router settings from the environment; throws ConfigError listing every problem
 * (a TLS certificate without its key, or the reverse, is one).
 */
export function loadRouterConfig(env: NodeJS.ProcessEnv = process.env): RouterConfig {
  const config = loadConfig('router', routerSettings, env);
  if (Boolean(config.tlsCertFile) !== Boolean(config.tlsKeyFile)) {
    throw new ConfigError('router', [
      'SPACE_ROUTER_TLS_CERT_FILE and SPACE_ROUTER_TLS_KEY_FILE: set both (TLS) or neither (plain HTTP/1.1)',
    ]);
  }
  return config;
}
