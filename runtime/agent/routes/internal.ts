/**
 * Internal routes the API dispatches to (dispatch token required): create, delete, start command,
 * list. Not for clients.
 */
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox';
import { Type } from '@sinclair/typebox';
import {
  AGENT_ROUTES,
  AgentCommandRequestSchema,
  type AgentCommandResponse,
  AgentCreateRequestSchema,
  type AgentCreateResponse,
  AgentPauseRequestSchema,
  type AgentPauseResponse,
  AgentResumeRequestSchema,
  type AgentResumeResponse,
  type AgentSandboxSummary,
  PlatformIdSchema as Sid,
} from '../../core/agent-protocol.ts';
import { validateGrants } from '../../core/credentials.ts';
import { EgressPolicySchema, normalisePolicy } from '../../core/egress.ts';
import { SpaceError } from '../../core/errors.ts';
import { DispatchTokenVerifier } from '../../core/tokens.ts';
import { inSpan, traceContextFrom } from '../../core/tracing.ts';
import type { AgentDeps } from '../app.ts';
import { startOptions } from '../commands/commands.ts';

export function internalRoutes(deps: AgentDeps): FastifyPluginAsyncTypebox {
  return async (app) => {
    const dispatchTokens = new DispatchTokenVerifier(deps.verifyKey, deps.config.nodeId);
    app.addHook('onRequest', async (req) => {
      const m = /^Bearer\s+(\S+)$/i.exec(req.headers.authorization ?? '');
      if (!m) throw new SpaceError('UNAUTHENTICATED', 'dispatch token required');
      await dispatchTokens.verify(m[1]!);
    });

    app.post(AGENT_ROUTES.sandboxes, { schema: { body: AgentCreateRequestSchema } }, async (req) =>
      inSpan(
        'agent.sandboxes.create',
        { 'space.sandbox.id': req.body.sandboxId },
        async (span) => {
          const b = req.body;
          const sb = await deps.sandboxes.create({
            sandboxId: b.sandboxId,
            sessionId: b.sessionId,
            template: b.template,
            vcpus: b.vcpus,
            memoryMiB: b.memoryMiB,
            env: b.env,
            expiresAtMs: b.expiresAtMs,
            egress: normalisePolicy(b.egress),
            credentials: validateGrants(b.credentials),
          });
          span.setAttribute('space.instance.source', sb.source);
          return {
            instanceId: sb.instance.instanceId,
            fromWarmPool: sb.source === 'warm',
            source: sb.source,
          } satisfies AgentCreateResponse;
        },
        traceContextFrom(req.headers),
      ),
    );

    app.put(
      AGENT_ROUTES.egress,
      { schema: { params: Type.Object({ id: Sid }), body: EgressPolicySchema } },
      async (req, reply) => {
        await deps.sandboxes.updateEgress(req.params.id, normalisePolicy(req.body));
        return reply.status(204).send();
      },
    );

    app.delete(AGENT_ROUTES.sandbox, { schema: { params: Type.Object({ id: Sid }) } }, async (req, reply) => {
      await deps.sandboxes.delete(req.params.id);
      return reply.status(204).send();
    });

    app.post(
      AGENT_ROUTES.commands,
      { schema: { params: Type.Object({ id: Sid }), body: AgentCommandRequestSchema } },
      async (req, reply) => {
        const cmd = await inSpan(
          'agent.commands.start',
          { 'space.sandbox.id': req.params.id },
          () => deps.sandboxes.startCommand(req.params.id, startOptions(req.body.commandId, req.body)),
          traceContextFrom(req.headers),
        );
        return reply.status(201).send({ commandId: cmd.id, pid: cmd.pid } satisfies AgentCommandResponse);
      },
    );

    app.post(
      AGENT_ROUTES.pause,
      { schema: { params: Type.Object({ id: Sid }), body: AgentPauseRequestSchema } },
      async (req) => (await deps.sandboxes.pause(req.params.id, req.body.mode)) satisfies AgentPauseResponse,
    );

    app.post(
      AGENT_ROUTES.resume,
      { schema: { params: Type.Object({ id: Sid }), body: AgentResumeRequestSchema } },
      async (req) => {
        const r = req.body.restore;
        const out = await deps.sandboxes.resume(
          req.params.id,
          r
            ? {
                sandboxId: r.sandboxId,
                sessionId: r.sessionId,
                template: r.template,
                vcpus: r.vcpus,
                memoryMiB: r.memoryMiB,
                env: r.env,
                expiresAtMs: r.expiresAtMs,
                egress: normalisePolicy(r.egress),
                credentials: validateGrants(r.credentials),
                hibernation: r.hibernation,
              }
            : undefined,
        );
        return out satisfies AgentResumeResponse;
      },
    );

    app.get(AGENT_ROUTES.sandboxes, async () => ({
      sandboxes: deps.sandboxes.list().map(
        (s): AgentSandboxSummary => ({
          id: s.id,
          instanceId: s.instance.instanceId,
          template: s.template,
          commands: s.commands.size,
        }),
      ),
    }));
  };
}
