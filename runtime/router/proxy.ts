/**
 * Forwarding one data-plane request to the agent that serves its sandbox.
 *
 * Why undici's `Dispatcher.request` + `stream.pipeline` rather than `@fastify/reply-from`: the
 * router must look at the agent's answer before committing its own (a `409 SANDBOX_PAUSED` to a
 * bodiless request is retried once after a resume), pick the agent per request from Redis, and
 * keep full control of hop-by-hop headers and timeouts; that is a few lines over undici (already
 * the platform's HTTP client, maintained by the Node.js project) and adds no dependency.
 *
 * Backpressure holds end to end because nothing here buffers: `pipeline(agent body → client)`
 * writes a chunk, and when the client's socket (or HTTP/2 stream window) is full it stops reading
 * the agent's body; undici then pauses its socket (its body timeout does not run while paused),
 * the agent's writes stop draining, and the agent stops reading the command's spool. Uploads and
 * stdin go the other way the same way (undici reads the client's request stream as the agent's
 * socket drains). Each forwarded request holds its own upstream connection (`pipelining: 1`), so
 * a reader that stops holds up only its own stream. Memory per stream is bounded by the streams'
 * high-water marks (tens of KiB), whatever the client's speed.
 */
import type { IncomingHttpHeaders, IncomingMessage, ServerResponse } from 'node:http';
import type { Http2ServerRequest } from 'node:http2';
import { PassThrough, type Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import type { FastifyReply, FastifyRequest } from 'fastify';
import { Agent, type Dispatcher, errors as undiciErrors } from 'undici';
import type { DataPlaneRoute } from '../core/data-plane.ts';
import { isErrorCode, SpaceError } from '../core/errors.ts';
import { answerBeforeBody, unreadBody } from '../core/http-errors.ts';
import { F } from '../core/log-fields.ts';
import { injectTraceHeaders, inSpan, traceContextFrom } from '../core/tracing.ts';
import { downstreamHeaders, upstreamHeaders } from './headers.ts';
import type { SandboxLocator, SandboxUpstream } from './locate.ts';
import type { RouterMetrics } from './metrics.ts';

/** Largest agent error body the router reads to look for SANDBOX_PAUSED, bytes. */
const MAX_ERROR_BODY_BYTES = 64 * 1024;

/** Timeouts of the router's upstream (agent) connections, ms. */
export interface UpstreamTimeouts {
  connectTimeoutMs: number;
  headersTimeoutMs: number;
  uploadTimeoutMs: number;
  bodyTimeoutMs: number;
}

/** The undici dispatcher for agent connections (per-origin pools, unbounded connection count). */
export function createUpstreamDispatcher(t: UpstreamTimeouts): Agent {
  return new Agent({
    connect: { timeout: t.connectTimeoutMs },
    headersTimeout: t.headersTimeoutMs,
    bodyTimeout: t.bodyTimeoutMs,
    keepAliveTimeout: 10_000,
    // one request per connection at a time: a paused stream never delays another one's bytes
    pipelining: 1,
  });
}

/** What forwarding needs. */
export interface ProxyDeps {
  locator: SandboxLocator;
  dispatcher: Dispatcher;
  metrics: RouterMetrics;
  timeouts: UpstreamTimeouts;
  /** `https` when the router terminates TLS. */
  proto: 'http' | 'https';
}

/**
 * True when the client sends a request body: `Transfer-Encoding`, a non-zero `Content-Length`, or
 * an HTTP/2 stream still open after its headers. Pure apart from reading `raw`.
 */
export function requestHasBody(headers: IncomingHttpHeaders, raw: unknown): boolean {
  if (headers['transfer-encoding'] !== undefined) return true;
  const length = headers['content-length'];
  if (length !== undefined) return Number(length) > 0;
  const h2 = (raw as Partial<Http2ServerRequest>).stream;
  return h2 !== undefined && h2.endAfterHeaders === false;
}

/** The client's request body as a stream of its own, for undici to consume or drop. */
function bodyOf(req: FastifyRequest): Readable {
  const pass = new PassThrough();
  const raw = req.raw as unknown as Readable;
  raw.pipe(pass);
  // the client left midway: the agent sees the body break, not end
  raw.once('aborted', () => pass.destroy(new Error('the client aborted its request')));
  return pass;
}

/** Maps an undici failure before the agent's response headers onto a coded error. */
function upstreamError(err: unknown, target: SandboxUpstream): SpaceError {
  const details = { sandboxId: target.sandboxId, nodeId: target.nodeId };
  if (err instanceof undiciErrors.HeadersTimeoutError) {
    return new SpaceError('NODE_UNAVAILABLE', `node ${target.nodeId} did not answer in time`, details, {
      cause: err,
    });
  }
  return new SpaceError('NODE_UNAVAILABLE', `node ${target.nodeId} is not reachable`, details, {
    cause: err,
  });
}

/** Reads at most {@link MAX_ERROR_BODY_BYTES} of a small (error) body. */
async function readSmall(body: Dispatcher.ResponseData['body']): Promise<Buffer> {
  const parts: Buffer[] = [];
  let n = 0;
  for await (const chunk of body) {
    n += (chunk as Buffer).length;
    if (n > MAX_ERROR_BODY_BYTES) {
      body.destroy();
      break;
    }
    parts.push(chunk as Buffer);
  }
  return Buffer.concat(parts);
}

function errorCodeOf(text: Buffer): string | undefined {
  try {
    const code = (JSON.parse(text.toString('utf8')) as { error?: { code?: unknown } }).error?.code;
    return isErrorCode(code) ? code : undefined;
  } catch {
    return undefined;
  }
}

/**
 * Forwards `req` (already authorised for `sandboxId` of `team`, the session token's team) to the
 * agent serving the sandbox and streams the answer back. Returns the status sent (0 when the
 * response broke midway). Finding the agent and waiting for its response headers is the span
 * `router.forward` (in the caller's trace context, passed on to the agent in `traceparent`); a
 * stream's body is not in it.
 * @throws SpaceError before any byte of the response is sent: SANDBOX_NOT_FOUND,
 *   SANDBOX_NOT_RUNNING, SANDBOX_PAUSED, NODE_UNAVAILABLE (see {@link SandboxLocator.locate}).
 */
export async function forward(
  deps: ProxyDeps,
  req: FastifyRequest,
  reply: FastifyReply,
  route: DataPlaneRoute,
  sandboxId: string,
  team: string,
): Promise<number> {
  // the client left: stop waiting for the agent (and stop the agent's stream)
  const abort = new AbortController();
  reply.raw.once('close', () => abort.abort());
  const answer = await inSpan(
    'router.forward',
    { 'space.route': route.name, 'space.sandbox.id': sandboxId },
    () => open(deps, req, sandboxId, team, abort.signal),
    traceContextFrom(req.headers),
  );
  if (!answer) return 0; // the client went away first
  if (answer.small || unreadBody(req.raw as IncomingMessage)) {
    // an answer before the client's body ended (a refusal: the agent stopped reading it) is
    // written at once, and the rest of the body is read and dropped so the client reads it (R22)
    const small = answer.small ?? (await readSmall(answer.res.body));
    reply.hijack();
    const headers = downstreamHeaders(answer.res.headers) as Record<string, string | string[]>;
    if (unreadBody(req.raw as IncomingMessage)) {
      answerBeforeBody(
        req.raw as IncomingMessage,
        reply.raw as ServerResponse,
        answer.res.statusCode,
        headers,
        small,
      );
    } else {
      reply.raw.writeHead(answer.res.statusCode, headers);
      reply.raw.end(small);
    }
    return answer.res.statusCode;
  }
  return stream(deps, req, reply, route, answer.res);
}

/**
 * Finds the agent serving `sandboxId` and sends it `req`, up to its response headers. Resolves to
 * its response (`small`: the body of an error already read), or null when `signal` aborted first.
 * @throws SpaceError as {@link forward} does.
 */
async function open(
  deps: ProxyDeps,
  req: FastifyRequest,
  sandboxId: string,
  team: string,
  signal: AbortSignal,
): Promise<{ res: Dispatcher.ResponseData; small?: Buffer } | null> {
  const hasBody = requestHasBody(req.headers, req.raw);
  // the agent's spans are children of this hop's (a client's own traceparent is replaced)
  const headers = injectTraceHeaders(
    upstreamHeaders(req.headers, { remoteAddress: req.socket.remoteAddress, proto: deps.proto }),
  );
  let target = await deps.locator.locate(sandboxId, { team });
  for (let attempt = 0; attempt < 2; attempt++) {
    let res: Dispatcher.ResponseData;
    try {
      res = await deps.dispatcher.request({
        origin: target.url,
        // the raw path and query, verbatim (Fastify matched it to a data-plane route)
        path: req.url,
        method: req.method as Dispatcher.HttpMethod,
        headers,
        // through a pipe: when the agent answers before the body ended, undici drops the pipe, not
        // the client's request (and socket) the answer must still go out on
        body: hasBody ? bodyOf(req) : null,
        signal,
        headersTimeout: hasBody ? deps.timeouts.uploadTimeoutMs : deps.timeouts.headersTimeoutMs,
      });
    } catch (err) {
      if (signal.aborted) return null;
      throw upstreamError(err, target);
    }
    if (res.statusCode === 409 && String(res.headers['content-type'] ?? '').includes('json')) {
      const text = await readSmall(res.body);
      // paused between our lookup and the agent: resume and retry once, when there is no body
      // to replay (a body has been consumed by the first attempt)
      if (errorCodeOf(text) === 'SANDBOX_PAUSED' && !hasBody && attempt === 0) {
        req.log.info(
          { [F.sandboxId]: sandboxId, [F.nodeId]: target.nodeId },
          'sandbox paused under a request',
        );
        target = await deps.locator.locate(sandboxId, { team, afterPaused: true });
        continue;
      }
      return { res, small: text };
    }
    return { res };
  }
  throw new SpaceError('SANDBOX_PAUSED', `sandbox ${sandboxId} was paused again while resuming`, {
    sandboxId,
  });
}

/** Streams the agent's response to the client with backpressure; returns the status (0 if it broke). */
async function stream(
  deps: ProxyDeps,
  req: FastifyRequest,
  reply: FastifyReply,
  route: DataPlaneRoute,
  res: Dispatcher.ResponseData,
): Promise<number> {
  reply.hijack();
  const out = reply.raw;
  out.writeHead(res.statusCode, downstreamHeaders(res.headers));
  // SSE: the client sees the headers now, not with the first event
  if (typeof (out as { flushHeaders?: unknown }).flushHeaders === 'function') out.flushHeaders();
  deps.metrics.activeStreams.inc({ route: route.name });
  try {
    await pipeline(res.body, out);
    return res.statusCode;
  } catch (err) {
    // the client left or the agent's stream broke: both ends are destroyed by pipeline
    req.log.debug({ err }, 'forwarded response ended early');
    return 0;
  } finally {
    deps.metrics.activeStreams.dec({ route: route.name });
  }
}
