/** GET /v1/operations/:id with optional long-poll (`?waitMs=`). */
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox';
import { Type } from '@sinclair/typebox';
import { SpaceError } from '../../core/errors.ts';
import type { ApiDeps } from '../app.ts';
import { operationToPublic } from '../operations.ts';
import { ErrorSchema, IdParams, OperationSchema, WaitQuery } from '../schemas.ts';

export function operationRoutes(deps: ApiDeps): FastifyPluginAsyncTypebox {
  return async (app) => {
    app.get(
      '/v1/operations/:id',
      {
        schema: {
          summary: 'Get an operation; with waitMs, wait until it ends or the time passes',
          params: IdParams,
          querystring: WaitQuery,
          response: { 200: Type.Ref(OperationSchema), 400: ErrorSchema, 401: ErrorSchema, 404: ErrorSchema },
        },
      },
      async (req) => {
        const waitMs = req.query.waitMs ?? 0;
        const op =
          waitMs > 0
            ? await deps.waiter.wait(req.params.id, waitMs)
            : await deps.operations.get(req.params.id);
        if (!op) throw new SpaceError('OPERATION_NOT_FOUND', `no operation ${req.params.id}`);
        return operationToPublic(op);
      },
    );
  };
}
