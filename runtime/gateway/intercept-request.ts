/**
 * The HTTP rewrite of intercepted TLS (docs/egress.md; attack techniques T20, T22): what one
 * request head may be and what goes upstream in its place, and what response head goes back. Pure
 * functions, no sockets: {@link prepareRequest} checks the target, Host, framing and every
 * placeholder-shaped token, and replaces the placeholders of this sandbox in their credential's
 * header (the header REPLACED, never appended); {@link responseHeaders} masks real values in what
 * comes back. Also the bounded list of reasons an intercepted request or connection is refused
 * ({@link InterceptDenyReason}), which every part of the interception audits with.
 */
import { normaliseName } from '../core/egress.ts';
import {
  applyFormat,
  type CredentialGrant,
  type CredentialSecret,
  credentialAllows,
  grantsCovering,
  METHOD_OVERRIDE_HEADERS,
  PLACEHOLDER_SCAN_RE,
} from './credentials.ts';
import { HOP_BY_HOP, requestHeadProblem, stripHopByHop } from './http-headers.ts';
import { maskText, type Needles } from './reflection.ts';

/** Why an intercepted request or connection was refused or closed (bounded: an audit/metrics label). */
export type InterceptDenyReason =
  | 'leaf-unavailable'
  | 'sni-mismatch'
  | 'handshake-failed'
  | 'handshake-timeout'
  | 'idle-timeout'
  | 'malformed-http'
  | 'header-too-large'
  | 'method-not-allowed'
  | 'bad-target'
  | 'host-sni-mismatch'
  | 'foreign-placeholder'
  | 'placeholder-wrong-host'
  | 'placeholder-misplaced'
  | 'ambiguous-credential'
  | 'body-too-large'
  | 'resolution-failed'
  | 'upstream-certificate'
  | 'upstream-unreachable'
  | 'upstream-encoding'
  | 'response-too-large'
  | 'duplicate-host'
  | 'ambiguous-framing'
  | 'malformed-response'
  | 'credential-unavailable'
  | 'credential-scope'
  | 'unpack-timeout';

/** The parts of a parsed request head that {@link prepareRequest} looks at. */
export interface RequestHead {
  method: string;
  url: string;
  /** Alternating names and values, as received (node:http `rawHeaders`). */
  rawHeaders: readonly string[];
}

/** Outcome of {@link prepareRequest}. */
export type PreparedRequest =
  | {
      ok: true;
      /** Origin-form target to send upstream. */
      path: string;
      /** Alternating names and values to send upstream (Host, framing and injected headers included). */
      headers: string[];
      /** Names of the grants whose value was injected. */
      injected: string[];
      contentLength: number | null;
      chunked: boolean;
    }
  | { ok: false; status: number; reason: InterceptDenyReason };

/** Headers the gateway writes itself on the upstream request. */
const REWRITTEN: ReadonlySet<string> = new Set(['host', 'content-length', 'expect', 'accept-encoding']);
/** Methods that are refused: CONNECT tunnels past inspection; TRACE/TRACK echo the injected header. */
const REFUSED_METHODS: ReadonlySet<string> = new Set(['CONNECT', 'TRACE', 'TRACK']);

function refusal(status: number, reason: InterceptDenyReason): PreparedRequest {
  return { ok: false, status, reason };
}

/** True when a Host / absolute-form authority names `sni` on port 443 (or no port). */
export function authorityMatches(authority: string, sni: string): boolean {
  const m = /^([^:[\]@]+)(?::(\d+))?$/.exec(authority);
  if (!m) return false;
  if (m[2] !== undefined && m[2] !== '443') return false;
  return normaliseName(m[1]!) === sni;
}

function hasDotSegment(path: string): boolean {
  const pathOnly = path.split('?', 1)[0]!;
  return pathOnly.split('/').some((seg) => /^(?:\.|%2e){1,2}$/i.test(seg));
}

function placeholdersIn(text: string): string[] {
  return text.match(PLACEHOLDER_SCAN_RE) ?? [];
}

/**
 * Checks one request head and builds what goes upstream: exactly one Host and it names the SNI,
 * unambiguous framing within `maxBodyBytes`, hop-by-hop headers stripped, placeholders of this
 * sandbox replaced in their credential's header (every copy of that header dropped, one written),
 * anything else placeholder-shaped refused. `live` holds the current secret of each grant that is
 * not revoked (by grant name): a revoked grant's placeholder is forwarded untouched (it is worth
 * nothing any more); a live one used with a method or path its credential is not limited to is
 * refused (`credential-scope`), so echo-like endpoints are never sent the value. Pure.
 */
