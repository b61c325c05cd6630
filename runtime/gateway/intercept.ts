/**
 * Intercepted TLS for credential hosts (DESIGN.md "Credentials", docs/egress.md; attack
 * techniques T20, T22, T23).
 *
 * The TLS proxy has already decided the SNI names a host covered by a credential granted to this
 * sandbox; it hands over the client socket and the bytes it read. Here:
 * 1. TLS is terminated with a leaf for exactly that name from the deployment CA; a ClientHello whose
 *    SNI differs is refused; only `http/1.1` is offered (an h2-only client fails closed, T23).
 * 2. HTTP/1.1 is parsed by node:http (one parse, then re-serialised: ambiguous framing is refused by
 *    the parser and again here). Every request on the connection is checked on its own: Host (and an
 *    absolute-form authority) must be the SNI, no dot segments, no CONNECT/TRACE.
 * 3. Placeholders: any `space_ph_…` token that is not one of this sandbox's refuses the request; one
 *    of its own for a host the grant does not cover, or anywhere but `header: format(placeholder)`,
 *    refuses it too. A matching header is REPLACED (all copies dropped, one written) — never appended.
 * 4. The request is re-originated with https to the address the gateway resolved itself, SNI = the
 *    name, full certificate verification (system roots + `upstreamCa`). A failed verification is a
 *    502 before a single request byte is written.
 * 5. Bodies stream both ways under `maxBodyBytes`. Responses are asked for `identity` encoding and
 *    every real value this sandbox holds is masked in response headers and bodies (an endpoint that
 *    echoes headers must not hand the secret back, T20); an encoded response is refused, since it
 *    could not be scanned. A body that starts like gzip without a label is read whole and masked in
 *    a worker thread (`packed-body.ts`, `unpack-pool.ts`: raw bytes and every member, bounded in
 *    size and time, E16/E17); one that cannot be fully read is refused.
 *
 * Audit lines use the gateway's shape: `egress allow|deny|close` with `sandbox.id`, `name`,
 * `address`, `port`, `rule`, `reason`. Real values are never logged nor part of any error text.
 */
import http from 'node:http';
import https from 'node:https';
import type net from 'node:net';
import { pipeline } from 'node:stream';
import tls from 'node:tls';
import type { Logger } from 'pino';
import { normaliseName } from '../core/egress.ts';
import { F } from '../core/log-fields.ts';
import type { DeploymentCa, Leaf } from './ca.ts';
import type { CredentialSource } from './credential-source.ts';
import {
  applyFormat,
  type CredentialGrant,
  type CredentialSecret,
  credentialAllows,
  grantsCovering,
  METHOD_OVERRIDE_HEADERS,
  PLACEHOLDER_SCAN_RE,
} from './credentials.ts';
import { HOP_BY_HOP, requestHeadProblem, safeResponseHead, stripHopByHop } from './http-headers.ts';
import { looksGzipped } from './packed-body.ts';
import { maskText, type Needles, needlesFor, SecretMask, TooLarge } from './reflection.ts';
import type { UnpackOutcome } from './unpack-pool.ts';

/** Limits applied to one intercepted connection. */
export interface InterceptLimits {
  /** From hand-over to the first complete request head (TLS handshake included), ms. */
  handshakeTimeoutMs: number;
  /** No progress (request, body bytes either way, response end) for this long closes the connection, ms. */
  idleTimeoutMs: number;
  /** Largest request head, bytes (node:http `maxHeaderSize`). */
  maxHeaderBytes: number;
  /** Largest request body and largest response body, bytes each. */
  maxBodyBytes: number;
}

