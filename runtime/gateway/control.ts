/**
 * The control API the node agent uses (JSON over HTTP on a Unix socket, mode 0600):
 *
 * - `PUT /v1/sandboxes/:address` `{ sandboxId, policy, credentials? }` → 200 `{ address, sandboxId,
 *   replaced, changed, closed, registryId }`: registers or replaces what the sandbox at source
 *   address `:address` (IPv4) may do; a replacement closes that sandbox's open connections the new
 *   policy no longer allows. The same registration again (`changed: false`) changes nothing and
 *   logs at debug only (an agent from before `registryId` re-registers every sandbox every pass).
 * - `DELETE /v1/sandboxes/:address` → 204 (404 `SANDBOX_NOT_FOUND` when unknown): forgets it and
 *   closes its connections.
 * - `GET /v1/sandboxes` → 200 `{ sandboxes: RegistrationView[] }` (no credential values or placeholders).
 * - `GET /healthz` → 200 `{ ok: true, registryId }`; `GET /metrics` (Prometheus).
 *
 * `registryId` names this process's registry (Registry.id): registrations live in memory only, so
 * a gateway that restarted answers a new id and holds none. The agent's watchdog reads it each pass
 * and registers again only the sandboxes whose last registration another id answered.
 *
 * Errors use the SPACE wire shape `{ error: { code, message } }` (BAD_REQUEST for a bad body or address).
 */
import { isIPv4 } from 'node:net';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { Type } from '@sinclair/typebox';
import fastify, { type FastifyBaseLogger, type FastifyInstance } from 'fastify';
import type { Logger } from 'pino';
import { SpaceError } from '../core/errors.ts';
import { installErrorHandlers } from '../core/http-errors.ts';
import { requestLogOptions } from '../core/http-log.ts';
import { F } from '../core/log-fields.ts';
import type { GatewayMetrics } from './audit.ts';
import { CredentialGrantSchema, validateGrants } from './credentials.ts';
import { EgressPolicySchema, normalisePolicy } from './policy.ts';
import type { Registry } from './registry.ts';

/** Body of `PUT /v1/sandboxes/:address`. */
export const RegisterBodySchema = Type.Object(
  {
    sandboxId: Type.String({ minLength: 1, maxLength: 128 }),
    policy: EgressPolicySchema,
    credentials: Type.Optional(Type.Array(CredentialGrantSchema, { maxItems: 64 })),
  },
  { additionalProperties: false },
);

/** What the control app uses. */
export interface ControlDeps {
  registry: Registry;
  metrics: GatewayMetrics;
  log: Logger;
}

const AddressParams = Type.Object({ address: Type.String({ maxLength: 64 }) });

function sandboxAddress(address: string): string {
  if (!isIPv4(address)) throw new SpaceError('BAD_REQUEST', `not an IPv4 address: ${address}`);
  return address;
}

/** Builds the control app (never listens itself). */
export async function buildControlApp(deps: ControlDeps): Promise<FastifyInstance> {
  const app = fastify({
    loggerInstance: deps.log as FastifyBaseLogger,
    bodyLimit: 1_048_576,
    ...requestLogOptions(),
  }).withTypeProvider<TypeBoxTypeProvider>();
  installErrorHandlers(app);

  app.get('/healthz', async () => ({ ok: true, registryId: deps.registry.id }));
  app.get('/metrics', async (_req, reply) =>
    reply.type(deps.metrics.registry.contentType).send(await deps.metrics.registry.metrics()),
  );
  app.get('/v1/sandboxes', async () => ({ sandboxes: deps.registry.list() }));

  app.put(
    '/v1/sandboxes/:address',
    // the route logs what changed itself (below); an access line for each of the watchdog's
    // re-registrations would be one line per live sandbox every few seconds. A registration the
    // gateway refuses (400) is logged by the agent that sent it, not here.
    { schema: { params: AddressParams, body: RegisterBodySchema }, logLevel: 'warn' },
    async (req) => {
      const address = sandboxAddress(req.params.address);
      const policy = normalisePolicy(req.body.policy);
      const credentials = validateGrants(req.body.credentials ?? []);
      const { replaced, changed, closed } = deps.registry.put(address, {
        sandboxId: req.body.sandboxId,
        policy,
        credentials,
      });
      const fields = { [F.sandboxId]: req.body.sandboxId, address, mode: policy.mode, replaced, closed };
      if (!changed) deps.log.debug(fields, 'sandbox registration unchanged');
      else deps.log.info(fields, replaced ? 'sandbox policy replaced' : 'sandbox registered');
      return {
        address,
        sandboxId: req.body.sandboxId,
        replaced,
        changed,
        closed,
        registryId: deps.registry.id,
      };
    },
  );

  app.delete('/v1/sandboxes/:address', { schema: { params: AddressParams } }, async (req, reply) => {
    const address = sandboxAddress(req.params.address);
    const sandboxId = deps.registry.lookup(address)?.sandboxId;
    if (!deps.registry.delete(address)) {
      throw new SpaceError('SANDBOX_NOT_FOUND', `no sandbox registered at ${address}`, { address });
    }
    deps.log.info({ [F.sandboxId]: sandboxId, address }, 'sandbox unregistered');
    return reply.status(204).send();
  });

  return app;
}
