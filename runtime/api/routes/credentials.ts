/**
 * Operator credentials: register (PUT, value write-only), list, get, delete. Values never leave
 * the control plane except to a node's gateway for the sandboxes granted them.
 */
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox';
import { Type } from '@sinclair/typebox';
import { SpaceError } from '../../core/errors.ts';
import type { ApiDeps } from '../app.ts';
import { CREDENTIAL_NAME, CredentialBody, CredentialSchema, ErrorSchema } from '../schemas.ts';

const NameParams = Type.Object({ name: Type.String({ pattern: CREDENTIAL_NAME }) });
const errors = { 400: ErrorSchema, 401: ErrorSchema, 404: ErrorSchema };

export function credentialRoutes(deps: ApiDeps): FastifyPluginAsyncTypebox {
  return async (app) => {
    app.put(
      '/v1/credentials/:name',
      {
        schema: {
          summary: 'Register or replace a credential (the value is never returned)',
          params: NameParams,
          body: CredentialBody,
          response: { 200: CredentialSchema, ...errors },
        },
      },
      async (req) => {
        const view = await deps.credentials.put(req.params.name, req.body);
        req.log.info({ credential: view.name, domains: view.domains }, 'credential registered');
        return view;
      },
    );
    app.get(
      '/v1/credentials',
      {
        schema: {
          summary: 'List credentials',
          response: { 200: Type.Object({ credentials: Type.Array(CredentialSchema) }) },
        },
      },
      async () => ({ credentials: await deps.credentials.list() }),
    );
    app.get(
      '/v1/credentials/:name',
      {
        schema: {
          summary: 'Get a credential',
          params: NameParams,
          response: { 200: CredentialSchema, ...errors },
        },
      },
      async (req) => {
        const view = await deps.credentials.view(req.params.name);
        if (!view) throw new SpaceError('CREDENTIAL_NOT_FOUND', `no credential named ${req.params.name}`);
        return view;
      },
    );
    app.delete(
      '/v1/credentials/:name',
      {
        schema: {
          summary: 'Delete a credential',
          params: NameParams,
          response: { 204: Type.Null(), ...errors },
        },
      },
      async (req, reply) => {
        if (!(await deps.credentials.remove(req.params.name))) {
          throw new SpaceError('CREDENTIAL_NOT_FOUND', `no credential named ${req.params.name}`);
        }
        return reply.status(204).send(null);
      },
    );
  };
}