/** What the TLS proxy passes along with a socket to intercept. */
export interface InterceptContext {
  sandboxId: string;
  /** Canonical name from the ClientHello, already allowed and covered by a grant. */
  sni: string;
  /** Every credential granted to this sandbox (not only those covering `sni`); no values. */
  grants: CredentialGrant[];
  /** Where the values are fetched, per request (revocation and rotation land within its cache time). */
  credentials: CredentialSource;
  /** An IPv4 the gateway resolved itself for `name` and checked against its deny set; rejects otherwise. */
  resolve: (name: string) => Promise<string>;
  log: Logger;
  limits: InterceptLimits;
  /** Extra trusted CAs for upstream verification, on top of the system store. */
  upstreamCa?: Buffer[];
  /** Upstream port (default 443; tests override). */
  upstreamPort?: number;
  ca: DeploymentCa;
  /**
   * Masks a response body that starts with a gzip magic, off the event loop and bounded in size
   * and time (`UnpackPool.mask` under this sandbox's key, E16/E17).
   */
  unpack: (body: Buffer, needles: Needles) => Promise<UnpackOutcome>;
}

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

/** Hop-by-hop headers (RFC 9110 §7.6.1 plus the usual non-standard ones): never forwarded. */

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

/** OpenSSL / Node codes of a failed upstream certificate verification. */
const CERT_ERRORS: ReadonlySet<string> = new Set([
  'UNABLE_TO_GET_ISSUER_CERT',
  'UNABLE_TO_GET_ISSUER_CERT_LOCALLY',
  'UNABLE_TO_VERIFY_LEAF_SIGNATURE',
  'DEPTH_ZERO_SELF_SIGNED_CERT',
  'SELF_SIGNED_CERT_IN_CHAIN',
  'CERT_SIGNATURE_FAILURE',
  'CERT_NOT_YET_VALID',
  'CERT_HAS_EXPIRED',
  'CERT_REVOKED',
  'CERT_UNTRUSTED',
  'CERT_REJECTED',
  'INVALID_CA',
  'INVALID_PURPOSE',
  'PATH_LENGTH_EXCEEDED',
  'HOSTNAME_MISMATCH',
  'ERR_TLS_CERT_ALTNAME_INVALID',
  'ERR_TLS_CERT_ALTNAME_FORMAT',
]);

/** Redaction for every line this module logs: belt and braces, nothing here logs headers or grants. */
const REDACT = ['headers', '*.headers', 'grants', '*.grants', 'value', '*.value', 'authorization'];

/**
 * Terminates TLS on `client` (whose first bytes, already read by the proxy, are `clientHello`),
 * serves HTTP/1.1 on it and forwards each checked request upstream with the sandbox's credentials
 * injected. The caller must have removed its own 'data' listener; the socket is paused here at once.
 * Resolves when the client connection has closed; never rejects (every failure is an audit line and
 * a closed or refused connection).
 */
