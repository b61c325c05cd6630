/**
 * A team's credentials: register (PUT, value write-only), list, get, delete. Values never leave
 * the control plane except to a node's gateway for the sandboxes granted them. Every route acts on
 * the key's own team: another team's credential of the same name is never read, listed,
 * overwritten or deleted. Registering and deleting need `credentials:admin`.
 */
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox';
import { Type } from '@sinclair/typebox';
import { CREDENTIAL_NAME, CredentialBody, CredentialSchema, ErrorSchema } from '../../core/api-schemas.ts';
import { SpaceError } from '../../core/errors.ts';
import type { ApiDeps } from '../app.ts';
import { principalOf } from '../auth.ts';

const NameParams = Type.Object({ name: Type.String({ pattern: CREDENTIAL_NAME }) });
const errors = { 400: ErrorSchema, 401: ErrorSchema, 403: ErrorSchema, 404: ErrorSchema };

export function credentialRoutes(deps: ApiDeps): FastifyPluginAsyncTypebox {
  return async (app) => {
    app.put(
      '/v1/credentials/:name',
      {
        config: { scope: 'credentials:admin' },
        schema: {
          summary: 'Register or replace one of the team’s credentials (the value is never returned)',
          params: NameParams,
          body: CredentialBody,
          response: { 200: CredentialSchema, ...errors },
        },
      },
      async (req) => {
        const team = principalOf(req).team;
        const view = await deps.credentials.put(team, req.params.name, req.body);
        req.log.info({ credential: view.name, team, domains: view.domains }, 'credential registered');
        return view;
      },
    );
    app.get(
      '/v1/credentials',
      {
        config: { scope: 'credentials:read' },
        schema: {
          summary: 'List the team’s credentials',
          response: { 200: Type.Object({ credentials: Type.Array(CredentialSchema) }), ...errors },
        },
      },
      async (req) => ({ credentials: await deps.credentials.list(principalOf(req).team) }),
    );
    app.get(
      '/v1/credentials/:name',
      {
        config: { scope: 'credentials:read' },
        schema: {
          summary: 'Get one of the team’s credentials',
          params: NameParams,
          response: { 200: CredentialSchema, ...errors },
        },
      },
      async (req) => {
        const view = await deps.credentials.view(principalOf(req).team, req.params.name);
        if (!view) throw new SpaceError('CREDENTIAL_NOT_FOUND', `no credential named ${req.params.name}`);
        return view;
      },
    );
    app.delete(
      '/v1/credentials/:name',
      {
        config: { scope: 'credentials:admin' },
        schema: {
          summary: 'Delete one of the team’s credentials',
          params: NameParams,
          response: { 204: Type.Null(), ...errors },
        },
      },
      async (req, reply) => {
        if (!(await deps.credentials.remove(principalOf(req).team, req.params.name))) {
          throw new SpaceError('CREDENTIAL_NOT_FOUND', `no credential named ${req.params.name}`);
        }
        return reply.status(204).send(null);
      },
    );
  };
}
