/**
 * Internal routes the API dispatches to (dispatch token required): create, delete, start command,
 * list. Not for clients.
 */
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox';
import { Type } from '@sinclair/typebox';
import { CredentialGrantSchema, validateGrants } from '../../core/credentials.ts';
import { EgressPolicySchema, normalisePolicy } from '../../core/egress.ts';
import { SpaceError } from '../../core/errors.ts';
import { verifyDispatchToken } from '../../core/tokens.ts';
import type { AgentDeps } from '../app.ts';

const EnvVars = Type.Record(Type.String({ pattern: '^[A-Za-z_][A-Za-z0-9_]*$' }), Type.String(), {
  additionalProperties: false,
});
const Sid = Type.String({ pattern: '^[a-z]{1,8}_[a-z0-9]{8,40}$' });

export function internalRoutes(deps: AgentDeps): FastifyPluginAsyncTypebox {
  return async (app) => {
    app.addHook('onRequest', async (req) => {
      const m = /^Bearer\s+(\S+)$/i.exec(req.headers.authorization ?? '');
      if (!m) throw new SpaceError('UNAUTHENTICATED', 'dispatch token required');
      await verifyDispatchToken(deps.verifyKey, m[1]!, deps.config.nodeId);
    });

    app.post(
      '/internal/v1/sandboxes',
      {
        schema: {
          body: Type.Object(
            {
              sandboxId: Sid,
              sessionId: Sid,
              template: Type.String({ pattern: '^[a-z0-9][a-z0-9-]{0,62}$' }),
              vcpus: Type.Number({ minimum: 0.25 }),
              memoryMiB: Type.Integer({ minimum: 128 }),
              env: EnvVars,
              expiresAtMs: Type.Integer(),
              egress: EgressPolicySchema,
              credentials: Type.Array(CredentialGrantSchema, { maxItems: 32 }),
            },
            { additionalProperties: false },
          ),
        },
      },
      async (req) => {
        const sb = await deps.sandboxes.create({
          ...req.body,
          egress: normalisePolicy(req.body.egress),
          credentials: validateGrants(req.body.credentials),
        });
        return { instanceId: sb.instance.instanceId, fromWarmPool: sb.fromWarmPool };
      },
    );

    app.put(
      '/internal/v1/sandboxes/:id/egress',
      { schema: { params: Type.Object({ id: Sid }), body: EgressPolicySchema } },
      async (req, reply) => {
        await deps.sandboxes.updateEgress(req.params.id, normalisePolicy(req.body));
        return reply.status(204).send();
      },
    );

    app.delete(
      '/internal/v1/sandboxes/:id',
      { schema: { params: Type.Object({ id: Sid }) } },
      async (req, reply) => {
        await deps.sandboxes.delete(req.params.id);
        return reply.status(204).send();
      },
    );

    app.post(
      '/internal/v1/sandboxes/:id/commands',
      {
        schema: {
          params: Type.Object({ id: Sid }),
          body: Type.Object(
            {
              commandId: Sid,
              cmd: Type.String({ minLength: 1 }),
              args: Type.Array(Type.String()),
              shell: Type.Boolean(),
              env: EnvVars,
              cwd: Type.Optional(Type.String()),
              user: Type.Union([Type.Literal('user'), Type.Literal('root')]),
              stdin: Type.Optional(Type.Union([Type.Boolean(), Type.String()])),
              timeoutMs: Type.Optional(Type.Integer({ minimum: 1 })),
            },
            { additionalProperties: false },
          ),
        },
      },
      async (req, reply) => {
        const cmd = await deps.sandboxes.startCommand(req.params.id, req.body);
        return reply.status(201).send({ commandId: cmd.id, pid: cmd.pid });
      },
    );

    app.get('/internal/v1/sandboxes', async () => ({
      sandboxes: deps.sandboxes.list().map((s) => ({
        id: s.id,
        instanceId: s.instance.instanceId,
        template: s.template,
        commands: s.commands.size,
      })),
    }));
  };
}
