/**
 * The control API the node agent uses (JSON over HTTP on a Unix socket, mode 0600):
 *
 * - `PUT /v1/sandboxes/:address` `{ sandboxId, policy, credentials? }` → 200 `{ address, sandboxId,
 *   replaced, changed, closed, registryId }`: registers or replaces what the sandbox at source
 *   address `:address` (IPv4) may do; a replacement closes that sandbox's open connections the new
 *   policy no longer allows. The same registration again (`changed: false`) changes nothing and
 *   logs at debug only (an agent from before `registryId` re-registers every sandbox every pass).
 * - `PUT /v1/sandboxes` `{ registrations: [{ address, sandboxId, policy, credentials? }] }` (at most
 *   {@link MAX_BATCH_REGISTRATIONS}) → 200 `{ results, registryId }`: the same for many sandboxes in
 *   one call, in order. `results[i]` answers `registrations[i]`: what the single route answers
 *   (without `registryId`), or `{ address, error: { code, message } }` for an entry refused or
 *   failed on its own (BAD_REQUEST: a bad address or grant; INTERNAL); the others still land. A
 *   body that fails the schema is refused whole (400), as is one over the body limit (413). The
 *   agent sends its claims' registrations this way (runtime/agent/host/gateway-client.ts): one call per
 *   burst, not one per sandbox.
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
import { type Static, Type } from '@sinclair/typebox';
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

/** Most registrations in one `PUT /v1/sandboxes`. */
export const MAX_BATCH_REGISTRATIONS = 256;

/** Body of `PUT /v1/sandboxes`: registrations, each with its source address. */
export const RegisterBatchSchema = Type.Object(
  {
    registrations: Type.Array(
      Type.Object(
        { address: Type.String({ maxLength: 64 }), ...RegisterBodySchema.properties },
        { additionalProperties: false },
      ),
      { minItems: 1, maxItems: MAX_BATCH_REGISTRATIONS },
    ),
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

  /**
   * Registers or replaces one sandbox's policy and grants; what the routes answer for it.
   * @throws SpaceError BAD_REQUEST for a bad address or grant.
   */
  const register = (address: string, body: Static<typeof RegisterBodySchema>) => {
    sandboxAddress(address);
    const policy = normalisePolicy(body.policy);
    const credentials = validateGrants(body.credentials ?? []);
    const { replaced, changed, closed } = deps.registry.put(address, {
      sandboxId: body.sandboxId,
      policy,
      credentials,
    });
    const fields = { [F.sandboxId]: body.sandboxId, address, mode: policy.mode, replaced, closed };
    if (!changed) deps.log.debug(fields, 'sandbox registration unchanged');
    else deps.log.info(fields, replaced ? 'sandbox policy replaced' : 'sandbox registered');
    return { address, sandboxId: body.sandboxId, replaced, changed, closed };
  };

  // Both PUT routes log what changed themselves (register); an access line for each of the
  // watchdog's re-registrations would be one line per live sandbox every few seconds. A
  // registration the gateway refuses (400) is logged by the agent that sent it, not here.
  app.put(
    '/v1/sandboxes/:address',
    { schema: { params: AddressParams, body: RegisterBodySchema }, logLevel: 'warn' },
    async (req) => ({ ...register(req.params.address, req.body), registryId: deps.registry.id }),
  );

  app.put('/v1/sandboxes', { schema: { body: RegisterBatchSchema }, logLevel: 'warn' }, async (req) => ({
    results: req.body.registrations.map(({ address, ...body }) => {
      try {
        return register(address, body);
      } catch (err) {
        // refused or failed on its own: the batch's other registrations still land, and are
        // answered as landed (a 500 for the whole batch would fail callers whose entry took)
        if (err instanceof SpaceError && err.status === 400) return { address, ...err.toBody() };
        deps.log.error({ err, [F.sandboxId]: body.sandboxId, address }, 'sandbox registration failed');
        return { address, ...new SpaceError('INTERNAL', 'the registration failed').toBody() };
      }
    }),
    registryId: deps.registry.id,
  }));

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
