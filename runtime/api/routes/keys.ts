/**
 * API keys of a team: create (the secret is in this answer only), list, get, revoke, rotate. All
 * need `keys:admin`; a key may grant only scopes it holds itself, and acts on its own team unless it
 * holds `teams:admin` (then `?team=` / `team` names another).
 */
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox';
import { Type } from '@sinclair/typebox';
import { ErrorSchema, IdParams } from '../../core/api-schemas.ts';
import { SpaceError } from '../../core/errors.ts';
import { nullable, stringEnum } from '../../core/json-schema.ts';
import { ALL_SCOPES, type ApiScope, DEFAULT_KEY_SCOPES, TEAM_ID_PATTERN } from '../../core/tenancy.ts';
import type { Principal } from '../api-keys.ts';
import type { ApiDeps } from '../app.ts';
import { actingTeam, principalOf } from '../auth.ts';

const ScopeSchema = stringEnum(ALL_SCOPES);

const ApiKeySchema = Type.Object({
  id: Type.String(),
  name: Type.String(),
  team: Type.String(),
  scopes: Type.Array(Type.String()),
  createdAt: Type.String(),
  expiresAt: nullable(Type.String()),
  lastUsedAt: nullable(Type.String()),
  rotatedTo: nullable(Type.String()),
});
const WithSecret = Type.Object({
  key: ApiKeySchema,
  secret: Type.String({ description: 'The key itself: shown in this answer only, never again.' }),
});
const TeamQuery = Type.Object({ team: Type.Optional(Type.String({ pattern: TEAM_ID_PATTERN })) });
const errors = { 400: ErrorSchema, 401: ErrorSchema, 403: ErrorSchema, 404: ErrorSchema };
/** Longest key lifetime a create may ask for, s (10 years). */
const MAX_KEY_LIFETIME_SEC = 10 * 365 * 86_400;

/** @throws SpaceError SCOPE_DENIED naming the scopes `p` would grant without holding them. */
function checkGrantable(p: Principal, scopes: readonly ApiScope[]): void {
  const missing = scopes.filter((s) => !p.scopes.has(s));
  if (missing.length > 0) {
    throw new SpaceError(
      'SCOPE_DENIED',
      `a key can only grant scopes it holds; it lacks ${missing.join(', ')}`,
      {
        scope: missing[0],
        missing,
      },
    );
  }
}

export function keyRoutes(deps: ApiDeps): FastifyPluginAsyncTypebox {
  return async (app) => {
    app.post(
      '/v1/keys',
      {
        config: { scope: 'keys:admin' },
        schema: {
          summary: 'Create an API key (its secret is shown once, in this answer)',
          body: Type.Object({
            name: Type.String({ minLength: 1, maxLength: 128 }),
            team: Type.Optional(Type.String({ pattern: TEAM_ID_PATTERN })),
            scopes: Type.Optional(
              Type.Array(ScopeSchema, { uniqueItems: true, maxItems: ALL_SCOPES.length }),
            ),
            expiresInSec: Type.Optional(Type.Integer({ minimum: 60, maximum: MAX_KEY_LIFETIME_SEC })),
          }),
          response: { 201: WithSecret, ...errors },
        },
      },
      async (req, reply) => {
        const p = principalOf(req);
        const team = actingTeam(p, req.body.team);
        await deps.teams.require(team);
        const scopes = req.body.scopes ?? DEFAULT_KEY_SCOPES.filter((s) => p.scopes.has(s));
        checkGrantable(p, scopes);
        const made = await deps.apiKeys.create({
          team,
          name: req.body.name,
          scopes,
          ...(req.body.expiresInSec === undefined ? {} : { expiresInSec: req.body.expiresInSec }),
        });
        req.auditTarget = made.key.id;
        req.log.info({ 'key.id': made.key.id, team, scopes }, 'api key created');
        return reply.status(201).send(made);
      },
    );

    app.get(
      '/v1/keys',
      {
        config: { scope: 'keys:admin' },
        schema: {
          summary: 'List the team’s API keys (never their secrets)',
          querystring: TeamQuery,
          response: { 200: Type.Object({ keys: Type.Array(ApiKeySchema) }), ...errors },
        },
      },
      async (req) => ({ keys: await deps.apiKeys.list(actingTeam(principalOf(req), req.query.team)) }),
    );

    app.get(
      '/v1/keys/:id',
      {
        config: { scope: 'keys:admin' },
        schema: {
          summary: 'Get one of the team’s API keys',
          params: IdParams,
          querystring: TeamQuery,
          response: { 200: ApiKeySchema, ...errors },
        },
      },
      async (req) => {
        const { sha: _sha, ...view } = await deps.apiKeys.get(
          actingTeam(principalOf(req), req.query.team),
          req.params.id,
        );
        return view;
      },
    );

    app.delete(
      '/v1/keys/:id',
      {
        config: { scope: 'keys:admin' },
        schema: {
          summary: 'Revoke an API key (refused from the next request on, on every API replica)',
          params: IdParams,
          querystring: TeamQuery,
          response: { 200: ApiKeySchema, ...errors },
        },
      },
      async (req) => {
        const team = actingTeam(principalOf(req), req.query.team);
        const view = await deps.apiKeys.revoke(team, req.params.id);
        req.log.info({ 'key.id': view.id, team }, 'api key revoked');
        return view;
      },
    );

    app.post(
      '/v1/keys/:id/rotate',
      {
        config: { scope: 'keys:admin' },
        schema: {
          summary:
            'Rotate an API key: a successor with the same name, team and scopes; the old key keeps working for overlapSec, then expires',
          params: IdParams,
          querystring: TeamQuery,
          body: Type.Optional(
            Type.Object({
              overlapSec: Type.Optional(Type.Integer({ minimum: 0, maximum: 30 * 86_400 })),
              expiresInSec: Type.Optional(Type.Integer({ minimum: 60, maximum: MAX_KEY_LIFETIME_SEC })),
            }),
          ),
          response: {
            201: Type.Object({ key: ApiKeySchema, secret: Type.String(), previous: ApiKeySchema }),
            ...errors,
          },
        },
      },
      async (req, reply) => {
        const p = principalOf(req);
        const team = actingTeam(p, req.query.team);
        const old = await deps.apiKeys.get(team, req.params.id);
        checkGrantable(p, old.scopes);
        const out = await deps.apiKeys.rotate(team, req.params.id, {
          overlapSec: req.body?.overlapSec ?? deps.config.keyRotationOverlapSec,
          ...(req.body?.expiresInSec === undefined ? {} : { expiresInSec: req.body.expiresInSec }),
        });
        req.log.info({ 'key.id': req.params.id, successor: out.key.id, team }, 'api key rotated');
        return reply.status(201).send(out);
      },
    );
  };
}
