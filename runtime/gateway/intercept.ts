/**
 * Intercepted TLS for credential hosts (DESIGN.md "Credentials", egress.md §0 rule 7, T20, T22, T23).
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
 *    could not be scanned.
 *
 * Audit lines use the gateway's shape: `egress allow|deny|close` with `sandbox.id`, `name`,
 * `address`, `port`, `rule`, `reason`. Real values are never logged nor part of any error text.
 */
import http from 'node:http';
import https from 'node:https';
import type net from 'node:net';
import { pipeline, Transform, type TransformCallback } from 'node:stream';
import tls from 'node:tls';
import type { Logger } from 'pino';
import { normaliseName } from '../core/egress.ts';
import { F } from '../core/log-fields.ts';
import type { DeploymentCa, Leaf } from './ca.ts';
import { applyFormat, type CredentialGrant, grantsCovering, PLACEHOLDER_SCAN_RE } from './credentials.ts';
import { HOP_BY_HOP, stripHopByHop } from './http-headers.ts';

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
  /** Every credential granted to this sandbox (not only those covering `sni`). */
  grants: CredentialGrant[];
  /** An IPv4 the gateway resolved itself for `name` and checked against its deny set; rejects otherwise. */
  resolve: (name: string) => Promise<string>;
  log: Logger;
  limits: InterceptLimits;
  /** Extra trusted CAs for upstream verification, on top of the system store. */
  upstreamCa?: Buffer[];
  /** Upstream port (default 443; tests override). */
  upstreamPort?: number;
  ca: DeploymentCa;
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
  | 'response-too-large';

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
 * Checks one request head and builds what goes upstream: Host == SNI, unambiguous framing within
 * `maxBodyBytes`, hop-by-hop headers stripped, placeholders of this sandbox replaced in their
 * grant's header (every copy of that header dropped, one written), anything else placeholder-shaped
 * refused. Pure.
 */
export function prepareRequest(
  head: RequestHead,
  sni: string,
  grants: readonly CredentialGrant[],
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

  const pairs: [name: string, value: string][] = [];
  for (let i = 0; i + 1 < head.rawHeaders.length; i += 2) {
    pairs.push([head.rawHeaders[i]!, head.rawHeaders[i + 1]!]);
  }
  const named = (n: string) => pairs.filter(([k]) => k.toLowerCase() === n).map(([, v]) => v);

  const hosts = named('host');
  if (hosts.length !== 1 || !authorityMatches(hosts[0]!, sni)) return refusal(421, 'host-sni-mismatch');

  // framing (node:http already refuses CL+TE, duplicate CL and a non-final chunked; this is the belt)
  const te = named('transfer-encoding');
  const cl = named('content-length');
  if (te.length > 0 && (te.length !== 1 || te[0]!.trim().toLowerCase() !== 'chunked' || cl.length > 0)) {
    return refusal(400, 'malformed-http');
  }
  let contentLength: number | null = null;
  if (cl.length > 0) {
    if (cl.length !== 1 || !/^\d{1,15}$/.test(cl[0]!.trim())) return refusal(400, 'malformed-http');
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

  // substitution: exactly `format(placeholder)` in the grant's header → that header becomes format(value)
  const chosen = new Map<string, CredentialGrant>();
  for (const g of covering) {
    const expected = applyFormat(g.format, g.placeholder);
    if (!forwarded.some(([k, v]) => k.toLowerCase() === g.header && v === expected)) continue;
    if (chosen.has(g.header)) return refusal(403, 'ambiguous-credential');
    chosen.set(g.header, g);
  }
  forwarded = forwarded.filter(([k]) => !chosen.has(k.toLowerCase()));
  if (
    forwarded.some((pair) => pair.some((s) => placeholdersIn(s).length > 0)) ||
    placeholdersIn(path).length > 0
  ) {
    return refusal(403, 'placeholder-misplaced');
  }
  for (const [header, g] of chosen) forwarded.push([header, applyFormat(g.format, g.value)]);

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
    injected: [...chosen.values()].map((g) => g.name),
    contentLength,
    chunked,
  };
}

/** Replaces every occurrence of a secret in `text` (header values, status text). */
function maskText(text: string, secrets: readonly string[]): string {
  let out = text;
  for (const s of secrets) if (out.includes(s)) out = out.split(s).join('[redacted]');
  return out;
}

/**
 * Response headers to send to the client: hop-by-hop and Connection-named ones dropped, secrets
 * masked. Alternating names and values. Pure.
 */
export function responseHeaders(rawHeaders: readonly string[], secrets: readonly string[]): string[] {
  return stripHopByHop(rawHeaders).map((v, i) => (i % 2 === 1 ? maskText(v, secrets) : v));
}

class TooLarge extends Error {}

/**
 * Streams bytes through, overwriting every occurrence of any secret with `*` of the same length
 * (so Content-Length stays right), including occurrences split across chunks: the last
 * `longest - 1` bytes are held back until more data (or the end) arrives. Fails with
 * {@link TooLarge} past `maxBytes`.
 */
export class SecretMask extends Transform {
  private readonly secrets: Buffer[];
  private readonly keep: number;
  private readonly maxBytes: number;
  private readonly onProgress: () => void;
  private carry: Buffer = Buffer.alloc(0);
  private seen = 0;

  constructor(secrets: readonly string[], maxBytes: number, onProgress: () => void = () => {}) {
    super();
    this.secrets = secrets.filter((s) => s.length > 0).map((s) => Buffer.from(s));
    this.keep = Math.max(0, ...this.secrets.map((s) => s.length - 1));
    this.maxBytes = maxBytes;
    this.onProgress = onProgress;
  }

  override _transform(chunk: Buffer, _enc: BufferEncoding, cb: TransformCallback): void {
    this.seen += chunk.length;
    this.onProgress();
    if (this.seen > this.maxBytes) {
      cb(new TooLarge('response body over the limit'));
      return;
    }
    const buf = this.carry.length > 0 ? Buffer.concat([this.carry, chunk]) : chunk;
    this.mask(buf);
    const emit = Math.max(0, buf.length - this.keep);
    this.carry = Buffer.from(buf.subarray(emit));
    cb(null, emit > 0 ? buf.subarray(0, emit) : undefined);
  }

  override _flush(cb: TransformCallback): void {
    cb(null, this.carry.length > 0 ? this.carry : undefined);
  }

  private mask(buf: Buffer): void {
    for (const s of this.secrets) {
      let at = buf.indexOf(s);
      while (at !== -1) {
        buf.fill(0x2a, at, at + s.length);
        at = buf.indexOf(s, at + s.length);
      }
    }
  }
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
  const secrets = ctx.grants.map((g) => g.value);
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
    const prepared = prepareRequest(
      { method, url: req.url ?? '', rawHeaders: req.rawHeaders },
      ctx.sni,
      ctx.grants,
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
      res.writeHead(
        status,
        maskText(ures.statusMessage ?? '', secrets),
        responseHeaders(ures.rawHeaders, secrets),
      );
      pipeline(ures, new SecretMask(secrets, limits.maxBodyBytes, idle), res, (err) => {
        if (!err) return;
        if (err instanceof TooLarge) audit('close', { reason: 'response-too-large', address, method });
        abandoned = true;
        res.destroy();
      });
    });
  }
}
