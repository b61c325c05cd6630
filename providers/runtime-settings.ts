/**
 * What both deployment components (Kubernetes, systemd) agree on: ports, paths, the image, the
 * service commands and the environment of each service. Names and defaults follow the runtime's
 * own config declarations (`runtime/api/config.ts`, `runtime/agent/config.ts`), which the
 * `apiEnv`/`agentEnv` overrides are checked against.
 */

import { agentSettings } from '../runtime/agent/config.ts';
import { apiSettings } from '../runtime/api/config.ts';
import type { NodePool } from './node-pool.ts';

/** TCP port of the API (`SPACE_API_PORT`). */
export const API_PORT = 8080;
/** TCP port of the node agent: data plane for clients plus internal dispatch (`SPACE_AGENT_PORT`). */
export const AGENT_PORT = 8081;
/** TCP port of Redis. */
export const REDIS_PORT = 6379;

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

/** The three services of the one image, with the command each runs (working directory /opt/space). */
export const SERVICE_COMMANDS = {
  api: ['node', 'runtime/api/server.ts'],
  agent: ['node', 'runtime/agent/server.ts'],
  gateway: ['node', 'runtime/gateway/server.ts'],
} as const;

/** A SPACE service deployed by the components. */
export type Service = keyof typeof SERVICE_COMMANDS;

/** Default image repository (one image, three commands). */
export const DEFAULT_IMAGE_REPOSITORY = 'ghcr.io/space-sandbox/space';

/** `repository:version`: the only place an image reference is made, so `space:version` drives every tag. */
export function imageRef(repository: string, version: string): string {
  return `${repository}:${version}`;
}

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
] as const;

/** Env names the runtime declares, per service (from its config modules). */
export const KNOWN_ENV = {
  api: new Set(Object.values(apiSettings).map((s) => s.env)),
  agent: new Set(Object.values(agentSettings).map((s) => s.env)),
} as const;

/**
 * Checks operator overrides (`space:apiEnv`, `space:agentEnv`): every key must be a setting the
 * service declares and not one the deployment owns; values must be strings. Returns problems.
 */
export function checkEnvOverrides(service: 'api' | 'agent', env: unknown, path: string): string[] {
  if (env === undefined) return [];
  if (typeof env !== 'object' || env === null || Array.isArray(env)) return [`${path}: must be an object`];
  const problems: string[] = [];
  for (const [k, v] of Object.entries(env)) {
    if (!KNOWN_ENV[service].has(k)) problems.push(`${path}.${k}: not a ${service} setting (see README.md)`);
    else if ((DEPLOYMENT_OWNED as readonly string[]).includes(k))
      problems.push(`${path}.${k}: set by the deployment; cannot be overridden`);
    if (typeof v !== 'string') problems.push(`${path}.${k}: must be a string`);
  }
  return problems;
}

/**
 * Non-secret environment of the API. The Redis URL is not here: it may carry a password, so each
 * component passes it its own way (Kubernetes Secret, or a private-address URL on VMs).
 */
export function apiEnvironment(overrides: Readonly<Record<string, string>> = {}): Record<string, string> {
  return {
    ...overrides,
    SPACE_API_HOST: '0.0.0.0',
    SPACE_API_PORT: String(API_PORT),
    SPACE_SIGNING_KEY_FILE: SIGNING_KEY_FILE,
    SPACE_BOOTSTRAP_API_KEY_FILE: BOOTSTRAP_API_KEY_FILE,
  };
}

/**
 * Non-secret environment of the agent of `pool`. `SPACE_NODE_ID` and `SPACE_AGENT_URL` depend on
 * the node and are set by each component (downward API / a boot-time script).
 */
export function agentEnvironment(
  pool: NodePool,
  overrides: Readonly<Record<string, string>> = {},
): Record<string, string> {
  return {
    ...overrides,
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
