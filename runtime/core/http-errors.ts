/**
 * The one Fastify error handler every SPACE HTTP service installs: renders
 * `{ error: { code, message, details? } }` from {@link SpaceError}, maps Fastify's own errors
 * (validation, body size, content type) onto stable codes, turns a Redis outage into 503
 * `CONTROL_PLANE_UNAVAILABLE` with `Retry-After` (see `redis-errors.ts`; any refusal whose details
 * carry `retryAfterSec` gets the header too), logs ≥ 500 at `error`
 * and the rest at `info`.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import { Socket } from 'node:net';
import type { FastifyError, FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { type ErrorCode, SpaceError } from './errors.ts';
import { CONTROL_PLANE_RETRY_AFTER_SEC, fromRedisOutage } from './redis-errors.ts';

/** Maps a Fastify/avvio error code to a SPACE code. */
function fromFastify(err: FastifyError): SpaceError | null {
  if (err.validation) return new SpaceError('BAD_REQUEST', err.message);
  const byCode: Record<string, ErrorCode> = {
    FST_ERR_CTP_BODY_TOO_LARGE: 'BODY_TOO_LARGE',
    FST_ERR_CTP_INVALID_MEDIA_TYPE: 'BAD_REQUEST',
    FST_ERR_CTP_EMPTY_JSON_BODY: 'BAD_REQUEST',
    FST_ERR_CTP_INVALID_JSON_BODY: 'BAD_REQUEST',
    FST_ERR_CTP_INVALID_CONTENT_LENGTH: 'BAD_REQUEST',
  };
  const code = err.code ? byCode[err.code] : undefined;
  if (code) return new SpaceError(code, err.message);
  if (err.statusCode && err.statusCode >= 400 && err.statusCode < 500)
    return new SpaceError('BAD_REQUEST', err.message);
  return null;
}

/**
 * Installs the error and not-found handlers on `app`. `translate` may replace an error before it
 * is rendered (the agent turns GUEST_UNAVAILABLE from a dead sandbox into SANDBOX_CRASHED).
 * `notFoundBody` may give a request for no route another 404 body than SPACE's envelope (the API
 * answers an E2B client in E2B's shape); null keeps the envelope.
 */
export function installErrorHandlers(
  app: FastifyInstance,
  translate?: (err: FastifyError, req: FastifyRequest) => Promise<unknown>,
  notFoundBody?: (req: FastifyRequest, err: SpaceError) => object | null,
): void {
  app.setErrorHandler(async (original: FastifyError, req, reply) => {
    const translated = translate ? await translate(original, req).catch(() => original) : original;
    const err = fromRedisOutage(translated) as FastifyError;
    const known =
      err instanceof SpaceError
        ? err
        : (fromFastify(err) ?? new SpaceError('INTERNAL', 'internal error', undefined, { cause: err }));
    if (known.code === 'CONTROL_PLANE_UNAVAILABLE') {
      // one line without a stack per refused request: during a Redis restart there are many
      req.log.error({ code: known.code, cause: String(known.cause) }, 'request failed: redis unavailable');
    } else if (known.status >= 500 && retryAfterSec(known) === null) {
      req.log.error({ err, code: known.code }, 'request failed');
    } else if (known.status >= 500) {
      // a refusal with Retry-After (no room for a create) is the system working: one line, no stack
      req.log.warn({ code: known.code, msg: known.message }, 'request refused');
    } else req.log.info({ code: known.code, msg: known.message }, 'request refused');
    if (reply.sent || reply.raw.headersSent) return;
    return sendRefusal(req, reply, known);
  });
  app.setNotFoundHandler((req, reply) => {
    const err = new SpaceError('NOT_FOUND', `no route ${req.method} ${req.url}`);
    const other = notFoundBody?.(req, err);
    if (other) return reply.status(404).type('application/json').send(other);
    void sendRefusal(req, reply, err);
  });
}

/**
 * Sends `err`'s envelope: through Fastify when the request's body has been read (or it has none),
 * else with {@link answerBeforeBody}, so a client still writing its body reads the refusal.
 */
