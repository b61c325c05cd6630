/**
 * E2B's control-plane shapes, and how SPACE's records and errors map onto them. Pure functions.
 * Source of every external fact: E2B's OpenAPI description
 * (https://github.com/e2b-dev/E2B/blob/main/spec/openapi.yml) as the JS SDK 2.45–2.51 reads it;
 * the mapping is summed up in docs/e2b.md.
 */

import { isIP } from 'node:net';
import type { EgressPolicy, EgressPolicyInput } from '../../core/egress.ts';
import { SpaceError } from '../../core/errors.ts';
import type { SandboxState } from '../../core/types.ts';
import { metadataFilter } from '../metadata-filter.ts';
import type { SandboxRecord } from '../sandbox-store.ts';

/**
 * The envd version SPACE's E2B data plane reports. The SDK switches features on by it (§2.8):
 * 0.4.0 = users are handled by the daemon (the SDK sends no `user`), `stdin: false` allowed;
 * 0.5.2 = `closeStdin()`; 0.5.7 = octet-stream and gzip uploads (`useOctetStream`, `gzip`,
 * ReadableStream bodies); 0.6.2 = file metadata (`X-Metadata-*`, kept by the guest daemon:
 * runtime/guest/file-metadata.ts; the agent refuses it on guests before protocol 2); 0.6.3 = watch
 * `includeEntry`; 0.6.4 = watch `allowNetworkMounts`. 0.6.4 opens every gate of the SDK (2.51;
 * the reference's §5 asks for it).
 */
export const ENVD_VERSION = '0.6.4';

/** `clientID` is required in E2B's schema and ignored by the SDK. */
const CLIENT_ID = 'space';

/**
 * E2B's error body: `code` = the HTTP status (the SDK reads 404/409 from it, §1.2). `spaceCode`
 * (SPACE's addition, which E2B clients ignore) is the stable code of runtime/core/errors.ts, for
 * every refusal SPACE itself makes (e.g. `NOT_IMPLEMENTED` for an E2B route it does not serve).
 */
export interface E2bErrorBody {
  code: number;
  message: string;
  spaceCode?: string;
}

/**
 * The E2B body and status for any error a route throws (validation errors are 400). No room for a
 * sandbox (NODE_CAPACITY_EXHAUSTED, 503 on SPACE's own API) is 429: E2B answers a create past its
 * concurrent-sandbox limit with 429, which the SDKs raise as their retryable rate-limit error
 * (JS `RateLimitError`, Python `RateLimitException`); the route adds `Retry-After`.
 */
export function toE2bError(err: unknown): E2bErrorBody {
  if (err instanceof SpaceError) {
    const code = err.code === 'NODE_CAPACITY_EXHAUSTED' ? 429 : err.status;
    return { code, message: err.message, spaceCode: err.code };
  }
  const e = err as { validation?: unknown; statusCode?: number; message?: string };
  if (e.validation) return { code: 400, message: e.message ?? 'bad request' };
  if (typeof e.statusCode === 'number' && e.statusCode >= 400 && e.statusCode < 500) {
    return { code: e.statusCode, message: e.message ?? 'bad request' };
  }
  return { code: 500, message: 'internal error' };
}

/** E2B's two sandbox states; SPACE's other live states count as the one they are heading from/to. */
export type E2bState = 'running' | 'paused';

/** The E2B state of a SPACE state, or null for a sandbox E2B no longer shows (ended). */
export function e2bState(s: SandboxState): E2bState | null {
  switch (s) {
    case 'creating':
    case 'running':
      return 'running';
    case 'pausing':
    case 'paused':
    case 'resuming':
      return 'paused';
    case 'killing':
    case 'killed':
      return null;
    default: {
      const never: never = s;
      return never;
    }
  }
}

/** The SPACE states listed for an E2B `state` filter. */
export function spaceStates(states: readonly E2bState[]): SandboxState[] {
  const out: SandboxState[] = [];
  if (states.includes('running')) out.push('creating', 'running');
  if (states.includes('paused')) out.push('pausing', 'paused', 'resuming');
  return out;
}

/** `Sandbox` (create/connect answer): ids, envd version and the envd access token. */
export function toE2bSandbox(rec: SandboxRecord, envdAccessToken: string) {
  return {
    sandboxID: rec.id,
    templateID: rec.template,
    clientID: CLIENT_ID,
    envdVersion: ENVD_VERSION,
    envdAccessToken,
    // set for a private sandbox: the header `e2b-traffic-access-token` its servers want (more §4)
    trafficAccessToken: rec.ports.trafficToken,
    // null: the SDK keeps its configured domain / sandbox URL for envd (§3)
    domain: null,
  };
}

/** `ListedSandbox` (list answer). `diskSizeMB` is 0: SPACE does not size disks per sandbox. */
export function toE2bListed(rec: SandboxRecord) {
  return {
    sandboxID: rec.id,
    templateID: rec.template,
    clientID: CLIENT_ID,
    cpuCount: rec.vcpus,
    memoryMB: rec.memoryMiB,
    diskSizeMB: 0,
    startedAt: rec.createdAt,
    endAt: rec.expiresAt,
    state: e2bState(rec.state) ?? 'running',
    envdVersion: ENVD_VERSION,
    metadata: rec.metadata,
  };
}

