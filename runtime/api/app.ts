/**
 * The control-plane API as a Fastify app. `buildApp(deps)` never listens (tests use inject());
 * `server.ts` wires config, logger and clients and listens. The operation worker and the reaper
 * run beside the app (see `createApiRuntime`), in every replica.
 */
import swagger from '@fastify/swagger';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import fastify, { type FastifyBaseLogger, type FastifyInstance } from 'fastify';
import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import { ErrorSchema, OperationSchema, SandboxSchema } from '../core/api-schemas.ts';
import { buildVersion } from '../core/build-version.ts';
import { SpaceError } from '../core/errors.ts';
import { acceptEmptyBodies, clientErrorHandler, installErrorHandlers } from '../core/http-errors.ts';
import { requestLogOptions } from '../core/http-log.ts';
import { awaitReplicas } from '../core/replica-ack.ts';
import type { SigningKey } from '../core/tokens.ts';
import { installValidators } from '../core/validation.ts';
import { AgentClient } from './agent-client.ts';
import { ApiKeyStore } from './api-keys.ts';
import { AuditLog } from './audit.ts';
import { installAuth } from './auth.ts';
import { type ApiConfig, defaultQuotas } from './config.ts';
import { CredentialStore } from './credential-store.ts';
import { DeploymentStore } from './deployment-store.ts';
import { e2bNotFoundBody, e2bRoutes } from './e2b/routes.ts';
import { lifecycleHandlers } from './lifecycle.ts';
import { type ApiMetrics, createApiMetrics } from './metrics.ts';
import { NodeStore, readyTemplates } from './node-store.ts';
import { OperationStore, OperationWaiter, OperationWorker } from './operations.ts';
import { Reaper } from './reaper.ts';
import { Reconciler } from './reconciler.ts';
import { type ScriptedRedis, withScripts } from './redis-scripts.ts';
import { auditRoutes } from './routes/audit.ts';
import { commandRoutes } from './routes/commands.ts';
import { credentialRoutes } from './routes/credentials.ts';
import { deploymentRoutes } from './routes/deployment.ts';
import { keyRoutes } from './routes/keys.ts';
import { nodeRoutes } from './routes/nodes.ts';
import { operationRoutes } from './routes/operations.ts';
import { sandboxRoutes } from './routes/sandboxes.ts';
import { teamRoutes } from './routes/teams.ts';
import { usageRoutes } from './routes/usage.ts';
import { type SandboxRecord, SandboxStore } from './sandbox-store.ts';
import { TeamStore } from './teams.ts';
import { UsageReader } from './usage.ts';

/** Everything handlers use; built once per process by {@link createApiDeps}. */
export interface ApiDeps {
  config: ApiConfig;
  log: Logger;
  redis: ScriptedRedis;
  signingKey: SigningKey;
  sandboxes: SandboxStore;
  operations: OperationStore;
  waiter: OperationWaiter;
  nodes: NodeStore;
  agents: AgentClient;
  credentials: CredentialStore;
  apiKeys: ApiKeyStore;
  teams: TeamStore;
  audit: AuditLog;
  deployment: DeploymentStore;
  usage: UsageReader;
  metrics: ApiMetrics;
  /** Templates ready on some alive node. */
  templates(): Promise<Set<string>>;
  /**
   * Sandbox `id` of team `team`, or SANDBOX_NOT_FOUND — also when it is another team's (the
   * answer never says that it exists).
   */
  requireSandbox(id: string, team: string): Promise<SandboxRecord>;
}

