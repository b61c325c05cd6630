/**
 * GET /v1/operations/:id with optional long-poll (`?waitMs=`). An operation belongs to its
 * sandbox's team; another team's reads as OPERATION_NOT_FOUND (and is not waited on).
 */
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox';
import { Type } from '@sinclair/typebox';
import { ErrorSchema, IdParams, OperationSchema, WaitQuery } from '../../core/api-schemas.ts';
import { SpaceError } from '../../core/errors.ts';
import { DEFAULT_TEAM } from '../../core/tenancy.ts';
import type { ApiDeps } from '../app.ts';
import { principalOf } from '../auth.ts';
import { type OperationRecord, operationToPublic } from '../operations.ts';

export function operationRoutes(deps: ApiDeps): FastifyPluginAsyncTypebox {
  /** The operation's team: recorded on it, else its sandbox's (operations from before teams). */
  async function teamOf(op: OperationRecord): Promise<string> {
    return op.team ?? (await deps.sandboxes.get(op.target))?.team ?? DEFAULT_TEAM;
  }

  return async (app) => {
    app.get(
      '/v1/operations/:id',
      {
        config: { scope: 'sandboxes:read' },
        schema: {
          summary: 'Get an operation; with waitMs, wait until it ends or the time passes',
          params: IdParams,
          querystring: WaitQuery,
          response: {
            200: Type.Ref(OperationSchema),
            400: ErrorSchema,
            401: ErrorSchema,
            403: ErrorSchema,
            404: ErrorSchema,
          },
        },
      },
      async (req) => {
        const notFound = () => new SpaceError('OPERATION_NOT_FOUND', `no operation ${req.params.id}`);
        const team = principalOf(req).team;
        const waitMs = req.query.waitMs ?? 0;
        // subscribed before the read, so the waiter can start from it (OperationWaiter.wait)
        if (waitMs > 0) await deps.waiter.subscribed();
        // ownership first: another team's operation is neither shown nor waited on
        const first = await deps.operations.get(req.params.id);
        if (!first || (await teamOf(first)) !== team) throw notFound();
        const op = waitMs > 0 ? await deps.waiter.wait(req.params.id, waitMs, first) : first;
        if (!op) throw notFound();
        return operationToPublic(op);
      },
    );
  };
}