/** `SandboxDetail` (get answer), with `lifecycle` as the SDK's `getInfo().lifecycle` reads it. */
export function toE2bDetail(rec: SandboxRecord, envdAccessToken: string) {
  return {
    ...toE2bListed(rec),
    envdAccessToken,
    domain: null,
    ...networkOf(rec.egress),
    lifecycle: { onTimeout: rec.onTimeout, autoResume: rec.autoResume },
  };
}

/**
 * The `metadata` list filter as E2B clients encode it (§1.7): the query value is URL-encoded
 * `k=v&k2=v2` whose keys and values are themselves URL-encoded. Returns the key/value pairs.
 * @throws SpaceError BAD_REQUEST when the encoding is broken, or a key comes with two values.
 */
export function parseMetadataFilter(raw: string): Record<string, string> {
  const pairs: [string, string][] = [];
  try {
    const whole = decodeURIComponent(raw);
    for (const pair of whole.split('&')) {
      if (!pair) continue;
      const eq = pair.indexOf('=');
      const k = eq < 0 ? pair : pair.slice(0, eq);
      const v = eq < 0 ? '' : pair.slice(eq + 1);
      pairs.push([decodeURIComponent(k), decodeURIComponent(v)]);
    }
  } catch {
    throw new SpaceError('BAD_REQUEST', 'metadata filter is not URL-encoded key=value pairs');
  }
  // a key given twice with two values is refused, never reduced to the last (R26)
  return metadataFilter(pairs);
}

/** E2B's sandbox network options (create's `network`, `PUT …/network`; §1.4, §1.8). */
export interface E2bNetwork {
  allowOut?: string[];
  denyOut?: string[];
  rules?: unknown;
  egressProxy?: unknown;
  allowPublicTraffic?: boolean;
  maskRequestHost?: unknown;
  httpsPorts?: unknown[];
}

/** E2B's "all traffic" CIDR (the SDK's `ALL_TRAFFIC`): in `denyOut` it makes the base deny-all. */
const ALL_TRAFFIC = '0.0.0.0/0';

/** True for an IP address or CIDR (E2B lists both next to domain names). */
const isAddress = (entry: string) => isIP(entry.split('/')[0] ?? '') !== 0;

/**
 * The SPACE egress policy for E2B's `allow_internet_access` and `network` (§1.4): internet on by
 * default (`allow-all`); `allow_internet_access: false` or `denyOut` holding `0.0.0.0/0` make
 * the base `deny-all`, and then `allowOut` names are the allow list (`allow-list`); `denyOut`
 * names are denied either way. SPACE egress is by name, through its gateway (HTTP/HTTPS): IP and
 * CIDR entries other than `0.0.0.0/0`, `rules`, `egressProxy`, `maskRequestHost` and `httpsPorts`
 * are refused rather than half-applied (`allowPublicTraffic` is not egress: the create route
 * reads it).
 * @throws SpaceError BAD_REQUEST naming every unsupported part.
 */
export function egressOf(
  allowInternet: boolean | undefined,
  network: E2bNetwork | undefined,
): EgressPolicyInput {
  const net = network ?? {};
  const allowOut = net.allowOut ?? [];
  const denyOut = net.denyOut ?? [];
  const problems = [
    ...allowOut.filter(isAddress).map((e) => `network.allowOut "${e}" (IP/CIDR: SPACE allows by name)`),
    ...denyOut
      .filter((e) => isAddress(e) && e !== ALL_TRAFFIC)
      .map((e) => `network.denyOut "${e}" (IP/CIDR other than ${ALL_TRAFFIC})`),
    net.rules !== undefined ? 'network.rules' : null,
    net.egressProxy !== undefined ? 'network.egressProxy' : null,
    net.maskRequestHost !== undefined ? 'network.maskRequestHost' : null,
    net.httpsPorts?.length ? 'network.httpsPorts' : null,
  ].filter((p): p is string => p !== null);
  if (problems.length) {
    throw new SpaceError('BAD_REQUEST', `not supported by this SPACE server: ${problems.join(', ')}`);
  }
  const deny = denyOut.filter((e) => !isAddress(e));
  const denyAll = allowInternet === false || denyOut.includes(ALL_TRAFFIC);
  if (!denyAll) return { mode: 'allow-all', deny };
  return allowOut.length ? { mode: 'allow-list', allow: allowOut, deny } : { mode: 'deny-all', deny };
}

/** `allowInternetAccess` and `network` of a sandbox's detail, read back from its SPACE policy. */
export function networkOf(egress: EgressPolicy) {
  return {
    allowInternetAccess: egress.mode === 'allow-all',
    network: {
      ...(egress.mode === 'allow-all' ? {} : { denyOut: [ALL_TRAFFIC, ...egress.deny] }),
      ...(egress.mode === 'allow-all' && egress.deny.length ? { denyOut: egress.deny } : {}),
      ...(egress.mode === 'allow-list' ? { allowOut: egress.allow } : {}),
    },
  };
}
