/**
 * Commands and session tokens: the API starts a command on the sandbox's node and hands the
 * client a data-plane URL plus a session token; output then flows client → router → node (or
 * client → node where no router is configured). A command or token for a paused sandbox resumes
 * it first (bounded by SPACE_RESUME_TIMEOUT_MS).
 */
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox';
import { Type } from '@sinclair/typebox';
import {
  CommandBody,
  CommandResponse,
  ErrorSchema,
  IdParams,
  StreamGrant,
  TokenBody,
} from '../../core/api-schemas.ts';
import { inSpan, traceContextFrom } from '../../core/tracing.ts';
import type { ApiDeps } from '../app.ts';
import { principalOf } from '../auth.ts';
import { grantSession, startCommand } from '../usecases/command-start.ts';

const errors = {
  400: ErrorSchema,
  401: ErrorSchema,
  403: ErrorSchema,
  404: ErrorSchema,
  409: ErrorSchema,
  429: ErrorSchema,
  503: ErrorSchema,
};

export function commandRoutes(deps: ApiDeps): FastifyPluginAsyncTypebox {
  return async (app) => {
    app.post(
      '/v1/sandboxes/:id/commands',
      {
        config: { scope: 'sandboxes:write' },
        schema: {
          summary: 'Start a command; read its output from the returned stream URL',
          params: IdParams,
          body: CommandBody,
          response: { 201: CommandResponse, ...errors },
        },
      },
      async (req, reply) =>
        // the caller's trace context (its traceparent: sampled or not) carries on to the node
        inSpan(
          'api.commands.start',
          { 'space.sandbox.id': req.params.id },
          async () =>
            reply
              .status(201)
              .send(await startCommand(deps, principalOf(req).team, req.params.id, req.body, req.log)),
          traceContextFrom(req.headers),
        ),
    );

    app.post(
      '/v1/sandboxes/:id/tokens',
      {
        config: { scope: 'sandboxes:write' },
        schema: {
          summary: 'Mint a session token for the sandbox’s data plane (files, commands)',
          params: IdParams,
          body: Type.Optional(TokenBody),
          response: { 201: StreamGrant, ...errors },
        },
      },
      async (req, reply) =>
        reply.status(201).send(
          await grantSession(deps, principalOf(req).team, req.params.id, {
            scopes: req.body?.scopes,
            ttlSec: req.body?.ttlSec,
          }),
        ),
    );
  };
}
