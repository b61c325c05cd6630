/**
 * The one Fastify error handler every SPACE HTTP service installs: renders
 * `{ error: { code, message, details? } }` from {@link SpaceError}, maps Fastify's own errors
 * (validation, body size, content type) onto stable codes, logs ≥ 500 at `error` and the rest
 * at `info`.
 */
import type { FastifyError, FastifyInstance } from 'fastify';
import { type ErrorCode, SpaceError } from './errors.ts';

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

/** Installs the error and not-found handlers on `app`. */
export function installErrorHandlers(app: FastifyInstance): void {
  app.setErrorHandler((err: FastifyError, req, reply) => {
    const known =
      err instanceof SpaceError
        ? err
        : (fromFastify(err) ?? new SpaceError('INTERNAL', 'internal error', undefined, { cause: err }));
    if (known.status >= 500) req.log.error({ err, code: known.code }, 'request failed');
    else req.log.info({ code: known.code, msg: known.message }, 'request refused');
    if (reply.sent || reply.raw.headersSent) return;
    void reply.status(known.status).type('application/json').send(known.toBody());
  });
  app.setNotFoundHandler((req, reply) => {
    void reply.status(404).send(new SpaceError('NOT_FOUND', `no route ${req.method} ${req.url}`).toBody());
  });
}
