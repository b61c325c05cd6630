/**
 * The connection plumbing of intercepted TLS, once the handshake is done (docs/egress.md): node:http
 * serves HTTP/1.1 on the decrypted socket (parse errors answered 400/431, CONNECT 405), each request
 * is checked by {@link prepareRequest} with the values fetched for it, then re-originated with https
 * to the address the gateway resolved itself (SNI = the name, full certificate verification; a
 * failed one is a 502 before a request byte is written). Bodies stream both ways under
 * `maxBodyBytes` with back-pressure; an encoded response is refused; a response body is masked as it
 * streams, or, when it starts like gzip without a label, read whole and masked in a worker
 * (`InterceptContext.unpack`, E16/E17). Every progress re-arms the idle deadline.
 */
import http from 'node:http';
import https from 'node:https';
import type net from 'node:net';
import { pipeline } from 'node:stream';
import tls from 'node:tls';
import type { CredentialSecret } from './credentials.ts';
import { safeResponseHead } from './http-headers.ts';
import type { InterceptContext } from './intercept.ts';
import { type InterceptDenyReason, prepareRequest, responseHeaders } from './intercept-request.ts';
import { looksGzipped } from './packed-body.ts';
import { maskText, needlesFor, SecretMask, TooLarge } from './reflection.ts';

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

/** Writes one audit line in the gateway's shape (see audit.ts): `egress allow|deny|close`. */
export type AuditLine = (
  event: 'allow' | 'deny' | 'close',
  fields: { reason?: InterceptDenyReason; address?: string | null; rule?: string; [k: string]: unknown },
) => void;

/**
 * Serves HTTP/1.1 on the established TLS socket `socket` and forwards each checked request to
 * `ctx.sni` on `port`. `deadline(ms, reason)` (re)arms the connection's single timer; it is called
 * with `limits.idleTimeoutMs` on every progress. Never throws: failures are audit lines and refused
 * or closed exchanges.
 */
export function serveHttp(
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
