/**
 * The environment each service of a local stack starts with (`space up` and `space up --ha`):
 * one place for the settings that join them (Redis, keys, the gateway's socket and CA, the
 * agent's state), so both stacks start their services the same way. Callers add the process
 * environment (PATH) and any per-stack extras. Pure, apart from reading `SPACE_LOG_LEVEL`,
 * `SPACE_GATEWAY_UPSTREAM_DNS` and `/etc/resolv.conf`.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { LOCAL_HOST as HOST, hostResolver } from './up-host.ts';

type Env = Record<string, string>;

const logLevel = (): Env => ({ SPACE_LOG_LEVEL: process.env['SPACE_LOG_LEVEL'] ?? 'info' });

/** The gateway's control socket and CA files under `home` (the agent uses the same two). */
export function gatewayFiles(home: string): { socket: string; caCert: string; caKey: string } {
  return {
    socket: join(home, 'gateway.sock'),
    caCert: join(home, 'gateway-ca.crt'),
    caKey: join(home, 'gateway-ca.key'),
  };
}

/**
 * The API's: listens on `port`; `apiKeyFile` where it writes the first API key (give it to one
 * API only: two would race for the file); `routerUrl` the data-plane URL clients get.
 */
export function apiEnv(o: {
  port: number;
  redisUrl: string;
  signingKey: string;
  apiKeyFile?: string;
  routerUrl?: string;
}): Env {
  return {
    SPACE_API_HOST: HOST,
    SPACE_API_PORT: String(o.port),
    SPACE_REDIS_URL: o.redisUrl,
    SPACE_SIGNING_KEY_FILE: o.signingKey,
    ...(o.apiKeyFile ? { SPACE_BOOTSTRAP_API_KEY_FILE: o.apiKeyFile } : {}),
    ...(o.routerUrl ? { SPACE_ROUTER_URL: o.routerUrl } : {}),
    ...logLevel(),
  };
}

/** The router's: listens on `port`, verifies session tokens with `verifyKey`. */
export function routerEnv(o: { port: number; redisUrl: string; verifyKey: string }): Env {
  return {
    SPACE_ROUTER_HOST: HOST,
    SPACE_ROUTER_PORT: String(o.port),
    SPACE_REDIS_URL: o.redisUrl,
    SPACE_VERIFY_KEY_FILE: o.verifyKey,
    ...logLevel(),
  };
}

/**
 * The egress gateway's: its socket and CA under `home`; credential values are read from Redis
 * when a request needs them; names resolve through the host's resolver.
 */
export function gatewayEnv(o: { home: string; redisUrl: string }): Env {
  const g = gatewayFiles(o.home);
  return {
    SPACE_GATEWAY_CONTROL_SOCKET: g.socket,
    SPACE_GATEWAY_CA_CERT_FILE: g.caCert,
    SPACE_GATEWAY_CA_KEY_FILE: g.caKey,
    SPACE_REDIS_URL: o.redisUrl,
    SPACE_GATEWAY_UPSTREAM_DNS:
      process.env['SPACE_GATEWAY_UPSTREAM_DNS'] ?? hostResolver(readFileSync('/etc/resolv.conf', 'utf8')),
    ...logLevel(),
  };
}

/**
 * The agent's: node `nodeId` on `port`, its state under `home/agent`, templates in `cacheDir`,
 * sandboxes destroyed when it stops (a local stack keeps none), `warm` slots per template when set.
 */
export function agentEnv(o: {
  nodeId: string;
  port: number;
  redisUrl: string;
  verifyKey: string;
  home: string;
  cacheDir: string;
  warm?: number | undefined;
}): Env {
  const g = gatewayFiles(o.home);
  return {
    SPACE_NODE_ID: o.nodeId,
    SPACE_AGENT_HOST: HOST,
    SPACE_AGENT_PORT: String(o.port),
    SPACE_REDIS_URL: o.redisUrl,
    SPACE_VERIFY_KEY_FILE: o.verifyKey,
    SPACE_AGENT_STATE_DIR: join(o.home, 'agent'),
    SPACE_CACHE_DIR: o.cacheDir,
    SPACE_AGENT_ON_SHUTDOWN: 'destroy',
    SPACE_GATEWAY_CONTROL_SOCKET: g.socket,
    SPACE_TRUSTED_CA_FILE: g.caCert,
    ...(o.warm !== undefined ? { SPACE_WARM_POOL_SIZE: String(o.warm) } : {}),
    ...logLevel(),
  };
}
