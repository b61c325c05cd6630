/** HTTP header handling shared by the plain-HTTP proxy and the credential interceptor. */

/** Hop-by-hop headers (RFC 9110 §7.6.1, plus the proxy and HTTP/2-upgrade ones): never forwarded. */
export const HOP_BY_HOP: ReadonlySet<string> = new Set([
  'connection',
  'keep-alive',
  'proxy-connection',
  'proxy-authenticate',
  'proxy-authorization',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
  'http2-settings',
]);

/**
 * `rawHeaders` (flat `[name, value, …]`) without hop-by-hop headers and without every header the
 * `Connection` header names. Pure.
 */
export function stripHopByHop(rawHeaders: readonly string[]): string[] {
  const named = new Set<string>();
  for (let i = 0; i + 1 < rawHeaders.length; i += 2) {
    if (rawHeaders[i]!.toLowerCase() === 'connection') {
      for (const t of rawHeaders[i + 1]!.split(',')) named.add(t.trim().toLowerCase());
    }
  }
  const out: string[] = [];
  for (let i = 0; i + 1 < rawHeaders.length; i += 2) {
    const name = rawHeaders[i]!.toLowerCase();
    if (HOP_BY_HOP.has(name) || named.has(name)) continue;
    out.push(rawHeaders[i]!, rawHeaders[i + 1]!);
  }
  return out;
}
