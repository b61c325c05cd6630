/** GET /v1/audit: the team's audit log, newest first (keys with `audit:read`). */
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox';
import { Type } from '@sinclair/typebox';
import { ErrorSchema } from '../../core/api-schemas.ts';
import { nullable, stringEnum } from '../../core/json-schema.ts';
import { TEAM_ID_PATTERN } from '../../core/tenancy.ts';
import type { ApiDeps } from '../app.ts';
import { actingTeam, principalOf } from '../auth.ts';

const AuditEntrySchema = Type.Object({
  id: Type.String(),
  at: Type.String(),
  team: Type.String(),
  keyId: Type.String(),
  action: Type.String(),
  target: Type.String(),
  result: stringEnum(['ok', 'denied', 'failed'] as const),
  status: Type.Integer(),
  code: nullable(Type.String()),
});

export function auditRoutes(deps: ApiDeps): FastifyPluginAsyncTypebox {
  return async (app) => {
    app.get(
      '/v1/audit',
      {
        config: { scope: 'audit:read' },
        schema: {
          summary: 'The team’s audit log (every mutating call: who, what, target, result), newest first',
          querystring: Type.Object({
            limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 1000 })),
            before: Type.Optional(
              Type.String({ description: 'Entry id: only older entries (the previous page’s nextCursor).' }),
            ),
            team: Type.Optional(Type.String({ pattern: TEAM_ID_PATTERN })),
          }),
          response: {
            200: Type.Object({
              entries: Type.Array(AuditEntrySchema),
              nextCursor: nullable(Type.String()),
            }),
            400: ErrorSchema,
            401: ErrorSchema,
            403: ErrorSchema,
          },
        },
      },
      async (req) =>
        deps.audit.list(actingTeam(principalOf(req), req.query.team), {
          limit: req.query.limit ?? 100,
          ...(req.query.before ? { before: req.query.before } : {}),
        }),
    );
  };
}