/** Builds the deps from config, a Redis connection, a second one for pub/sub, and the signing key. */
export function createApiDeps(o: {
  config: ApiConfig;
  log: Logger;
  redis: Redis;
  subscriber: Redis;
  signingKey: SigningKey;
}): ApiDeps {
  const redis = withScripts(o.redis);
  const sandboxes = new SandboxStore(redis);
  const operations = new OperationStore(redis);
  const nodes = new NodeStore(redis);
  return {
    config: o.config,
    log: o.log,
    redis,
    signingKey: o.signingKey,
    sandboxes,
    operations,
    waiter: new OperationWaiter(o.subscriber, operations),
    nodes,
    agents: new AgentClient(o.signingKey, o.config.dispatchTimeoutMs),
    credentials: new CredentialStore(redis),
    apiKeys: new ApiKeyStore(redis),
    teams: new TeamStore(redis, defaultQuotas(o.config)),
    audit: new AuditLog(redis, o.log.child({ component: 'audit' }), {
      retentionSec: o.config.auditRetentionSec,
      maxEntries: o.config.auditMaxEntries,
    }),
    deployment: new DeploymentStore(redis),
    usage: new UsageReader(redis),
    metrics: createApiMetrics(),
    templates: async () => readyTemplates(await nodes.list()),
    async requireSandbox(id, team) {
      const rec = await sandboxes.get(id);
      if (!rec || rec.team !== team) {
        throw new SpaceError('SANDBOX_NOT_FOUND', `no sandbox ${id}`, { sandboxId: id });
      }
      return rec;
    },
  };
}

/** The Fastify app (not listening). */
export async function buildApp(
  deps: ApiDeps,
  opts: { tls?: { cert: Buffer; key: Buffer } } = {},
): Promise<FastifyInstance> {
  const common = {
    loggerInstance: deps.log as FastifyBaseLogger,
    bodyLimit: deps.config.bodyLimitBytes,
    // a request the HTTP parser refuses (431 headers too large, …) gets the error envelope too
    clientErrorHandler,
    ...requestLogOptions(),
  };
  // HTTPS (HTTP/1.1) when given a certificate: the API's own TLS, as the router's (docs/deployment.md "TLS")
  const app = (
    (opts.tls ? fastify({ ...common, https: opts.tls }) : fastify(common)) as unknown as FastifyInstance
  ).withTypeProvider<TypeBoxTypeProvider>();
  installErrorHandlers(app, undefined, e2bNotFoundBody);
  acceptEmptyBodies(app);
  installValidators(app);
  await app.register(swagger, {
    openapi: {
      info: {
        title: 'SPACE API',
        version: 'v1',
        description: 'Control plane of the SPACE sandbox platform.',
      },
      components: { securitySchemes: { apiKey: { type: 'http', scheme: 'bearer' } } },
      security: [{ apiKey: [] }],
    },
  });
  app.addSchema(SandboxSchema);
  app.addSchema(OperationSchema);
  app.addSchema(ErrorSchema);

  // keys and scopes on every route but the public ones; E2B routes authenticate with X-API-KEY in
  // their own hook (e2b/routes.ts); every mutating call is audited
  const auth = installAuth(app, deps);
  app.addHook('onResponse', async (req, reply) => {
    const route = req.routeOptions.url ?? 'unmatched';
    deps.metrics.requests.inc({ method: req.method, route, status: String(reply.statusCode) });
    deps.metrics.requestDuration.observe({ method: req.method, route }, reply.elapsedTime / 1000);
  });

  installReplicaAck(app, deps);

  const open = { schema: { hide: true }, config: { public: true } };
  // the build that answers: a version bump is seen reaching each API
  app.get('/healthz', open, async () => ({ ok: true, version: buildVersion() }));
  app.get('/readyz', open, async (_req, reply) => {
    try {
      await deps.redis.ping();
      return { ok: true };
    } catch {
      return reply.status(503).send(new SpaceError('INTERNAL', 'redis is not reachable').toBody());
    }
  });
  app.get('/metrics', open, async (_req, reply) =>
    reply.type(deps.metrics.registry.contentType).send(await deps.metrics.registry.metrics()),
  );
  app.get('/openapi.json', open, async () => app.swagger());

  await app.register(sandboxRoutes(deps));
  await app.register(operationRoutes(deps));
  await app.register(commandRoutes(deps));
  await app.register(nodeRoutes(deps));
  await app.register(deploymentRoutes(deps));
  await app.register(credentialRoutes(deps));
  await app.register(usageRoutes(deps));
  await app.register(keyRoutes(deps));
  await app.register(teamRoutes(deps));
  await app.register(auditRoutes(deps));
  await app.register(e2bRoutes(deps));
  auth.check();
  return app;
}

