/**
 * The one Fastify error handler every SPACE HTTP service installs: renders
 * `{ error: { code, message, details? } }` from {@link SpaceError}, maps Fastify's own errors
 * (validation, body size, content type) onto stable codes, turns a Redis outage into 503
 * `CONTROL_PLANE_UNAVAILABLE` with `Retry-After` (see `redis-errors.ts`), logs ≥ 500 at `error`
 * and the rest at `info`.
 */
import type { FastifyError, FastifyInstance, FastifyRequest } from 'fastify';
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
 */
export function installErrorHandlers(
  app: FastifyInstance,
  translate?: (err: FastifyError, req: FastifyRequest) => Promise<unknown>,
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
    } else if (known.status >= 500) req.log.error({ err, code: known.code }, 'request failed');
    else req.log.info({ code: known.code, msg: known.message }, 'request refused');
    if (reply.sent || reply.raw.headersSent) return;
    if (known.code === 'CONTROL_PLANE_UNAVAILABLE')
      reply.header('retry-after', CONTROL_PLANE_RETRY_AFTER_SEC);
    return reply.status(known.status).type('application/json').send(known.toBody());
  });
  app.setNotFoundHandler((req, reply) => {
    void reply.status(404).send(new SpaceError('NOT_FOUND', `no route ${req.method} ${req.url}`).toBody());
  });
}

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
