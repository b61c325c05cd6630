/**
 * Teams (platform administration, `teams:admin`): create, list, get, and set quota overrides. A
 * team's own keys may read their team (`GET /v1/teams/:id` of their team needs no more than a key).
 */
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox';
import { Type } from '@sinclair/typebox';
import { ErrorSchema } from '../../core/api-schemas.ts';
import { nullable } from '../../core/json-schema.ts';
import { QUOTA_NAMES, TEAM_ID_PATTERN } from '../../core/tenancy.ts';
import type { ApiDeps } from '../app.ts';
import { actingTeam, principalOf } from '../auth.ts';

const Quotas = Type.Object(
  Object.fromEntries(QUOTA_NAMES.map((q) => [q, Type.Integer({ minimum: 0 })])) as Record<
    (typeof QUOTA_NAMES)[number],
    ReturnType<typeof Type.Integer>
  >,
);
const QuotaPatch = Type.Partial(
  Type.Object(
    Object.fromEntries(
      QUOTA_NAMES.map((q) => [q, nullable(Type.Integer({ minimum: 0 }))]),
    ) as unknown as Record<(typeof QUOTA_NAMES)[number], ReturnType<typeof Type.Integer>>,
  ),
  { additionalProperties: false },
);
const TeamSchema = Type.Object({
  id: Type.String(),
  createdAt: Type.String(),
  quotaOverrides: Type.Partial(Quotas),
  quotas: Quotas,
  reserved: Type.Optional(
    Type.Object({ sandboxes: Type.Number(), vcpus: Type.Number(), memoryMiB: Type.Number() }),
  ),
});
const TeamParams = Type.Object({ id: Type.String({ pattern: TEAM_ID_PATTERN }) });
const errors = { 400: ErrorSchema, 401: ErrorSchema, 403: ErrorSchema, 404: ErrorSchema, 409: ErrorSchema };

export function teamRoutes(deps: ApiDeps): FastifyPluginAsyncTypebox {
  return async (app) => {
    app.post(
      '/v1/teams',
      {
        config: { scope: 'teams:admin' },
        schema: {
          summary: 'Create a team (then `POST /v1/keys` with `team` gives it its first key)',
          body: Type.Object({
            id: Type.String({ pattern: TEAM_ID_PATTERN }),
            quotas: Type.Optional(Type.Partial(Quotas)),
          }),
          response: { 201: TeamSchema, ...errors },
        },
      },
      async (req, reply) => {
        req.auditTarget = req.body.id;
        const team = await deps.teams.create(req.body.id, req.body.quotas ?? {});
        req.log.info({ team: team.id }, 'team created');
        return reply.status(201).send(team);
      },
    );

    app.get(
      '/v1/teams',
      {
        config: { scope: 'teams:admin' },
        schema: {
          summary: 'List teams with their quotas',
          response: { 200: Type.Object({ teams: Type.Array(TeamSchema) }), ...errors },
        },
      },
      async () => ({ teams: await deps.teams.list() }),
    );

    app.get(
      '/v1/teams/:id',
      {
        config: { scope: 'sandboxes:read' },
        schema: {
          summary: 'A team, its quotas and what its sandboxes reserve now (own team; any with teams:admin)',
          params: TeamParams,
          response: { 200: TeamSchema, ...errors },
        },
      },
      async (req) => {
        const id = actingTeam(principalOf(req), req.params.id);
        return { ...(await deps.teams.require(id)), reserved: await deps.sandboxes.reserved(id) };
      },
    );

    app.patch(
      '/v1/teams/:id',
      {
        config: { scope: 'teams:admin' },
        schema: {
          summary: 'Set or clear (null) quota overrides of a team',
          params: TeamParams,
          body: Type.Object({ quotas: QuotaPatch }),
          response: { 200: TeamSchema, ...errors },
        },
      },
      async (req) => {
        const team = await deps.teams.setQuotas(req.params.id, req.body.quotas);
        req.log.info({ team: team.id, quotas: team.quotaOverrides }, 'team quotas set');
        return team;
      },
    );
  };
}