const CHANGING = new Set(['POST', 'PUT', 'PATCH', 'DELETE']);

/**
 * With `SPACE_REDIS_WAIT_REPLICAS` > 0: before a changing request (POST, PUT, PATCH, DELETE) is
 * answered, the replicas acknowledge every write the API's connection made so far
 * (`core/replica-ack.ts`), so a 2xx survives a failover that comes after it. When they do not,
 * the answer becomes 503 `WRITE_NOT_REPLICATED` (the change is on the primary: the client reads
 * it back or retries; creates, deletes, pauses and resumes are safe to repeat by id).
 */
function installReplicaAck(app: FastifyInstance, deps: ApiDeps): void {
  const ack = { replicas: deps.config.redisWaitReplicas, timeoutMs: deps.config.redisWaitTimeoutMs };
  if (ack.replicas <= 0) return;
  app.addHook('onSend', async (req, reply, payload) => {
    if (!CHANGING.has(req.method) || reply.statusCode >= 500) return payload;
    try {
      await awaitReplicas(deps.redis, ack);
      return payload;
    } catch (err) {
      const known =
        err instanceof SpaceError
          ? err
          : new SpaceError(
              'CONTROL_PLANE_UNAVAILABLE',
              'the control plane’s store (Redis) cannot be reached right now; retry shortly',
              undefined,
              { cause: err },
            );
      req.log.warn(
        { code: known.code, msg: known.message, status: reply.statusCode },
        'answer withheld: write not replicated',
      );
      (payload as { destroy?: () => void } | null)?.destroy?.();
      reply
        .code(known.status)
        .header('content-type', 'application/json; charset=utf-8')
        .header('retry-after', '2');
      return JSON.stringify(known.toBody());
    }
  });
}

/** The background parts of an API process: operation worker and lifetime reaper. */
export function createApiRuntime(deps: ApiDeps, workerConnection: Redis) {
  const worker = new OperationWorker({
    connection: workerConnection,
    store: deps.operations,
    handlers: lifecycleHandlers({
      sandboxes: deps.sandboxes,
      credentials: deps.credentials,
      nodes: deps.nodes,
      agents: deps.agents,
      log: deps.log,
      pause: {
        mode: deps.config.pauseMode,
        hibernateAbovePercent: deps.config.hibernateAbovePercent,
        retentionSec: deps.config.pausedRetentionSec,
      },
      onUsage: (state, ms) => deps.metrics.usageSeconds.inc({ state }, ms / 1000),
      onLifecycle: (kind, mode, ok, ms) =>
        deps.metrics.lifecycleDuration.observe({ kind, mode, result: ok ? 'ok' : 'failed' }, ms / 1000),
    }),
    log: deps.log.child({ component: 'worker' }),
    concurrency: deps.config.workerConcurrency,
    replicaAck: { replicas: deps.config.redisWaitReplicas, timeoutMs: deps.config.redisWaitTimeoutMs },
    onStoreOutage: () => deps.nodes.outage.down(),
  });
  const log = deps.log.child({ component: 'reaper' });
  // the worker's connection tells of outages too: the create it runs again after one reads nodes
  // through the same rule (store-outage.ts)
  deps.nodes.outage.watch(workerConnection);
  const reconciler = new Reconciler(
    deps.sandboxes,
    deps.operations,
    log,
    deps.config.nodeLostGraceMs,
    deps.nodes.outage,
  );
  const reaper = new Reaper(deps.sandboxes, log, deps.config.reaperIntervalMs, reconciler);
  return {
    async start() {
      await worker.start();
      reaper.start();
    },
    async stop() {
      await reaper.stop();
      await worker.stop();
      await deps.waiter.close();
    },
  };
}
