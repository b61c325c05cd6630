/**
 * Servers listening inside a sandbox, reached through the router: how a request names one (the
 * host `<port>-<sandboxId>.<domain>`, or E2B's routing headers `E2b-Sandbox-Id` +
 * `E2b-Sandbox-Port` on the router's own address) and the tunnel the router opens to the
 * sandbox's agent for it (an HTTP/1.1 upgrade to {@link PORT_TUNNEL_PROTOCOL} on
 * {@link portTunnelPath}; the agent then splices the connection to that port of the sandbox).
 * Sources: E2B's host form and routing headers, as the `e2b` SDK 2.51 builds them
 * (`getHost`, `E2b-Sandbox-Port`); RFC 9110 §7.8 (Upgrade). Pure.
 */
import type { IncomingHttpHeaders } from 'node:http';
import { ID_PATTERN } from './ids.ts';

/** envd's port: requests for it are the router's envd layer, not a tunnel. */
export const ENVD_PORT = 49983;

/** The `Upgrade` protocol token of a port tunnel (router → agent). */
export const PORT_TUNNEL_PROTOCOL = 'space-port';

/** Header E2B clients send the traffic access token of a private sandbox in (any case). */
export const TRAFFIC_TOKEN_HEADER = 'e2b-traffic-access-token';

/**
 * Lifetime of a sandbox's port token, s. It is bound to the sandbox's session (which ends with
 * the sandbox), is kept only in the sandbox's record and is read only by routers; a session token
 * must carry an expiry, so it is one no sandbox outlives.
 */
export const PORT_TOKEN_TTL_SEC = 10 * 365 * 86_400;

/** The agent path a port tunnel opens: `/v1/sandboxes/<id>/ports/<port>`. */
export const portTunnelPath = (sandboxId: string, port: number): string =>
  `/v1/sandboxes/${sandboxId}/ports/${port}`;

const TUNNEL_PATH = new RegExp(`^/v1/sandboxes/(${ID_PATTERN.replace(/^\^|\$$/g, '')})/ports/(\\d{1,5})$`);

/** The sandbox and port of a tunnel path, or undefined when `path` is not one (or the port is 0 or > 65535). */
export function parseTunnelPath(path: string): { sandboxId: string; port: number } | undefined {
  const m = TUNNEL_PATH.exec(path);
  if (!m) return undefined;
  const port = Number(m[2]);
  return port >= 1 && port <= 65_535 ? { sandboxId: m[1]!, port } : undefined;
}

/** A host `<port>-<id>.<rest>`: the port (digits), the id (a DNS label), the rest (domain and `:port`). */
const PORT_HOST = /^(\d{1,5})-([a-z0-9_]{1,64})\.[^/]+$/i;

/** What a request names in a sandbox: `malformed` = it tried (host form or headers) but got it wrong. */
export type PortTarget =
  | { sandboxId: string; port: number; by: 'host' | 'header' }
  | { malformed: 'port' | 'host'; sandboxId?: string };

/**
 * The sandbox port a request to the router names: the host `<port>-<sandboxId>.<domain>` first,
 * else `E2b-Sandbox-Id` with `E2b-Sandbox-Port` (the SDK's `E2B_SANDBOX_URL` mode). Undefined when
 * it names none (the router's own routes; an `E2b-Sandbox-Id` alone is envd's). Port 49983 is
 * returned too: the caller sends it to its envd layer.
 */
export function portTargetOf(headers: IncomingHttpHeaders): PortTarget | undefined {
  const host = String(headers.host ?? headers[':authority'] ?? '');
  const m = PORT_HOST.exec(host);
  if (m) {
    const port = Number(m[1]);
    if (port < 1 || port > 65_535) return { malformed: 'port', sandboxId: m[2]!.toLowerCase() };
    return { sandboxId: m[2]!.toLowerCase(), port, by: 'host' };
  }
  const id = headers['e2b-sandbox-id'];
  const rawPort = headers['e2b-sandbox-port'];
  if (typeof rawPort !== 'string' || typeof id !== 'string' || !id) return undefined;
  if (!/^\d{1,5}$/.test(rawPort.trim())) return { malformed: 'port', sandboxId: id };
  const port = Number(rawPort.trim());
  if (port < 1 || port > 65_535) return { malformed: 'port', sandboxId: id };
  return { sandboxId: id, port, by: 'header' };
}