export async function interceptTls(
  client: net.Socket,
  clientHello: Buffer,
  ctx: InterceptContext,
): Promise<void> {
  if (client.destroyed) return;
  // at once, before any await: a flowing socket without a 'data' listener would drop what arrives
  client.pause();
  const closed = new Promise<void>((resolve) => client.once('close', () => resolve()));
  const port = ctx.upstreamPort ?? 443;
  const log = ctx.log.child(
    { [F.sandboxId]: ctx.sandboxId, protocol: 'tls', name: ctx.sni, port, intercepted: true },
    { redact: { paths: REDACT, censor: '[redacted]' } },
  );
  const audit: AuditLine = (event, fields) =>
    log.info({ address: null, rule: 'credential', ...fields }, `egress ${event}`);

  let timer: NodeJS.Timeout | undefined;
  let finished = false;
  let secure: tls.TLSSocket | undefined;
  const closeAll = () => {
    clearTimeout(timer);
    secure?.destroy();
    client.destroy();
  };
  const deadline = (ms: number, reason: InterceptDenyReason) => {
    clearTimeout(timer);
    if (finished) return; // a response 'close' after the socket's must not re-arm
    timer = setTimeout(() => {
      audit('close', { reason });
      closeAll();
    }, ms);
  };
  deadline(ctx.limits.handshakeTimeoutMs, 'handshake-timeout');
  client.once('close', () => {
    finished = true;
    clearTimeout(timer);
  });

  let leaf: Leaf;
  try {
    leaf = await ctx.ca.leafFor(ctx.sni);
  } catch {
    audit('deny', { reason: 'leaf-unavailable' });
    closeAll();
    return closed;
  }
  if (client.destroyed) return closed;

  // replay what the proxy already read: TLSSocket drains the wrapped socket's buffer first
  if (clientHello.length > 0) client.unshift(clientHello);
  let sniMismatch = false;
  secure = new tls.TLSSocket(client, {
    isServer: true,
    secureContext: leaf.context,
    ALPNProtocols: ['http/1.1'],
    SNICallback: (servername, cb) => {
      if (normaliseName(servername) === ctx.sni) return cb(null, leaf.context);
      sniMismatch = true;
      cb(new Error('SNI differs from the intercepted name'));
    },
  });
  const tlsSocket = secure;
  let established = false;
  tlsSocket.on('error', (err: NodeJS.ErrnoException) => {
    if (!established)
      audit('deny', { reason: sniMismatch ? 'sni-mismatch' : 'handshake-failed', error: err.code });
    closeAll();
  });
  tlsSocket.on('close', closeAll);
  tlsSocket.once('secure', () => {
    established = true;
    // no SNI at all never reaches the callback above: check what was negotiated
    const servername = (tlsSocket as unknown as { servername?: string | false }).servername;
    if (typeof servername !== 'string' || normaliseName(servername) !== ctx.sni) {
      audit('deny', { reason: 'sni-mismatch' });
      closeAll();
      return;
    }
    serveHttp(tlsSocket, ctx, port, audit, deadline);
  });
  return closed;
}

/** Writes one audit line in the gateway's shape (see audit.ts): `egress allow|deny|close`. */
type AuditLine = (
  event: 'allow' | 'deny' | 'close',
  fields: { reason?: InterceptDenyReason; address?: string | null; rule?: string; [k: string]: unknown },
) => void;

