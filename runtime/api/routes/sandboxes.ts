/**
 * Routes of /v1/sandboxes: create (202 + operation; with `?waitMs=`, answered once the operation
 * ends; 503 NODE_CAPACITY_EXHAUSTED with `Retry-After` when no node has room, after `?roomWaitMs=`
 * when asked), list, get, delete, pause and resume (→ operation), timeout, egress, usage.
 */

import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox';
import { Type } from '@sinclair/typebox';
import {
  CreateQuery,
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
} from '../../core/api-schemas.ts';
import { EgressPolicySchema } from '../../core/egress.ts';
import { nullable } from '../../core/json-schema.ts';
import { inSpan, traceContextFrom } from '../../core/tracing.ts';
import type { SandboxState } from '../../core/types.ts';
import type { ApiDeps } from '../app.ts';
import { principalOf } from '../auth.ts';
import { parseV1MetadataQuery } from '../metadata-filter.ts';
import { operationToPublic } from '../operations.ts';
import { toPublic } from '../sandbox-store.ts';
import { createSandbox } from '../usecases/create.ts';
import { deleteSandbox } from '../usecases/delete.ts';
import { replaceEgress } from '../usecases/egress.ts';
import { pauseSandbox } from '../usecases/pause.ts';
import { resumeSandbox } from '../usecases/resume.ts';
import { setSandboxTimeout } from '../usecases/timeout.ts';

const errors = {
  400: ErrorSchema,
  401: ErrorSchema,
  403: ErrorSchema,
  404: ErrorSchema,
  409: ErrorSchema,
  422: ErrorSchema,
  429: ErrorSchema,
};

export function sandboxRoutes(deps: ApiDeps): FastifyPluginAsyncTypebox {
  return async (app) => {
    app.post(
      '/v1/sandboxes',
      {
        config: { scope: 'sandboxes:write' },
        schema: {
          summary:
            'Create a sandbox (asynchronous); with waitMs, answer once its create operation ends or the time passes',
          querystring: CreateQuery,
          headers: Type.Object({
            'idempotency-key': Type.Optional(Type.String({ minLength: 1, maxLength: 128 })),
          }),
          body: CreateSandboxBody,
          response: { 202: SandboxAndOperation, ...errors, 503: ErrorSchema },
        },
      },
      async (req, reply) =>
        inSpan(
          'api.sandboxes.create',
          {},
          async () =>
            reply.status(202).send(
              await createSandbox(deps, {
                who: principalOf(req),
                body: req.body,
                waitMs: req.query.waitMs,
                roomWaitMs: req.query.roomWaitMs,
                idempotencyKey: req.headers['idempotency-key'],
                log: req.log,
                onTarget: (id) => {
                  req.auditTarget = id;
                },
              }),
            ),
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
      async (req, reply) =>
        reply.status(202).send({
          operation: operationToPublic(await deleteSandbox(deps, principalOf(req).team, req.params.id)),
        }),
    );

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
        reply.status(202).send({
          operation: operationToPublic(
            await pauseSandbox(deps, principalOf(req).team, req.params.id, req.body?.mode, req.log),
          ),
        }),
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
        reply.status(202).send({
          operation: operationToPublic(
            await resumeSandbox(deps, principalOf(req).team, req.params.id, req.log),
          ),
        }),
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
        return deps.usage.sandbox(rec.id);
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
      async (req) =>
        toPublic(await replaceEgress(deps, principalOf(req).team, req.params.id, req.body, req.log)),
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
      async (req) =>
        toPublic(await setSandboxTimeout(deps, principalOf(req).team, req.params.id, req.body.timeoutSec)),
    );
  };
}
