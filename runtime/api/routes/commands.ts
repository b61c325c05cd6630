/**
 * Commands and session tokens: the API starts a command on the sandbox's node and hands the
 * client a data-plane URL plus a session token; output then flows client → router → node (or
 * client → node where no router is configured). A command or token for a paused sandbox resumes
 * it first (bounded by SPACE_RESUME_TIMEOUT_MS).
 */
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox';
import { Type } from '@sinclair/typebox';
import { SpaceError } from '../../core/errors.ts';
import { newId } from '../../core/ids.ts';
import { ensureRunning } from '../../core/lifecycle-requests.ts';
import { F } from '../../core/log-fields.ts';
import { mintSessionToken, type SessionScope } from '../../core/tokens.ts';
import { inSpan, traceContextFrom } from '../../core/tracing.ts';
import type { ApiDeps } from '../app.ts';
import { principalOf } from '../auth.ts';
import { CommandBody, CommandResponse, ErrorSchema, IdParams, StreamGrant, TokenBody } from '../schemas.ts';

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
  /** Running sandbox of `team` (resumed first when paused) + its alive node, or a coded error. */
  async function liveSandbox(id: string, team: string) {
    let rec = await deps.requireSandbox(id, team);
    if (rec.state === 'paused' || rec.state === 'pausing' || rec.state === 'resuming') {
      await ensureRunning(deps.redis, id, { timeoutMs: deps.config.resumeTimeoutMs, reason: 'command' });
      rec = await deps.requireSandbox(id, team);
    }
    if (rec.state !== 'running' || !rec.nodeId) {
      throw new SpaceError('SANDBOX_NOT_RUNNING', `sandbox ${id} is ${rec.state}`, {
        sandboxId: id,
        state: rec.state,
      });
    }
    return { rec, node: await deps.nodes.requireAlive(rec.nodeId) };
  }

  /** Base URL of the data plane clients should use: the router when configured, else the node. */
  const dataPlaneBase = (nodeUrl: string) => deps.config.publicDataPlaneUrl || nodeUrl;

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
          async () => {
            const b = req.body;
            if (b.shell && b.args?.length)
              throw new SpaceError('BAD_REQUEST', 'give either args or shell, not both');
            const team = principalOf(req).team;
            let { rec, node } = await liveSandbox(req.params.id, team);
            const commandId = newId('cmd');
            const start = {
              commandId,
              cmd: b.cmd,
              args: b.args ?? [],
              shell: b.shell ?? false,
              env: b.env ?? {},
              cwd: b.cwd,
              user: b.user ?? 'user',
              stdin: b.stdin,
              timeoutMs: b.timeoutMs,
            };
            let started: Awaited<ReturnType<typeof deps.agents.startCommand>>;
            try {
              started = await deps.agents.startCommand(node, rec.id, start);
            } catch (err) {
              // a pause took the sandbox between our look and the node's: resume it and start once more
              if (!(err instanceof SpaceError && err.code === 'SANDBOX_PAUSED')) throw err;
              await ensureRunning(deps.redis, rec.id, {
                timeoutMs: deps.config.resumeTimeoutMs,
                reason: 'command',
              });
              ({ rec, node } = await liveSandbox(req.params.id, team));
              started = await deps.agents.startCommand(node, rec.id, start);
            }
            const grant = await mintSessionToken(deps.signingKey, {
              sandboxId: rec.id,
              sessionId: rec.sessionId,
              team: rec.team,
              maxStreams: (await deps.teams.quotas(rec.team)).streams,
              scopes: ['commands'],
              ttlSec: deps.config.sessionTokenTtlSec,
            });
            req.log.info({ [F.sandboxId]: rec.id, [F.commandId]: commandId }, 'command started');
            return reply.status(201).send({
              command: { id: commandId, sandboxId: rec.id, pid: started.pid },
              stream: {
                url: new URL(
                  `/v1/sandboxes/${rec.id}/commands/${commandId}/events`,
                  dataPlaneBase(node.url),
                ).toString(),
                token: grant.token,
                expiresAt: new Date(grant.expiresAt * 1000).toISOString(),
              },
            });
          },
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
      async (req, reply) => {
        const { rec, node } = await liveSandbox(req.params.id, principalOf(req).team);
        const scopes: SessionScope[] = req.body?.scopes ?? ['commands', 'files'];
        const grant = await mintSessionToken(deps.signingKey, {
          sandboxId: rec.id,
          sessionId: rec.sessionId,
          team: rec.team,
          maxStreams: (await deps.teams.quotas(rec.team)).streams,
          scopes,
          ttlSec: req.body?.ttlSec ?? deps.config.sessionTokenTtlSec,
        });
        return reply.status(201).send({
          url: new URL(`/v1/sandboxes/${rec.id}`, dataPlaneBase(node.url)).toString(),
          token: grant.token,
          expiresAt: new Date(grant.expiresAt * 1000).toISOString(),
        });
      },
    );
  };
}