function serveHttp(
  socket: tls.TLSSocket,
  ctx: InterceptContext,
  port: number,
  audit: AuditLine,
  deadline: (ms: number, reason: InterceptDenyReason) => void,
): void {
  const { limits } = ctx;
  const ca = [...tls.rootCertificates, ...(ctx.upstreamCa ?? []).map((b) => b.toString())];
  // one upstream connection per client connection: requests on it are sequential anyway
  const agent = new https.Agent({ keepAlive: true, maxSockets: 1 });
  socket.once('close', () => agent.destroy());

  const server = http.createServer({
    maxHeaderSize: limits.maxHeaderBytes,
    // Host is checked (and a refusal audited) by prepareRequest, not answered silently by node:http
    requireHostHeader: false,
    joinDuplicateHeaders: false,
    insecureHTTPParser: false,
  });
  // never listened on, so node:http's own header/request timers don't run: `deadline` replaces them
  server.keepAliveTimeout = 0;
  server.timeout = 0;
  let inFlight = 0;
  const idle = () => deadline(limits.idleTimeoutMs, 'idle-timeout');

  server.on('clientError', (err: NodeJS.ErrnoException, s: net.Socket) => {
    const code = err.code ?? '';
    if (code.startsWith('HPE_')) {
      const tooLarge = code === 'HPE_HEADER_OVERFLOW';
      audit('deny', { reason: tooLarge ? 'header-too-large' : 'malformed-http', error: code });
      if (s.writable) {
        s.end(
          `HTTP/1.1 ${tooLarge ? '431 Request Header Fields Too Large' : '400 Bad Request'}\r\nconnection: close\r\ncontent-length: 0\r\n\r\n`,
        );
      }
    }
    s.destroy();
  });
  server.on('connect', (_req: http.IncomingMessage, s: net.Socket) => {
    audit('deny', { reason: 'method-not-allowed', method: 'CONNECT' });
    s.end('HTTP/1.1 405 Method Not Allowed\r\nconnection: close\r\ncontent-length: 0\r\n\r\n');
  });
  server.on('request', (req: http.IncomingMessage, res: http.ServerResponse) => {
    inFlight++;
    idle();
    res.once('close', () => {
      inFlight--;
      if (inFlight === 0) idle();
    });
    forward(req, res).catch(() => res.destroy());
  });
  server.emit('connection', socket);

  function refuse(
    res: http.ServerResponse,
    status: number,
    reason: InterceptDenyReason,
    extra: Record<string, unknown> = {},
  ): void {
    audit('deny', { reason, ...extra });
    if (res.headersSent) {
      res.destroy();
      return;
    }
    const body = `space gateway refused this request: ${reason}\n`;
    res.writeHead(status, {
      'content-type': 'text/plain; charset=utf-8',
      'content-length': Buffer.byteLength(body),
      'x-space-egress-deny': reason,
      connection: 'close',
    });
    res.end(body);
  }

  async function forward(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    const method = req.method ?? 'GET';
    // values are fetched per request (cached briefly by the source): revocation and rotation land
    // on open keep-alive connections too
    let live: Map<string, CredentialSecret>;
    try {
      live = await ctx.credentials.fetch(ctx.grants);
    } catch {
      return refuse(res, 503, 'credential-unavailable', { method });
    }
    if (res.destroyed) return;
    // every live value of this sandbox is masked in what comes back, not only the one injected
    const needles = needlesFor([...live.values()].map((c) => c.value));
    const prepared = prepareRequest(
      { method, url: req.url ?? '', rawHeaders: req.rawHeaders },
      ctx.sni,
      ctx.grants,
      live,
      limits.maxBodyBytes,
    );
    if (!prepared.ok) return refuse(res, prepared.status, prepared.reason, { method });

    let address: string;
    try {
      address = await ctx.resolve(ctx.sni);
    } catch {
      return refuse(res, 502, 'resolution-failed', { method });
    }
    if (res.destroyed) return;
    for (let i = 0; i < prepared.headers.length; i += 2) {
      // belt and braces against request splitting: the parser and grant validation already ensure this
      http.validateHeaderName(prepared.headers[i]!);
      http.validateHeaderValue(prepared.headers[i]!, prepared.headers[i + 1]!);
    }
    const rule = prepared.injected.length > 0 ? `credential:${prepared.injected.join(',')}` : 'credential';
    audit('allow', { address, rule, method });

    let abandoned = false;
    const upstream = https.request({
      host: address,
      port,
      servername: ctx.sni,
      method,
      path: prepared.path,
      headers: prepared.headers,
      setHost: false,
      agent,
      ca,
      rejectUnauthorized: true,
    });
    res.once('close', () => {
      if (!res.writableFinished) {
        abandoned = true;
        upstream.destroy();
      }
    });
    upstream.on('error', (err: NodeJS.ErrnoException) => {
      if (abandoned) return;
      abandoned = true;
      const code = err.code ?? 'unknown';
      refuse(res, 502, CERT_ERRORS.has(code) ? 'upstream-certificate' : 'upstream-unreachable', {
        address,
        error: code,
      });
    });

    // request body: counted, capped, back-pressured
    let sent = 0;
    req.on('data', (chunk: Buffer) => {
      if (abandoned) return;
      sent += chunk.length;
      idle();
      if (sent > limits.maxBodyBytes) {
        abandoned = true;
        upstream.destroy();
        req.pause();
        return refuse(res, 413, 'body-too-large', { address, method });
      }
      if (!upstream.write(chunk)) req.pause();
    });
    upstream.on('drain', () => req.resume());
    req.on('end', () => {
      if (!abandoned) upstream.end();
    });

    upstream.on('response', (ures: http.IncomingMessage) => {
      if (abandoned) {
        ures.destroy();
        return;
      }
      idle();
      const status = ures.statusCode ?? 502;
      const bodyless = method === 'HEAD' || status === 204 || status === 304 || status < 200;
      const encoding = (ures.headers['content-encoding'] ?? 'identity').trim().toLowerCase();
      const length = Number(ures.headers['content-length'] ?? 0);
      const fail = (reason: InterceptDenyReason) => {
        abandoned = true;
        ures.destroy();
        upstream.destroy();
        refuse(res, 502, reason, { address, method, status });
      };
      if (!bodyless && encoding !== 'identity') return fail('upstream-encoding');
      if (!bodyless && length > limits.maxBodyBytes) return fail('response-too-large');
      // a head writeHead would throw on (E11) ends this exchange with a 502, never the process
      const safe = safeResponseHead(
        ures.statusCode,
        ures.statusMessage,
        responseHeaders(ures.rawHeaders, needles),
      );
      if (!safe) return fail('malformed-response');
      const writeHead = (headers: string[]) =>
        res.writeHead(status, maskText(safe.statusMessage, needles), headers);
      if (bodyless) {
        writeHead(safe.headers);
        res.end();
        ures.resume();
        return;
      }
      // the first bytes decide: a gzip body without a label is read whole, unpacked and masked
      ures.once('error', () => {
        if (!abandoned) fail('malformed-response');
      });
      // read until 3 bytes (or the end) have arrived: a gzip magic split across records must not
      // slip past (an upstream chooses how its body is cut)
      const head: Buffer[] = [];
      let headBytes = 0;
      let decided = false;
      const onHeadData = (c: Buffer) => {
        head.push(c);
        headBytes += c.length;
        if (headBytes >= 3) decide(false);
      };
      const onHeadEnd = () => decide(true);
      const decide = (ended: boolean): void => {
        if (decided || abandoned) return;
        decided = true;
        ures.off('data', onHeadData);
        ures.off('end', onHeadEnd);
        ures.pause();
        idle();
        const first = Buffer.concat(head);
        if (!looksGzipped(first)) {
          writeHead(safe.headers);
          const mask = new SecretMask(needles, limits.maxBodyBytes, idle);
          const done = (err: NodeJS.ErrnoException | null) => {
            if (!err) return;
            if (err instanceof TooLarge) audit('close', { reason: 'response-too-large', address, method });
            abandoned = true;
            res.destroy();
          };
          if (ended) {
            mask.end(first);
            pipeline(mask, res, done);
          } else {
            mask.write(first);
            pipeline(ures, mask, res, done);
          }
          return;
        }
        const chunks: Buffer[] = [first];
        let size = first.length;
        // unpacked and masked in a worker (E17), the whole body or nothing (E16)
        const finish = async () => {
          if (abandoned) return;
          const r = await ctx.unpack(Buffer.concat(chunks), needles);
          if (abandoned) return;
          if (!r.ok) {
            return fail(
              r.problem === 'too-large'
                ? 'response-too-large'
                : r.problem === 'timeout'
                  ? 'unpack-timeout'
                  : 'upstream-encoding',
            );
          }
          const out = r.body;
          idle();
          const headers = safe.headers.filter(
            (_, i, all) => all[i - (i % 2)]!.toLowerCase() !== 'content-length',
          );
          writeHead([...headers, 'content-length', String(out.length)]);
          res.end(out);
        };
        if (ended) {
          void finish();
          return;
        }
        ures.on('data', (c: Buffer) => {
          size += c.length;
          idle();
          if (size > limits.maxBodyBytes) return fail('response-too-large');
          chunks.push(c);
        });
        ures.once('end', () => void finish());
        ures.resume();
      };
      ures.on('data', onHeadData);
      ures.once('end', onHeadEnd);
    });
  }
}
