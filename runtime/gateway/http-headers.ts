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
 * Headers a `Connection` option can never remove (E12): the Host the decision was made on and the
 * message framing. A sender naming them there asks the next hop to forget how long the body is
 * (RFC 9112 §6 frames a message by Transfer-Encoding or Content-Length only), which is how a body
 * becomes a second request.
 */
export const NEVER_CONNECTION_NAMED: ReadonlySet<string> = new Set([
  'host',
  'content-length',
  'transfer-encoding',
]);

/**
 * `rawHeaders` (flat `[name, value, …]`) without hop-by-hop headers and without every header the
 * `Connection` header names, except those in {@link NEVER_CONNECTION_NAMED} (kept: Host and
 * Content-Length stay; Transfer-Encoding is hop-by-hop and always dropped). Pure.
 */
export function stripHopByHop(rawHeaders: readonly string[]): string[] {
  const named = new Set<string>();
  for (let i = 0; i + 1 < rawHeaders.length; i += 2) {
    if (rawHeaders[i]!.toLowerCase() === 'connection') {
      for (const t of rawHeaders[i + 1]!.split(',')) {
        const name = t.trim().toLowerCase();
        if (!NEVER_CONNECTION_NAMED.has(name)) named.add(name);
      }
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

/**
 * The headers to re-send for a request whose head passed {@link requestHeadProblem}, framed by the
 * gateway itself (E12): hop-by-hop and Connection-named headers dropped ({@link stripHopByHop}),
 * every Content-Length dropped, then exactly one framing header written from what the parser read:
 * `transfer-encoding: chunked` when the request was chunked, else `content-length: N` when it
 * carried one, else none (no body: the next bytes are the next request, parsed and checked on
 * their own). Whatever the method, a body is never re-sent unframed (node:http sends the body of a
 * GET/HEAD/DELETE/OPTIONS with neither header as raw bytes, which the server behind reads as the
 * next request). Pure.
 */
export function framedRequestHeaders(rawHeaders: readonly string[]): string[] {
  let chunked = false;
  let length: string | null = null;
  for (let i = 0; i + 1 < rawHeaders.length; i += 2) {
    const name = rawHeaders[i]!.toLowerCase();
    if (name === 'transfer-encoding') chunked = true;
    else if (name === 'content-length') length = rawHeaders[i + 1]!.trim();
  }
  const out = stripHopByHop(rawHeaders).filter(
    (_, i, all) => all[i - (i % 2)]!.toLowerCase() !== 'content-length',
  );
  if (chunked) out.push('transfer-encoding', 'chunked');
  else if (length !== null) out.push('content-length', String(Number(length)));
  return out;
}

/** Why a request head is refused by {@link requestHeadProblem} (both are audit reasons). */
export type HeadProblem = 'duplicate-host' | 'ambiguous-framing';

/**
 * Checks what `node:http` lets through but a server behind the gateway might read differently
 * (E6, T22): more than one Host header; Transfer-Encoding other than exactly one `chunked`;
 * Transfer-Encoding together with Content-Length; more than one Content-Length or one that is not
 * plain digits. (node:http's strict parser already refuses obs-fold line folding, bare CR/LF and
 * CL+TE; this is the second wall, applied to every request of a keep-alive connection.) Zero Host
 * headers is the caller's `missing-host`. Returns null when the head is unambiguous. Pure.
 */
export function requestHeadProblem(rawHeaders: readonly string[]): HeadProblem | null {
  let hosts = 0;
  const te: string[] = [];
  const cl: string[] = [];
  for (let i = 0; i + 1 < rawHeaders.length; i += 2) {
    const name = rawHeaders[i]!.toLowerCase();
    if (name === 'host') hosts++;
    else if (name === 'transfer-encoding') te.push(rawHeaders[i + 1]!);
    else if (name === 'content-length') cl.push(rawHeaders[i + 1]!);
  }
  if (hosts > 1) return 'duplicate-host';
  if (te.length > 0 && (te.length !== 1 || te[0]!.trim().toLowerCase() !== 'chunked' || cl.length > 0))
    return 'ambiguous-framing';
  if (cl.length > 1 || (cl.length === 1 && !/^\d{1,15}$/.test(cl[0]!.trim()))) return 'ambiguous-framing';
  return null;
}

/** A response head that can be written to the client as is, or null when it can't. */
export interface SafeResponseHead {
  statusMessage: string;
  headers: string[];
}

/** Visible ASCII, spaces and tabs: what a reason phrase or header value may carry when re-sent. */
const UNSAFE_TEXT = /[^\t\x20-\x7e\x80-\xff]/;
const TOKEN = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;

/**
 * Validates an upstream response head before it is re-sent (E11): a reason phrase or header value
 * with control characters, or a header name that is not a token, would make `writeHead` throw
 * (which used to take the whole process down). Returns the head to write, or null: the caller then
 * ends that one exchange with a 502. Pure.
 */
export function safeResponseHead(
  statusCode: number | undefined,
  statusMessage: string | undefined,
  rawHeaders: readonly string[],
): SafeResponseHead | null {
  if (statusCode === undefined || !Number.isInteger(statusCode) || statusCode < 100 || statusCode > 999)
    return null;
  const message = statusMessage ?? '';
  if (UNSAFE_TEXT.test(message)) return null;
  for (let i = 0; i + 1 < rawHeaders.length; i += 2) {
    if (!TOKEN.test(rawHeaders[i]!) || UNSAFE_TEXT.test(rawHeaders[i + 1]!)) return null;
  }
  return { statusMessage: message, headers: [...rawHeaders] };
}
