/**
 * Routes of /v1/sandboxes: create (202 + operation; with `?waitMs=`, answered once the operation
 * ends), list, get, delete, pause and resume (→ operation), timeout, egress, usage.
 */

import { createHash } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox';
import { Type } from '@sinclair/typebox';
import type { FastifyRequest } from 'fastify';
import { isDriverName, shapeProblem } from '../../core/drivers.ts';
import { EgressPolicySchema, normalisePolicy } from '../../core/egress.ts';
import { SpaceError } from '../../core/errors.ts';
import { newId, newSandboxId } from '../../core/ids.ts';
import { nullable } from '../../core/json-schema.ts';
import { requestLifecycle } from '../../core/lifecycle-requests.ts';
import { F } from '../../core/log-fields.ts';
import { IDEMPOTENCY_TTL_SEC, keys } from '../../core/redis-keys.ts';
import { inSpan, traceContextFrom } from '../../core/tracing.ts';
import type { Operation, Sandbox, SandboxState } from '../../core/types.ts';
import type { ApiDeps } from '../app.ts';
import { principalOf } from '../auth.ts';
import { allowCredentialHosts } from '../credential-store.ts';
import { parseV1MetadataQuery } from '../metadata-filter.ts';
import { knownTemplates, readyTemplates } from '../node-store.ts';
import { type DraftOperation, type OperationRecord, operationToPublic } from '../operations.ts';
import { type SandboxRecord, toPublic } from '../sandbox-store.ts';
import {
  CreateSandboxBody,
  ErrorSchema,
  IdParams,
  ListSandboxesQuery,
  OperationSchema,
  PauseBody,
  SandboxAndOperation,
  SandboxSchema,
  SandboxUsageSchema,
  TimeoutBody,
  WaitQuery,
} from '../schemas.ts';
import { sandboxUsage } from '../usage.ts';

const errors = {
  400: ErrorSchema,
  401: ErrorSchema,
  403: ErrorSchema,
  404: ErrorSchema,
  409: ErrorSchema,
  422: ErrorSchema,
  429: ErrorSchema,
};