export function prepareRequest(
  head: RequestHead,
  sni: string,
  grants: readonly CredentialGrant[],
  live: ReadonlyMap<string, CredentialSecret>,
  maxBodyBytes: number,
): PreparedRequest {
  const method = head.method.toUpperCase();
  if (REFUSED_METHODS.has(method)) return refusal(405, 'method-not-allowed');

  // request target: origin-form, or absolute-form for this very authority, or `OPTIONS *`
  let path: string;
  if (head.url.startsWith('/')) {
    path = head.url;
  } else if (head.url === '*' && method === 'OPTIONS') {
    path = '*';
  } else {
    const m = /^([a-z][a-z0-9+.-]*):\/\/([^/?#]*)([/?][^#]*)?$/i.exec(head.url);
    if (!m) return refusal(400, 'bad-target');
    if (m[1]!.toLowerCase() !== 'https' || !authorityMatches(m[2]!, sni)) {
      return refusal(421, 'host-sni-mismatch');
    }
    const rest = m[3] ?? '/';
    path = rest.startsWith('?') ? `/${rest}` : rest;
  }
  if (path.includes('#') || path.includes('\\') || hasDotSegment(path)) return refusal(400, 'bad-target');

  // two Host headers (E6) and ambiguous framing: the same rules as the plain HTTP path
  const problem = requestHeadProblem(head.rawHeaders);
  if (problem) return refusal(400, problem);
  const pairs: [name: string, value: string][] = [];
  for (let i = 0; i + 1 < head.rawHeaders.length; i += 2) {
    pairs.push([head.rawHeaders[i]!, head.rawHeaders[i + 1]!]);
  }
  const named = (n: string) => pairs.filter(([k]) => k.toLowerCase() === n).map(([, v]) => v);

  const hosts = named('host');
  if (hosts.length !== 1 || !authorityMatches(hosts[0]!, sni)) return refusal(421, 'host-sni-mismatch');

  const te = named('transfer-encoding');
  const cl = named('content-length');
  let contentLength: number | null = null;
  if (cl.length === 1) {
    contentLength = Number(cl[0]!.trim());
    if (contentLength > maxBodyBytes) return refusal(413, 'body-too-large');
  }

  // every placeholder-shaped token anywhere in the head must be one of this sandbox's, for this host
  const own = new Map(grants.map((g) => [g.placeholder, g]));
  const covering = grantsCovering(sni, grants);
  for (const token of [head.url, ...pairs.flat()].flatMap(placeholdersIn)) {
    const grant = own.get(token.toLowerCase());
    if (grant === undefined) return refusal(403, 'foreign-placeholder');
    if (!covering.includes(grant)) return refusal(403, 'placeholder-wrong-host');
  }

  const dropped = new Set(
    named('connection').flatMap((v) =>
      v
        .split(',')
        .map((t) => t.trim().toLowerCase())
        .filter(Boolean),
    ),
  );
  let forwarded = pairs.filter(([k]) => {
    const lower = k.toLowerCase();
    return !HOP_BY_HOP.has(lower) && !REWRITTEN.has(lower) && !dropped.has(lower);
  });

  // substitution: exactly `format(placeholder)` in the credential's header → format(value); the
  // header, format and domains are the credential's current ones (rotation lands at once)
  const active = covering.flatMap((g) => {
    const secret = live.get(g.name);
    return secret && grantsCovering(sni, [{ ...g, domains: secret.domains }]).length > 0
      ? [{ grant: g, secret }]
      : [];
  });
  const chosen = new Map<string, { grant: CredentialGrant; secret: CredentialSecret }>();
  const overridden = pairs.some(([k]) => METHOD_OVERRIDE_HEADERS.has(k.toLowerCase()));
  for (const a of active) {
    const expected = applyFormat(a.secret.format, a.grant.placeholder);
    if (!forwarded.some(([k, v]) => k.toLowerCase() === a.secret.header && v === expected)) continue;
    if (chosen.has(a.secret.header)) return refusal(403, 'ambiguous-credential');
    if (!credentialAllows(a.secret, method, path)) return refusal(403, 'credential-scope');
    // a method list means the method the server will act on: no override header or `_method` field
    if (a.secret.methods !== null && (overridden || /[?&]_method=/i.test(path)))
      return refusal(403, 'credential-scope');
    chosen.set(a.secret.header, a);
  }
  forwarded = forwarded.filter(([k]) => !chosen.has(k.toLowerCase()));
  // a live placeholder anywhere else is refused; a revoked one goes out as it is
  const livePlaceholders = new Set(active.map((a) => a.grant.placeholder));
  const misplaced = (text: string) => placeholdersIn(text).some((t) => livePlaceholders.has(t.toLowerCase()));
  if (forwarded.some((pair) => pair.some(misplaced)) || misplaced(path)) {
    return refusal(403, 'placeholder-misplaced');
  }
  for (const [header, a] of chosen) forwarded.push([header, applyFormat(a.secret.format, a.secret.value)]);

  const headers: string[] = ['host', sni];
  for (const [k, v] of forwarded) headers.push(k, v);
  // identity only: the response is scanned for real values, which a compressed body would hide
  headers.push('accept-encoding', 'identity');
  if (contentLength !== null) headers.push('content-length', String(contentLength));
  const chunked = te.length > 0;
  if (chunked) headers.push('transfer-encoding', 'chunked');
  return {
    ok: true,
    path,
    headers,
    injected: [...chosen.values()].map((a) => a.grant.name),
    contentLength,
    chunked,
  };
}

/**
 * Response headers to send to the client: hop-by-hop and Connection-named ones dropped, secrets
 * masked in names and values (an echo endpoint may reflect a value as a header name, E10). Pure.
 */
export function responseHeaders(rawHeaders: readonly string[], needles: Needles): string[] {
  return stripHopByHop(rawHeaders).map((v) => maskText(v, needles));
}