function sendRefusal(req: FastifyRequest, reply: FastifyReply, err: SpaceError): FastifyReply | undefined {
  const headers: Record<string, string | number> = {};
  const retryAfter = retryAfterSec(err);
  if (retryAfter !== null) headers['retry-after'] = retryAfter;
  const raw = req.raw as IncomingMessage;
  if (unreadBody(raw)) {
    reply.hijack();
    const json = { ...headers, 'content-type': 'application/json; charset=utf-8' };
    answerBeforeBody(
      raw,
      reply.raw as ServerResponse,
      err.status,
      json,
      Buffer.from(JSON.stringify(err.toBody())),
    );
    return undefined;
  }
  return reply.status(err.status).headers(headers).type('application/json').send(err.toBody());
}

/**
 * The `Retry-After` seconds (RFC 9110 §10.2.3) a refusal carries: CONTROL_PLANE_UNAVAILABLE's, or
 * the error's own `details.retryAfterSec` (a positive integer: a rate window, a node's room); null
 * when it has none. Pure.
 */
export function retryAfterSec(err: SpaceError): number | null {
  if (err.code === 'CONTROL_PLANE_UNAVAILABLE') return CONTROL_PLANE_RETRY_AFTER_SEC;
  const sec = err.details?.retryAfterSec;
  return typeof sec === 'number' && Number.isInteger(sec) && sec > 0 ? sec : null;
}

/**
 * How long a server goes on reading (and discarding) the rest of a request body it has already
 * refused before it cuts the connection, ms. Long enough for a client on a fast link to finish
 * writing a refused upload of tens of MB; short enough that a client that stalls holds no socket.
 */
export const REFUSED_BODY_DRAIN_MS = 5_000;

/**
 * True when `raw` is an HTTP/1.x request on a real connection whose body has not arrived to its
 * end (a refusal sent now would race the client's writes). HTTP/2 streams end on their own
 * (`RST_STREAM`) without touching the connection, so they are never "unread" here.
 */
export function unreadBody(raw: IncomingMessage): boolean {
  // a request injected without a socket (Fastify's inject) has no connection to linger on
  return raw.httpVersionMajor === 1 && !raw.complete && !raw.destroyed && raw.socket instanceof Socket;
}

/**
 * Answers a request whose body the server will not use while the client may still be writing it:
 * the whole response (`status`, `headers`, `body`, `Connection: close`) is written at once, then the
 * rest of the request body is read and thrown away, and only when it has ended is the response
 * ended and the connection closed. A client that reads early (undici, browsers) stops sending
 * and reads the refusal at once; a client that writes its whole body before reading (Python's
 * `http.client`, `curl -T`) finishes writing and then reads it. Closing before the body ended
 * would make the kernel answer the client's next bytes with a reset (RFC 9293 §3.10.7.4 / RFC
 * 1122 §4.2.2.13), which loses the refusal; never closing would let a stalled client hold the
 * socket. So the drain is bounded: after {@link REFUSED_BODY_DRAIN_MS} (or `drainMs`) the
 * connection is cut whatever the client still sends. RFC 9112 §9.6 (tear-down) describes this
 * "lingering close".
 * @param headers response headers (`content-type` …); `content-length` and `connection` are set here.
 * @param body the whole response body.
 * @param drainMs how long the rest of the request body is read before the connection is cut, ms.
 */