/** Canonical JSON (sorted keys) so the same body always hashes the same. */
function canonical(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(canonical).join(',')}]`;
  if (v && typeof v === 'object') {
    return `{${Object.keys(v)
      .sort()
      .map((k) => `${JSON.stringify(k)}:${canonical((v as Record<string, unknown>)[k])}`)
      .join(',')}}`;
  }
  return JSON.stringify(v);
}

export function sandboxRoutes(deps: ApiDeps): FastifyPluginAsyncTypebox {
  return async (app) => {
    app.post(
      '/v1/sandboxes',
      {
        config: { scope: 'sandboxes:write' },
        schema: {
          summary:
            'Create a sandbox (asynchronous); with waitMs, answer once its create operation ends or the time passes',
          querystring: WaitQuery,
          headers: Type.Object({
            'idempotency-key': Type.Optional(Type.String({ minLength: 1, maxLength: 128 })),
          }),
          body: CreateSandboxBody,
          response: { 202: SandboxAndOperation, ...errors },
        },
      },
      async (req, reply) =>
        inSpan(
          'api.sandboxes.create',
          {},
          async () => {
            const body = req.body;
            const who = principalOf(req);
            const waitMs = req.query.waitMs ?? 0;
            // subscribed before the records are written, so no finish can be missed
            if (waitMs > 0) await deps.waiter.subscribed();
            // the team's quotas are read beside the node list: one Redis round trip, not two
            const quotasRead = deps.teams.quotas(who.team);
            quotasRead.catch(() => {}); // awaited below; a refusal on the template must not leave it unhandled
            const all = await inSpan('redis.nodes.list', {}, () => deps.nodes.list());
            const templates = readyTemplates(all);
            if (!templates.has(body.template)) {
              // transient states get retryable codes: a template some node holds but no live node
              // serves now is not ready; with no live node at all, nothing can be said about it
              if (knownTemplates(all).has(body.template)) {
                throw new SpaceError(
                  'TEMPLATE_NOT_READY',
                  `template "${body.template}" has no live node right now`,
                  {
                    template: body.template,
                  },
                );
              }
              if (!all.some((n) => n.alive)) {
                throw new SpaceError('NODE_UNAVAILABLE', 'no node is heartbeating right now', {
                  template: body.template,
                });
              }
              throw new SpaceError(
                'TEMPLATE_NOT_FOUND',
                `no template "${body.template}" on any available node`,
                {
                  template: body.template,
                  known: [...templates].sort(),
                },
              );
            }
            const nodes = all.filter((n) => n.alive && n.schedulable);
            const vcpus = body.vcpus ?? 1;
            const memoryMiB = body.memoryMiB ?? 512;
            if (nodes.length > 0 && !nodes.some((n) => n.vcpus >= vcpus && n.memoryMiB >= memoryMiB)) {
              // no node could ever hold it, however empty: a 4xx that names what is on offer, not a
              // retryable 503 (R25); a shape some node holds but not now stays NODE_CAPACITY_EXHAUSTED
              const largest = largestShapes(nodes);
              const offer = largest.map((n) => `${n.vcpus} vCPU / ${n.memoryMiB} MiB`).join(', ');
              throw new SpaceError(
                'SHAPE_TOO_LARGE',
                `no node is large enough for ${vcpus} vCPU / ${memoryMiB} MiB; the largest on offer: ${offer}`,
                { vcpus, memoryMiB, largest },
              );
            }
            const able = nodes.filter((n) => n.templates.includes(body.template));
            const problems = able.flatMap((n) => {
              const why = isDriverName(n.driver)
                ? shapeProblem(n.driver, { vcpus, memoryMiB })
                : `unknown driver ${n.driver}`;
              return why ? [why] : [];
            });
            if (able.length > 0 && problems.length === able.length) {
              // every node that could hold the template runs a driver that cannot run this shape
              throw new SpaceError('SHAPE_UNSUPPORTED', [...new Set(problems)].join('; '), {
                vcpus,
                memoryMiB,
                drivers: [...new Set(able.map((n) => n.driver))].sort(),
              });
            }
            const timeoutSec = body.timeoutSec ?? deps.config.defaultTimeoutSec;
            if (timeoutSec > deps.config.maxTimeoutSec) {
              throw new SpaceError('BAD_REQUEST', `timeoutSec must be at most ${deps.config.maxTimeoutSec}`);
            }
            // validate everything before anything is written: bad input loses nothing
            // only the team's own credentials can be granted (another team's name is not found)
            const grants = await deps.credentials.grant(who.team, body.credentials ?? []);
            const quotas = await quotasRead;
            const egress = allowCredentialHosts(normalisePolicy(body.egress), grants);
            const sandboxId = newSandboxId();
            const idemKey = req.headers['idempotency-key'];
            if (idemKey) {
              const key = keys.idempotency(who.team, idemKey);
              const bodyHash = createHash('sha256').update(canonical(body)).digest('hex');
              const won = await deps.redis.set(
                key,
                JSON.stringify({ bodyHash, sandboxId }),
                'EX',
                IDEMPOTENCY_TTL_SEC,
                'NX',
              );
              if (won !== 'OK') {
                const prior = JSON.parse((await deps.redis.get(key)) ?? '{}') as {
                  bodyHash?: string;
                  sandboxId?: string;
                  operationId?: string;
                };
                if (prior.bodyHash !== bodyHash) {
                  throw new SpaceError(
                    'IDEMPOTENCY_CONFLICT',
                    'Idempotency-Key was used with a different body',
                  );
                }
                // the first request may still be writing its records: wait briefly for them
                for (let i = 0; i < 50; i++) {
                  const cur = JSON.parse((await deps.redis.get(key)) ?? '{}') as typeof prior;
                  const sb = cur.sandboxId ? await deps.sandboxes.get(cur.sandboxId) : null;
                  const op = cur.operationId ? await deps.operations.get(cur.operationId) : null;
                  if (sb && op) return reply.status(202).send(await settled(sb, op));
                  await sleep(20);
                }
                throw new SpaceError(
                  'INTERNAL',
                  'the first request with this Idempotency-Key did not finish',
                );
              }
              let made: Awaited<ReturnType<typeof createRecords>>;
              try {
                made = await createRecords(sandboxId);
              } catch (err) {
                // refused (a quota): the key may be used again with a body that fits
                await deps.redis.del(key);
                throw err;
              }
              const { sandbox, operation } = made;
              await deps.redis.set(
                key,
                JSON.stringify({ bodyHash, sandboxId, operationId: operation.id }),
                'EX',
                IDEMPOTENCY_TTL_SEC,
              );
              return reply.status(202).send(await settled(sandbox, operation));
            }
            const made = await createRecords(sandboxId);
            return reply.status(202).send(await settled(made.sandbox, made.operation));

            /**
             * The answer: the records as written, or with `waitMs`, as they are once the create
             * operation has ended (or the wait has passed). One request instead of create + long-poll.
             */
            async function settled(
              sb: SandboxRecord,
              op: OperationRecord,
            ): Promise<{ sandbox: Sandbox; operation: Operation }> {
              // the waiter answers at once for an operation that has ended already (a replay)
              const ended =
                waitMs > 0
                  ? await inSpan('api.operation.wait', {}, () => deps.waiter.wait(op.id, waitMs, op))
                  : op;
              if (!ended || ended === op) return { sandbox: toPublic(sb), operation: operationToPublic(op) };
              const now = (await deps.sandboxes.get(sb.id)) ?? sb;
              return { sandbox: toPublic(now), operation: operationToPublic(ended) };
            }

            async function createRecords(id: string) {
              req.auditTarget = id;
              // the sandbox and its create operation are written in one step (admit.lua); the
              // operation carries this span's context, so the worker's spans join the trace here
              let create: DraftOperation | undefined;
              const rec = await inSpan('redis.sandbox.create', {}, () => {
                create = deps.operations.draft('sandbox.create', id, {}, who.team);
                return deps.sandboxes.create(
                  {
                    id,
                    template: body.template,
                    vcpus: body.vcpus ?? 1,
                    memoryMiB: body.memoryMiB ?? 512,
                    timeoutSec,
                    autoPauseSec: body.autoPauseSec ?? deps.config.defaultAutoPauseSec,
                    apiKey: who.keyId,
                    team: who.team,
                    metadata: body.metadata ?? {},
                    // the sandbox sees placeholders, never credential values
                    env: {
                      ...(body.env ?? {}),
                      ...Object.fromEntries(grants.map((g) => [g.envVar, g.placeholder])),
                    },
                    sessionId: newId('ses'),
                    egress,
                    grants,
                  },
                  quotas,
                  Date.now(),
                  create,
                );
              });
              const op = create!.record;
              deps.metrics.sandboxesCreated.inc({ template: body.template });
              req.log.info(
                { [F.sandboxId]: id, [F.operationId]: op.id, [F.templateId]: body.template },
                'sandbox accepted',
              );
              return { sandbox: rec, operation: op };
            }
          },
          traceContextFrom(req.headers),
        ),
    );

    app.get(
      '/v1/sandboxes',
      {
        config: { scope: 'sandboxes:read' },
        schema: {
          summary: 'List the team’s sandboxes, newest first',
          querystring: ListSandboxesQuery,
          response: {
            200: Type.Object({
              sandboxes: Type.Array(Type.Ref(SandboxSchema)),
              nextCursor: nullable(Type.String()),
            }),
            ...errors,
          },
        },
      },
      async (req) => {
        const q = req.query;
        // every pair must match; a key with two values is refused, never reduced to one (R26)
        const metadata = q.metadata ? parseV1MetadataQuery(q.metadata) : undefined;
        const page = await deps.sandboxes.list({
          limit: q.limit ?? 100,
          cursor: q.cursor,
          state: q.state ? (q.state.split(',') as SandboxState[]) : undefined,
          metadata,
          team: principalOf(req).team,
        });
        return { sandboxes: page.sandboxes.map(toPublic), nextCursor: page.nextCursor };
      },
    );

    app.get(
      '/v1/sandboxes/:id',
      {
        config: { scope: 'sandboxes:read' },
        schema: {
          summary: 'Get a sandbox',
          params: IdParams,
          response: { 200: Type.Ref(SandboxSchema), ...errors },
        },
      },
      async (req) => toPublic(await deps.requireSandbox(req.params.id, principalOf(req).team)),
    );

    app.delete(
      '/v1/sandboxes/:id',
      {
        config: { scope: 'sandboxes:write' },
        schema: {
          summary: 'Kill a sandbox (asynchronous)',
          params: IdParams,
          response: { 202: Type.Object({ operation: Type.Ref(OperationSchema) }), ...errors },
        },
      },
      async (req, reply) => {
        const rec = await deps.requireSandbox(req.params.id, principalOf(req).team);
        // a repeated DELETE answers with the operation already under way (or done)
        const prior = await deps.redis.hget(keys.sandbox(rec.id), 'deleteOperationId');
        const priorOp = prior ? await deps.operations.get(prior) : null;
        if (priorOp && priorOp.state !== 'failed')
          return reply.status(202).send({ operation: operationToPublic(priorOp) });
        const op = await deps.operations.enqueue('sandbox.delete', rec.id, { reason: 'request' }, rec.team);
        await deps.redis.hset(keys.sandbox(rec.id), 'deleteOperationId', op.id);
        return reply.status(202).send({ operation: operationToPublic(op) });
      },
    );

    /** Asks for a pause/resume (sharing one already under way) and answers with its operation. */
    async function askLifecycle(
      kind: 'sandbox.pause' | 'sandbox.resume',
      id: string,
      mode: string | undefined,
      req: FastifyRequest,
    ) {
      const log = req.log;
      const rec = await deps.requireSandbox(id, principalOf(req).team);
      const args: Record<string, string> = { reason: 'request' };
      if (mode) args.mode = mode;
      const asked = await requestLifecycle(deps.redis, kind, rec.id, args);
      const op = await deps.operations.get(asked.operationId);
      if (!op) throw new SpaceError('INTERNAL', `operation ${asked.operationId} vanished`);
      log.info(
        { [F.sandboxId]: rec.id, [F.operationId]: op.id, shared: !asked.created },
        kind === 'sandbox.pause' ? 'pause requested' : 'resume requested',
      );
      return { operation: operationToPublic(op) };
    }

    app.post(
      '/v1/sandboxes/:id/pause',
      {
        config: { scope: 'sandboxes:write' },
        schema: {
          summary:
            'Pause a sandbox (asynchronous): files, processes, listening sockets and command output are kept; its running lifetime stops',
          params: IdParams,
          body: Type.Optional(PauseBody),
          response: { 202: Type.Object({ operation: Type.Ref(OperationSchema) }), ...errors },
        },
      },
      async (req, reply) =>
        reply.status(202).send(await askLifecycle('sandbox.pause', req.params.id, req.body?.mode, req)),
    );

    app.post(
      '/v1/sandboxes/:id/resume',
      {
        config: { scope: 'sandboxes:write' },
        schema: {
          summary: 'Resume a paused sandbox (asynchronous); the router and new commands also resume it',
          params: IdParams,
          response: { 202: Type.Object({ operation: Type.Ref(OperationSchema) }), ...errors },
        },
      },
      async (req, reply) =>
        reply.status(202).send(await askLifecycle('sandbox.resume', req.params.id, undefined, req)),
    );

    app.get(
      '/v1/sandboxes/:id/usage',
      {
        config: { scope: 'sandboxes:read' },
        schema: {
          summary: 'Active, idle and paused time of a sandbox over its whole life (s, vCPU-s, GiB-s)',
          params: IdParams,
          response: { 200: SandboxUsageSchema, ...errors },
        },
      },
      async (req) => {
        const rec = await deps.requireSandbox(req.params.id, principalOf(req).team);
        return sandboxUsage(deps.redis, rec.id);
      },
    );

    app.patch(
      '/v1/sandboxes/:id/egress',
      {
        config: { scope: 'sandboxes:write' },
        schema: {
          summary:
            'Replace the egress policy of a running sandbox (connections it no longer allows are closed)',
          params: IdParams,
          body: EgressPolicySchema,
          response: { 200: Type.Ref(SandboxSchema), ...errors },
        },
      },
      async (req) => {
        const team = principalOf(req).team;
        const rec = await deps.requireSandbox(req.params.id, team);
        const egress = allowCredentialHosts(normalisePolicy(req.body), rec.grants);
        if (rec.state !== 'running' || !rec.nodeId) {
          throw new SpaceError('SANDBOX_NOT_RUNNING', `sandbox ${rec.id} is ${rec.state}`, {
            state: rec.state,
          });
        }
        const node = await deps.nodes.requireAlive(rec.nodeId);
        await deps.agents.updateEgress(node, rec.id, egress);
        await deps.sandboxes.setEgress(rec.id, egress);
        req.log.info({ [F.sandboxId]: rec.id, egress }, 'egress policy replaced');
        return toPublic(await deps.requireSandbox(rec.id, team));
      },
    );

    app.post(
      '/v1/sandboxes/:id/timeout',
      {
        config: { scope: 'sandboxes:write' },
        schema: {
          summary: 'Set the lifetime to timeoutSec from now',
          params: IdParams,
          body: TimeoutBody,
          response: { 200: Type.Ref(SandboxSchema), ...errors },
        },
      },
      async (req) => {
        if (req.body.timeoutSec > deps.config.maxTimeoutSec) {
          throw new SpaceError('BAD_REQUEST', `timeoutSec must be at most ${deps.config.maxTimeoutSec}`);
        }
        const team = principalOf(req).team;
        await deps.requireSandbox(req.params.id, team);
        const res = await deps.sandboxes.extend(req.params.id, req.body.timeoutSec);
        if (!res.ok) {
          if (res.current === null) throw new SpaceError('SANDBOX_NOT_FOUND', `no sandbox ${req.params.id}`);
          throw new SpaceError('SANDBOX_NOT_RUNNING', `sandbox ${req.params.id} is ${res.current}`, {
            state: res.current,
          });
        }
        return toPublic(await deps.requireSandbox(req.params.id, team));
      },
    );
  };
}

/**
 * The largest sandbox shapes `nodes` offer: each node's whole vCPUs and memory (MiB), keeping only
 * those no other node beats on both (a node with the most memory may have fewer vCPUs than another),
 * largest memory first. Pure.
 */
export function largestShapes(
  nodes: readonly { vcpus: number; memoryMiB: number }[],
): { vcpus: number; memoryMiB: number }[] {
  const shapes = [...new Map(nodes.map((n) => [`${n.vcpus}/${n.memoryMiB}`, n])).values()].map((n) => ({
    vcpus: n.vcpus,
    memoryMiB: n.memoryMiB,
  }));
  return shapes
    .filter(
      (a) =>
        !shapes.some(
          (b) =>
            b !== a &&
            b.vcpus >= a.vcpus &&
            b.memoryMiB >= a.memoryMiB &&
            (b.vcpus > a.vcpus || b.memoryMiB > a.memoryMiB),
        ),
    )
    .sort((a, b) => b.memoryMiB - a.memoryMiB || b.vcpus - a.vcpus);
}
