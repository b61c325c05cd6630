/**
 * The router as a Fastify app (never listens itself): the data-plane routes of
 * `core/data-plane.ts`, each checked by a session-token hook (signature, expiry, sandbox id and the
 * route's scope, offline with the public key) and forwarded to the sandbox's agent; plus
 * `/healthz`, `/readyz` and `/metrics`; E2B's envd (envd/) and the servers listening in sandboxes
 * (ports.ts). Plain HTTP/1.1 without TLS material; with it, TLS whose ALPN offers h2 and http/1.1
 * (one port, both protocols).
 */
import fastify, { type FastifyBaseLogger, type FastifyInstance, type FastifyServerOptions } from 'fastify';
import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import { buildVersion } from '../core/build-version.ts';
import {
  DATA_PLANE_JSON_BODY_LIMIT,
  DATA_PLANE_ROUTES,
  type DataPlaneRoute,
  sessionTokenOf,
} from '../core/data-plane.ts';
import { SpaceError } from '../core/errors.ts';
import { clientErrorHandler, installErrorHandlers } from '../core/http-errors.ts';
import { requestLogOptions } from '../core/http-log.ts';
import { ID_PATTERN } from '../core/ids.ts';
import { F } from '../core/log-fields.ts';
import { DEFAULT_TEAM } from '../core/tenancy.ts';
import { type VerifyKey, verifySessionToken } from '../core/tokens.ts';
import { inSpan, traceContextFrom } from '../core/tracing.ts';
import type { RouterConfig } from './config.ts';
import { installEnvd } from './envd/service.ts';
import { SandboxLocator } from './locate.ts';
import { createRouterMetrics, type RouterMetrics } from './metrics.ts';
import { installPorts, portRewrite } from './ports.ts';
import { createUpstreamDispatcher, forward, type ProxyDeps } from './proxy.ts';

declare module 'fastify' {
  interface FastifyContextConfig {
    /** The data-plane route this Fastify route forwards (its scope drives the token check). */
    dataPlane?: DataPlaneRoute;
  }
  interface FastifyRequest {
    /** Team of the request's verified session token (set by the token hook). */
    sessionTeam?: string;
  }
}

/** Everything the router's routes use; built once per process by {@link createRouterDeps}. */
export interface RouterDeps {
  config: RouterConfig;
  log: Logger;
  redis: Redis;
  verifyKey: VerifyKey;
  metrics: RouterMetrics;
  proxy: ProxyDeps;
  /** PEM certificate and key: TLS with ALPN h2 + http/1.1. Absent: plain HTTP/1.1. */
  tls?: { cert: Buffer; key: Buffer };
}

/** Builds the deps from config, logger, a Redis connection, the verify key and optional TLS material. */
export function createRouterDeps(o: {
  config: RouterConfig;
  log: Logger;
  redis: Redis;
  verifyKey: VerifyKey;
  tls?: { cert: Buffer; key: Buffer };
}): RouterDeps {
  const metrics = createRouterMetrics();
  const timeouts = {
    connectTimeoutMs: o.config.connectTimeoutMs,
    headersTimeoutMs: o.config.headersTimeoutMs,
    uploadTimeoutMs: o.config.uploadTimeoutMs,
    bodyTimeoutMs: o.config.bodyTimeoutMs,
  };
  return {
    ...o,
    metrics,
    proxy: {
      locator: new SandboxLocator(o.redis, metrics, { resumeTimeoutMs: o.config.resumeTimeoutMs }),
      dispatcher: createUpstreamDispatcher(timeouts),
      metrics,
      timeouts,
      proto: o.tls ? 'https' : 'http',
    },
  };
}

const SANDBOX_ID = new RegExp(ID_PATTERN);

/**
 * The largest request body `route` takes, bytes: `maxUploadBytes` for an upload, none for stdin,
 * {@link DATA_PLANE_JSON_BODY_LIMIT} for every other route (the agent parses any JSON body up to it).
 */
export function bodyLimit(route: DataPlaneRoute, maxUploadBytes: number): number {
  const body = 'body' in route ? route.body : undefined;
  if (body === 'upload') return maxUploadBytes;
  if (body === 'stream') return Number.POSITIVE_INFINITY;
  return DATA_PLANE_JSON_BODY_LIMIT;
}

