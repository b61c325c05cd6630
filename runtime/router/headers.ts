/**
 * Which headers cross the router (RFC 9110 §7.6.1): hop-by-hop headers — the fixed list plus every
 * name a `Connection` header lists — stay on their hop; HTTP/2 pseudo-headers (`:path`, …) are
 * rebuilt by each side; `Host` becomes the agent's. `X-Forwarded-For/-Proto/-Host` tell the agent
 * who asked. Pure functions.
 */
import type { IncomingHttpHeaders, OutgoingHttpHeaders } from 'node:http';

/** Hop-by-hop headers never forwarded in either direction (lower case). */
export const HOP_BY_HOP = new Set([
  'connection',
  'keep-alive',
  'proxy-authenticate',
  'proxy-authorization',
  'proxy-connection',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
  // answered by this hop (Node sends `100 Continue` itself); the agent gets the body regardless
  'expect',
  // HTTP/2 only: meaningless on the agent's HTTP/1.1 hop
  'http2-settings',
]);

type HeaderValue = string | string[] | number | undefined;

/** Names a `Connection` header lists (they are hop-by-hop too), lower case. */
function connectionListed(value: HeaderValue): Set<string> {
  const raw = Array.isArray(value) ? value.join(',') : String(value ?? '');
  return new Set(
    raw
      .split(',')
      .map((s) => s.trim().toLowerCase())
      .filter(Boolean),
  );
}

/** `headers` without hop-by-hop headers, pseudo-headers and undefined values. */
export function endToEnd(headers: Record<string, HeaderValue>): Record<string, string | string[]> {
  const listed = connectionListed(headers['connection']);
  const out: Record<string, string | string[]> = {};
  for (const [name, value] of Object.entries(headers)) {
    const n = name.toLowerCase();
    if (value === undefined || n.startsWith(':') || HOP_BY_HOP.has(n) || listed.has(n)) continue;
    out[n] = typeof value === 'number' ? String(value) : value;
  }
  return out;
}

/** Who asked, as the router saw it. */
export interface ClientHop {
  /** The client's address (socket peer). */
  remoteAddress: string | undefined;
  /** `https` when the router terminated TLS. */
  proto: 'http' | 'https';
}

/**
 * The headers the router sends to the agent for a client request: end-to-end headers minus
 * `host`, with `X-Forwarded-For` appended to (a client's own value is kept, as proxies do; the
 * agent must trust only the last entry), `X-Forwarded-Proto` and `X-Forwarded-Host` set.
 */
export function upstreamHeaders(
  client: IncomingHttpHeaders,
  hop: ClientHop,
): Record<string, string | string[]> {
  const out = endToEnd(client as Record<string, HeaderValue>);
  const host = client.host ?? (client[':authority'] as string | undefined);
  delete out['host'];
  const prior = out['x-forwarded-for'];
  const chain = [...(Array.isArray(prior) ? prior : prior ? [prior] : [])];
  if (hop.remoteAddress) chain.push(hop.remoteAddress);
  if (chain.length) out['x-forwarded-for'] = chain.join(', ');
  out['x-forwarded-proto'] = hop.proto;
  if (host) out['x-forwarded-host'] = host;
  return out;
}

/** The agent's response headers as sent to the client (hop-by-hop removed; valid for HTTP/2 too). */
export function downstreamHeaders(upstream: Record<string, HeaderValue>): OutgoingHttpHeaders {
  return endToEnd(upstream);
}
