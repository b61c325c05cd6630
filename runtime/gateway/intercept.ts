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
 *
 * This module owns the hand-over contract ({@link InterceptContext}) and step 1, the TLS
 * termination with its deadlines; `intercept-request.ts` steps 2–3 (the pure request rewrite) and
 * `intercept-forward.ts` steps 4–5 (serving and forwarding).
 */
import type net from 'node:net';
import tls from 'node:tls';
import type { Logger } from 'pino';
import { normaliseName } from '../core/egress.ts';
import { F } from '../core/log-fields.ts';
import type { DeploymentCa, Leaf } from './ca.ts';
import type { CredentialSource } from './credential-source.ts';
import type { CredentialGrant } from './credentials.ts';
import { type AuditLine, serveHttp } from './intercept-forward.ts';
import type { InterceptDenyReason } from './intercept-request.ts';
import type { Needles } from './reflection.ts';
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
