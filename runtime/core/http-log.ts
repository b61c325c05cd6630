/**
 * One access-log line per HTTP request, for every SPACE service built on Fastify.
 *
 * Fastify's own request logging writes two lines per request ("incoming request" when it arrives,
 * "request completed" when it is answered). A warm create is two requests to the API and one each
 * to the agent and the gateway, so those lines were most of what a create logged, and under a burst
 * of creates their serialisation and writes were CPU the creates waited for. The one line written
 * here carries what the two did: method, redacted URL and remote address (`requestSerializer`),
 * status and time to answer, under the request's id.
 */
import type { FastifyInstance } from 'fastify';

/** Fastify server options that turn its two lines per request off (see {@link installRequestLog}). */
export const REQUEST_LOG_OPTIONS = { disableRequestLogging: true } as const;

/**
 * Logs "request completed" at `info` once each request is answered: `req` (as the logger's `req`
 * serializer renders it), `res.statusCode`, `responseTime` (ms). A hijacked reply (an SSE stream, a
 * proxied body) logs nothing here, as with Fastify's own logging.
 */
export function installRequestLog(app: FastifyInstance): void {
  app.addHook('onResponse', (req, reply, done) => {
    req.log.info(
      { req, res: { statusCode: reply.statusCode }, responseTime: reply.elapsedTime },
      'request completed',
    );
    done();
  });
}