export function answerBeforeBody(
  req: IncomingMessage,
  res: ServerResponse,
  status: number,
  headers: Record<string, string | number | string[]>,
  body: Buffer,
  drainMs = REFUSED_BODY_DRAIN_MS,
): void {
  if (!res.headersSent) {
    const h = Object.fromEntries(
      Object.entries(headers).filter(
        ([k]) =>
          !['content-length', 'connection', 'transfer-encoding', 'keep-alive'].includes(k.toLowerCase()),
      ),
    );
    res.writeHead(status, { ...h, 'content-length': body.length, connection: 'close' });
  }
  res.write(body);
  // whoever was reading the body (a pipe into an upload) lets go of it; it flows into nothing now
  req.unpipe();
  const socket = req.socket as Socket | null;
  let done = false;
  const finish = (cut: boolean) => {
    if (done) return;
    done = true;
    clearTimeout(timer);
    res.end();
    if (cut) socket?.destroy();
  };
  const timer = setTimeout(() => finish(true), drainMs);
  timer.unref();
  req.once('end', () => finish(false));
  req.once('error', () => finish(true));
  req.once('close', () => finish(!req.complete));
  req.on('data', () => {});
  req.resume();
}

/**
 * Fastify's `clientErrorHandler` for every SPACE service: a request the HTTP parser refuses before
 * any route sees it (headers too large, a malformed request line, a header timeout) gets the same
 * error envelope as every other refusal, then the connection is closed (the parser cannot go on).
 * `HPE_HEADER_OVERFLOW` → 431 HEADERS_TOO_LARGE (RFC 6585 §5), `ERR_HTTP_REQUEST_TIMEOUT` → 408
 * REQUEST_TIMEOUT, anything else → 400 BAD_REQUEST. A reset connection is left alone.
 */
export function clientErrorHandler(err: NodeJS.ErrnoException, socket: Socket): void {
  if (err.code === 'ECONNRESET' || socket.destroyed) return;
  const known =
    err.code === 'HPE_HEADER_OVERFLOW'
      ? new SpaceError('HEADERS_TOO_LARGE', 'the request headers are larger than the server accepts')
      : err.code === 'ERR_HTTP_REQUEST_TIMEOUT'
        ? new SpaceError('REQUEST_TIMEOUT', 'the request did not arrive in time')
        : new SpaceError('BAD_REQUEST', `malformed HTTP request (${err.code ?? 'parse error'})`);
  if (!socket.writable) {
    socket.destroy();
    return;
  }
  const text = JSON.stringify(known.toBody());
  // end, not destroy: the answer is flushed before the FIN; a client that never closes its side
  // is cut after a second
  socket.end(
    `HTTP/1.1 ${known.status} ${STATUS_TEXT[known.status] ?? 'Error'}\r\n` +
      `Content-Type: application/json; charset=utf-8\r\nContent-Length: ${Buffer.byteLength(text)}\r\n` +
      `Connection: close\r\n\r\n${text}`,
  );
  setTimeout(() => socket.destroy(), 1000).unref();
}

/** Reason phrases of the statuses {@link clientErrorHandler} sends (RFC 9110 §15, RFC 6585 §5). */
const STATUS_TEXT: Record<number, string> = {
  400: 'Bad Request',
  408: 'Request Timeout',
  431: 'Request Header Fields Too Large',
};

/**
 * Treats a request with an empty body as bodiless whatever its `Content-Type` (R18): many
 * generated HTTP clients send `Content-Type: application/json` on every request, a `DELETE` too.
 * A request whose body is empty (`Content-Length: 0`, or neither that nor `Transfer-Encoding`)
 * loses its content type before Fastify picks a body parser, so routes without a body accept it
 * and routes that need one answer with their schema's BAD_REQUEST. `application/octet-stream`
 * keeps its type: zero bytes there is a real body (an empty file upload, an empty stdin write).
 */
export function acceptEmptyBodies(app: FastifyInstance): void {
  app.addHook('onRequest', async (req) => {
    const h = req.headers;
    const type = h['content-type'];
    if (type === undefined || type.toLowerCase().startsWith('application/octet-stream')) return;
    const empty =
      h['content-length'] === '0' ||
      (h['content-length'] === undefined && h['transfer-encoding'] === undefined);
    if (empty) delete h['content-type'];
  });
  // a route whose body is optional (`{}` and nothing mean the same) validates an absent body as `{}`
  app.addHook('preValidation', async (req) => {
    if (req.body == null && req.routeOptions.schema?.body) req.body = {};
  });
}
