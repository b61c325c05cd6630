/**
 * The node agent as a Fastify app (never listens itself): internal dispatch routes for the API,
 * the data plane for clients, health and metrics. `server.ts` wires driver, network, warm pool,
 * registry and listens.
 */
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import fastify, { type FastifyBaseLogger, type FastifyInstance } from 'fastify';
import type { Logger } from 'pino';
import { Counter, Gauge, Registry } from 'prom-client';
import { buildVersion } from '../core/build-version.ts';
import { DATA_PLANE_JSON_BODY_LIMIT } from '../core/data-plane.ts';
import { acceptEmptyBodies, clientErrorHandler, installErrorHandlers } from '../core/http-errors.ts';
import { requestLogOptions } from '../core/http-log.ts';
import type { VerifyKey } from '../core/tokens.ts';
import { installValidators } from '../core/validation.ts';
import type { TeamStreams } from './commands/team-streams.ts';
import type { AgentConfig } from './config.ts';
import type { DiskGuard } from './host/disk-headroom.ts';
import type { WarmPool } from './instances/warm-pool.ts';
import type { AgentReconciler } from './reconcile.ts';
import { dataPlaneRoutes } from './routes/data-plane.ts';
import { internalRoutes } from './routes/internal.ts';
import { installPortTunnels } from './routes/ports.ts';
import type { ActivityMeter } from './sandboxes/activity.ts';
import type { SandboxManager } from './sandboxes/manager.ts';

/** Everything the agent's routes use. */
export interface AgentDeps {
  config: AgentConfig;
  log: Logger;
  verifyKey: VerifyKey;
  sandboxes: SandboxManager;
  warm: WarmPool | null;
  /** Activity metering of this node's sandboxes (its closed intervals feed a counter). */
  activity?: ActivityMeter;
  /** The node's reconciliation with the control plane (its counter is served at /metrics). */
  reconciler?: AgentReconciler;
  /** Counts each team's open command streams against its quota (absent: not counted). */
  teamStreams?: TeamStreams;
  /** The state disk's headroom (its gauges; absent: not served). */
  disk?: DiskGuard;
}

/** Builds the agent app (not listening). */
export async function buildAgentApp(deps: AgentDeps): Promise<FastifyInstance> {
  const app = fastify({
    loggerInstance: deps.log as FastifyBaseLogger,
    bodyLimit: DATA_PLANE_JSON_BODY_LIMIT,
    // SSE streams and uploads can last long; requests are bounded by their own limits
    requestTimeout: 0,
    // hijacked SSE responses are not idle connections: close them all on shutdown
    forceCloseConnections: true,
    // a request the HTTP parser refuses (431 headers too large, …) gets the error envelope too
    clientErrorHandler,
    ...requestLogOptions(),
  }).withTypeProvider<TypeBoxTypeProvider>();
  // a guest that does not answer because its sandbox died answers SANDBOX_CRASHED at once (R13)
  installErrorHandlers(app, async (err, req) => {
    const id = (req.params as { id?: unknown } | undefined)?.id;
    return typeof id === 'string' ? deps.sandboxes.guestFailed(id, err) : err;
  });
  acceptEmptyBodies(app);
  installValidators(app);

  const registry = new Registry();
  new Gauge({
    name: 'space_agent_sandboxes',
    help: 'Sandboxes on this node.',
    registers: [registry],
    collect() {
      this.set(deps.sandboxes.size);
    },
  });
  const usage = new Counter({
    name: 'space_agent_usage_seconds_total',
    help: 'Sandbox time this node metered, by activity state (active, idle; paused time is metered by the API).',
    labelNames: ['state'],
    registers: [registry],
  });
  deps.activity?.observe((state, ms) => usage.inc({ state }, ms / 1000));
  new Gauge({
    name: 'space_agent_streams',
    help: 'Open data-plane streams (SSE) over all sandboxes; 0 when no client is connected.',
    registers: [registry],
    collect() {
      this.set(deps.sandboxes.list().reduce((n, sb) => n + sb.streams, 0));
    },
  });
  new Gauge({
    name: 'space_agent_warm_slots',
    help: 'Ready warm-pool slots per template.',
    labelNames: ['template'],
    registers: [registry],
    collect() {
      for (const [t, n] of Object.entries(deps.warm?.counts() ?? {})) this.set({ template: t }, n);
    },
  });
  new Gauge({
    name: 'space_agent_warm_target',
    help: "Slots each template's warm pool aims to hold now (grows with recent creates, bounded by memory).",
    labelNames: ['template'],
    registers: [registry],
    collect() {
      for (const [t, n] of Object.entries(deps.warm?.targets() ?? {})) this.set({ template: t }, n);
    },
  });
  new Gauge({
    name: 'space_agent_instance_starts',
    help: 'Instance starts (boots and snapshot restores) at the start gate, by kind (create, refill) and state (running, waiting).',
    labelNames: ['kind', 'state'],
    registers: [registry],
    collect() {
      const st = deps.sandboxes.startStats();
      for (const state of ['running', 'waiting'] as const) {
        for (const kind of ['create', 'refill'] as const) this.set({ kind, state }, st[state][kind]);
      }
    },
  });

  const disk = deps.disk;
  if (disk) {
    const gauge = (name: string, help: string, value: (h: NonNullable<DiskGuard['last']>) => number) =>
      new Gauge({
        name,
        help,
        registers: [registry],
        // the reading the heartbeat interval takes (service.ts): a scrape does no I/O
        collect() {
          const h = disk.last;
          if (h) this.set(value(h));
        },
      });
    gauge(
      'space_agent_state_disk_free_bytes',
      'Bytes free (to the agent) on the state directory’s file system.',
      (h) => h.freeBytes,
    );
    gauge(
      'space_agent_state_disk_total_bytes',
      'Size of the state directory’s file system, bytes.',
      (h) => h.totalBytes,
    );
    gauge(
      'space_agent_state_disk_pressure',
      '1 while the state disk is under its floor (SPACE_DISK_RESERVE_*): the node takes no new sandboxes.',
      (h) => (h.pressure ? 1 : 0),
    );
  }

  if (deps.reconciler) registry.registerMetric(deps.reconciler.metric);

  app.get('/healthz', async () => ({ ok: true, version: buildVersion() }));
  app.get('/readyz', async () => ({ ok: true, sandboxes: deps.sandboxes.size }));
  app.get('/metrics', async (_req, reply) => reply.type(registry.contentType).send(await registry.metrics()));
  await app.register(internalRoutes(deps));
  await app.register(dataPlaneRoutes(deps));
  // the router's tunnels to servers in sandboxes (upgrades, outside the routes above)
  const tunnels = installPortTunnels(app.server, deps);
  app.addHook('preClose', async () => tunnels.closeAll());
  return app;
}