/** The Fastify app (not listening). */
export async function buildApp(deps: RouterDeps): Promise<FastifyInstance> {
  const common = {
    loggerInstance: deps.log as FastifyBaseLogger,
    // streams and uploads last as long as they last; the agent bounds them, the router's own
    // timeouts bound the waits (resume, connect, headers, body silence)
    requestTimeout: 0,
    // hijacked streams are not idle connections: close them on shutdown
    forceCloseConnections: true,
    // a request the HTTP parser refuses (431 headers too large, …) gets the error envelope too
    clientErrorHandler,
    // `<port>-<id>.<domain>` and E2B's port header go to the port route, whatever their path
    rewriteUrl: portRewrite,
    ...requestLogOptions(),
  } satisfies FastifyServerOptions;
  const app = (deps.tls
    ? fastify({ ...common, http2: true, https: { allowHTTP1: true, cert: deps.tls.cert, key: deps.tls.key } })
    : fastify(common)) as unknown as FastifyInstance;
  installErrorHandlers(app);
  // bodies are never parsed here: the raw request stream goes to the agent as it arrives
  app.removeAllContentTypeParsers();
  app.addContentTypeParser('*', (_req, _payload, done) => done(null));

  app.get('/healthz', async () => ({ ok: true, version: buildVersion() }));
  app.get('/readyz', async (_req, reply) => {
    try {
      await deps.redis.ping();
      return { ok: true };
    } catch {
      return reply.status(503).send(new SpaceError('INTERNAL', 'redis is not reachable').toBody());
    }
  });
  app.get('/metrics', async (_req, reply) =>
    reply.type(deps.metrics.registry.contentType).send(await deps.metrics.registry.metrics()),
  );

  let inFlight = 0;
  /** Requests whose outcome the handler counted (forwarded ones); the rest are counted on response. */
  const counted = new WeakSet<object>();
  for (const route of DATA_PLANE_ROUTES) {
    if ('forwarded' in route && route.forwarded === false) continue;
    app.route<{ Params: { id: string } }>({
      method: route.method,
      url: route.path,
      config: { dataPlane: route },
      // the token is checked before anything else happens for the request: no Redis read, no
      // resume and no byte to an agent for a bad, expired or other-sandbox token
      onRequest: async (req) => {
        const { id } = req.params;
        if (!SANDBOX_ID.test(id)) throw new SpaceError('BAD_REQUEST', 'malformed sandbox id');
        const query = new URLSearchParams(req.url.split('?')[1] ?? '');
        const token = sessionTokenOf(req.headers.authorization, query);
        if (!token) {
          throw new SpaceError(
            'UNAUTHENTICATED',
            'session token required (Authorization: Bearer or ?token=)',
          );
        }
        // the agent checks the session (and again the scope) against its own record; the team is
        // checked against the sandbox's record when it is located (a token without one: default team)
        const claims = await inSpan(
          'router.token.verify',
          { 'space.route': route.name, 'space.sandbox.id': id },
          () => verifySessionToken(deps.verifyKey, token, { sandboxId: id, scope: route.scope }),
          traceContextFrom(req.headers),
        );
        req.sessionTeam = claims.team ?? DEFAULT_TEAM;
        // a body over its limit is refused by the first hop that sees its size (R23): here, before
        // any Redis read or byte to an agent (a chunked body is counted by the agent as it arrives)
        const limit = bodyLimit(route, deps.config.maxUploadBytes);
        const declared = Number(req.headers['content-length'] ?? 0);
        if (declared > limit) {
          throw new SpaceError('BODY_TOO_LARGE', `${route.name} bodies are limited to ${limit} bytes`, {
            limit,
          });
        }
      },
      handler: async (req, reply) => {
        if (inFlight >= deps.config.maxRequests) {
          throw new SpaceError('RATE_LIMITED', 'the router is forwarding too many requests');
        }
        inFlight += 1;
        try {
          const status = await forward(deps.proxy, req, reply, route, req.params.id, req.sessionTeam ?? '');
          counted.add(req);
          deps.metrics.requests.inc({ route: route.name, status: String(status) });
        } catch (err) {
          if (err instanceof SpaceError && err.code === 'NODE_UNAVAILABLE') {
            req.log.warn(
              { [F.sandboxId]: req.params.id, [F.nodeId]: err.details?.['nodeId'], err: err.cause },
              'node unavailable',
            );
          }
          throw err;
        } finally {
          inFlight -= 1;
        }
      },
    });
  }
  // the E2B SDK's envd protocol (Connect services, /files, /health), translated onto the agents
  installEnvd(app, deps);
  // servers listening in sandboxes (`<port>-<id>.<domain>`), WebSockets included
  installPorts(app, deps);
  // refusals (token, lookup, node) are answered by the error handler: count them here
  app.addHook('onResponse', async (req, reply) => {
    const route = req.routeOptions.config.dataPlane;
    if (route && !counted.has(req)) {
      deps.metrics.requests.inc({ route: route.name, status: String(reply.statusCode) });
    }
  });
  return app;
}
