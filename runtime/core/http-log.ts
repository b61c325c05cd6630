/**
 * One access-log line per HTTP request, for every SPACE service built on Fastify.
 *
 * Fastify's own request logging writes two lines per request ("incoming request" when it arrives,
 * "request completed" when it is answered). A warm create is two requests to the API and one each
 * to the agent and the gateway, so those lines were most of what a create logged, and under a burst
 * of creates their serialisation and writes were CPU the creates waited for. The one line written
 * here carries what the two did: method, redacted URL and remote address (the logger's `req`
 * serializer), status and time to answer, under the request's id. Fastify's other log lines
 * (errors of its default handlers, requests refused while closing) are unchanged.
 */
import { type FastifyReply, type FastifyRequest, LogController } from 'fastify';

/**
 * Fastify's log controller with the "incoming request" line dropped and "request completed" (or
 * "request errored", at `error`) carrying `req`, `res.statusCode` and `responseTime` (ms). A
 * hijacked reply (an SSE stream, a proxied body) logs no completion, as with Fastify's own.
 */
export class AccessLogController extends LogController {
  override incomingRequest(): void {}

  override requestCompleted(
    error: Error | null | undefined,
    request: FastifyRequest,
    reply: FastifyReply,
  ): void {
    const line = { req: request, res: { statusCode: reply.statusCode }, responseTime: reply.elapsedTime };
    if (error) reply.log.error({ ...line, err: error }, 'request errored');
    else reply.log.info(line, 'request completed');
  }
}

/** Fastify server options for {@link AccessLogController} (a fresh controller per server). */
export function requestLogOptions(): { logController: AccessLogController } {
  return { logController: new AccessLogController() };
}
