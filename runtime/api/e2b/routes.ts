/**
 * E2B-compatible control plane: the routes the official `e2b` JS SDK (2.45–2.51) calls for
 * sandboxes, as an encapsulated plugin with its own auth (`X-API-KEY` = a SPACE API key: its team
 * owns what it creates and is all it sees; each route needs the same scope as its v1 twin) and
 * E2B's error body `{code, message}` (the SDK reads `code`). Sources: E2B's OpenAPI description
 * (https://github.com/e2b-dev/E2B/blob/main/spec/openapi.yml: routes, bodies, statuses) as the JS
 * SDK 2.45–2.51 reads it; what SPACE serves of it is in docs/e2b.md.
 *
 * The routes translate: create, kill, pause, resume and network updates call SPACE's own use cases
 * (`../usecases/`, with the v1 body schemas checked in process, so placement checks, validation and
 * records have one implementation) and then wait on SPACE's operation, since E2B's create, kill,
 * pause and connect answer when done. Waits are bounded by
 * `waitMs` (create: 2 × MAX_WAIT_MS) and end in 504 when the operation has not finished.
 *
 * Not implemented: the E2B routes of {@link E2B_UNSERVED} (snapshots, fork, logs, templates,
 * volumes, secrets, metrics…) answer 501 `NOT_IMPLEMENTED` whatever the auth; a path E2B does
 * not have either answers 404 (E2B's body for an E2B client: {@link e2bNotFoundBody}); create
 * options SPACE lacks (`mcp`, `volumeMounts`, parts of `network`) are 400.
 */
import type { FastifyPluginAsync, FastifyRequest } from 'fastify';
import { CreateSandboxBody } from '../../core/api-schemas.ts';
import { EgressPolicySchema } from '../../core/egress.ts';
import { isErrorCode, SpaceError } from '../../core/errors.ts';
import { retryAfterSec } from '../../core/http-errors.ts';
import { ID_PATTERN } from '../../core/ids.ts';
import { F } from '../../core/log-fields.ts';
import { fromRedisOutage } from '../../core/redis-errors.ts';
import { checkBody } from '../../core/validation.ts';
import type { ApiDeps } from '../app.ts';
import { principalOf, requireScope } from '../auth.ts';
import { MAX_WAIT_MS, type OperationRecord } from '../operations.ts';
import type { SandboxRecord } from '../sandbox-store.ts';
import { createSandbox } from '../usecases/create.ts';
import { deleteSandbox } from '../usecases/delete.ts';
import { replaceEgress } from '../usecases/egress.ts';
import { pauseSandbox } from '../usecases/pause.ts';
import { resumeSandbox } from '../usecases/resume.ts';
import { envdToken } from './envd-token.ts';
import {
  type E2bErrorBody,
  type E2bNetwork,
  type E2bState,
  e2bState,
  egressOf,
  parseMetadataFilter,
  spaceStates,
  toE2bDetail,
  toE2bError,
  toE2bListed,
  toE2bSandbox,
} from './shapes.ts';

const SANDBOX_ID = new RegExp(ID_PATTERN);
/** E2B's default lifetime when a create/connect names none, s (§1.4, §1.6). */
const E2B_DEFAULT_TIMEOUT_SEC = 300;

interface CreateBody {
  templateID?: string;
  timeout?: number;
  metadata?: Record<string, string>;
  envVars?: Record<string, string>;
  allow_internet_access?: boolean;
  autoPause?: boolean;
  autoPauseMemory?: boolean;
  autoResume?: { enabled?: boolean } | null;
  network?: E2bNetwork;
  mcp?: unknown;
  volumeMounts?: unknown;
  iam?: unknown;
  secure?: boolean;
}

const NetworkProps = {
  allowOut: { type: 'array', items: { type: 'string', maxLength: 1024 }, maxItems: 1000 },
  denyOut: { type: 'array', items: { type: 'string', maxLength: 1024 }, maxItems: 1000 },
  allowPublicTraffic: { type: 'boolean' },
  httpsPorts: { type: 'array' },
} as const;

const CreateSchema = {
  type: 'object',
  required: ['templateID'],
  properties: {
    templateID: { type: 'string', minLength: 1, maxLength: 256 },
    timeout: { type: 'integer', minimum: 0 },
    metadata: { type: 'object', additionalProperties: { type: 'string' } },
    envVars: { type: 'object', additionalProperties: { type: 'string' } },
    allow_internet_access: { type: 'boolean' },
    network: { type: 'object', properties: NetworkProps },
    autoPause: { type: 'boolean' },
    autoPauseMemory: { type: 'boolean' },
    autoResume: { type: ['object', 'null'], properties: { enabled: { type: 'boolean' } } },
    secure: { type: 'boolean' },
  },
} as const;

/** `POST …/pause` (SDK `pause({ keepMemory })` sends `memory`). */
const PauseSchema = { type: ['object', 'null'], properties: { memory: { type: 'boolean' } } } as const;

const NetworkSchema = {
  type: 'object',
  properties: { ...NetworkProps, allow_internet_access: { type: 'boolean' } },
} as const;

const TimeoutSchema = {
  type: 'object',
  required: ['timeout'],
  properties: { timeout: { type: 'integer', minimum: 0 } },
} as const;

const ConnectSchema = {
  type: 'object',
  properties: { timeout: { type: 'integer', minimum: 0 }, memory: { type: 'boolean' } },
} as const;

/**
 * E2B control-plane routes SPACE does not serve (yet), as method, path (Fastify syntax) and what
 * they are, from E2B's OpenAPI description (spec/openapi.yml) and the JS SDK 2.51's calls. Each
 * answers 501 NOT_IMPLEMENTED naming it, before any authentication: a client learns "not here",
 * never "check your credentials".
 */
export const E2B_UNSERVED: readonly (readonly [method: string, path: string, what: string])[] = [
  ['POST', '/sandboxes/:id/snapshots', 'snapshots (createSnapshot)'],
  ['GET', '/snapshots', 'snapshot listing (listSnapshots)'],
  ['POST', '/sandboxes/:id/fork', 'fork'],
  ['GET', '/sandboxes/:id/logs', 'sandbox logs'],
  ['GET', '/v2/sandboxes/:id/logs', 'sandbox logs'],
  ['POST', '/sandboxes/:id/refreshes', 'refreshes'],
  ['GET', '/sandboxes/metrics', 'sandbox metrics'],
  ['GET', '/sandboxes/:id/metrics', 'sandbox metrics'],
  ['GET', '/templates', 'templates (Template.*)'],
  ['POST', '/templates', 'template builds (Template.*)'],
  ['POST', '/v2/templates', 'template builds (Template.*)'],
  ['POST', '/v3/templates', 'template builds (Template.build)'],
  ['GET', '/templates/:templateID', 'templates (Template.*)'],
  ['POST', '/templates/:templateID', 'template builds (Template.*)'],
  ['PATCH', '/templates/:templateID', 'templates (Template.*)'],
  ['DELETE', '/templates/:templateID', 'template and snapshot deletion (deleteSnapshot)'],
  ['POST', '/templates/:templateID/builds/:buildID', 'template builds (Template.build)'],
  ['POST', '/v2/templates/:templateID/builds/:buildID', 'template builds (Template.build)'],
  ['GET', '/templates/:templateID/builds/:buildID/status', 'template build status'],
  ['GET', '/templates/:templateID/builds/:buildID/logs', 'template build logs'],
  ['GET', '/templates/:templateID/files/:hash', 'template build files'],
  ['GET', '/templates/aliases/:alias', 'template aliases (Template.exists)'],
  ['GET', '/templates/:templateID/tags', 'template tags'],
  ['POST', '/templates/tags', 'template tags'],
  ['DELETE', '/templates/tags', 'template tags'],
  ['GET', '/volumes', 'volumes (Volume.*)'],
  ['POST', '/volumes', 'volumes (Volume.*)'],
  ['GET', '/volumes/:volumeID', 'volumes (Volume.*)'],
  ['DELETE', '/volumes/:volumeID', 'volumes (Volume.*)'],
  ['GET', '/volumecontent/*', 'volume content (Volume.*)'],
  ['POST', '/volumecontent/*', 'volume content (Volume.*)'],
  ['PUT', '/volumecontent/*', 'volume content (Volume.*)'],
  ['PATCH', '/volumecontent/*', 'volume content (Volume.*)'],
  ['DELETE', '/volumecontent/*', 'volume content (Volume.*)'],
  ['GET', '/secrets', 'secrets'],
  ['POST', '/secrets', 'secrets'],
  ['GET', '/secrets/:secretID', 'secrets'],
  ['POST', '/secrets/:secretID', 'secrets'],
  ['DELETE', '/secrets/:secretID', 'secrets'],
  ['GET', '/teams', 'teams'],
  ['GET', '/teams/:teamID/metrics', 'team metrics'],
  ['GET', '/teams/:teamID/metrics/max', 'team metrics'],
];

/**
 * The 404 body for a request that matched no route, in E2B's shape (`{code, message}`, which the
 * SDK reads) when it comes from an E2B client (an `X-API-KEY` header, no `Authorization`); null
 * (SPACE's own envelope) otherwise.
 */
export function e2bNotFoundBody(req: FastifyRequest, err: SpaceError): E2bErrorBody | null {
  if (req.headers['x-api-key'] === undefined || req.headers.authorization !== undefined) return null;
  return toE2bError(err);
}

type IdReq = { Params: { id: string } };

/** The E2B routes for `deps` (register without fastify-plugin: hooks and handlers stay inside). */
export function e2bRoutes(deps: ApiDeps): FastifyPluginAsync {
  /**
   * Team `team`'s sandbox as E2B sees it (ended ones are gone: 404), or a SANDBOX_NOT_FOUND error
   * (also for another team's sandbox).
   */
  async function liveRecord(id: string, team: string): Promise<SandboxRecord> {
    if (!SANDBOX_ID.test(id)) throw new SpaceError('SANDBOX_NOT_FOUND', `sandbox "${id}" not found`);
    const rec = await deps.sandboxes.get(id);
    if (!rec || rec.team !== team || e2bState(rec.state) === null) {
      throw new SpaceError('SANDBOX_NOT_FOUND', `sandbox "${id}" not found`, { sandboxId: id });
    }
    return rec;
  }

  /**
   * Waits for operation `id` to end, at most `waitMs`.
   * @throws SpaceError with the operation's own code when it failed; {@link TimeoutOf} (504) when it has
   *   not ended in time.
   */
  async function settle(id: string, waitMs: number): Promise<OperationRecord> {
    const deadline = Date.now() + waitMs;
    for (let i = 0; i < 10; i++) {
      const op = await deps.waiter.wait(id, Math.max(1, deadline - Date.now()));
      if (op?.state === 'succeeded') return op;
      if (op?.state === 'failed') {
        const err = op.error;
        throw new SpaceError(
          isErrorCode(err?.code) ? err.code : 'INTERNAL',
          err?.message ?? 'operation failed',
        );
      }
      if (Date.now() >= deadline) break;
    }
    throw new TimeoutOf(id);
  }

  /** Resumes `rec` when paused and waits for it; returns true when it had to resume. */
  async function runIt(rec: SandboxRecord, log: FastifyRequest['log']): Promise<boolean> {
    if (rec.state === 'running' || rec.state === 'creating') return false;
    const op = await resumeSandbox(deps, rec.team, rec.id, log);
    await settle(op.id, MAX_WAIT_MS);
    return true;
  }

  /** Extends (never shortens) the running lifetime to `timeoutSec` from now. */
  async function extendAtLeast(rec: SandboxRecord, timeoutSec: number): Promise<void> {
    const cur = await liveRecord(rec.id, rec.team);
    const leftSec = (Date.parse(cur.expiresAt) - Date.now()) / 1000;
    if (leftSec >= timeoutSec) return;
    await setTimeoutSec(rec.id, timeoutSec);
  }

  async function setTimeoutSec(id: string, timeoutSec: number): Promise<void> {
    const capped = Math.min(timeoutSec, deps.config.maxTimeoutSec);
    const res = await deps.sandboxes.extend(id, capped);
    if (!res.ok) {
      if (res.current === null) throw new SpaceError('SANDBOX_NOT_FOUND', `sandbox "${id}" not found`);
      throw new SpaceError('SANDBOX_NOT_RUNNING', `sandbox "${id}" is ${res.current}`);
    }
  }

  /**
   * Connect/resume: running ⇒ extend only (200), paused ⇒ resume (201), ending ⇒ 409. `coldBoot`
   * (SDK `connect({ onResume: 'reboot' })`, wire `memory: false`) of a paused sandbox is refused:
   * SPACE resumes with memory only.
   */
  async function connect(
    id: string,
    team: string,
    timeoutSec: number,
    log: FastifyRequest['log'],
    coldBoot = false,
  ) {
    const rec = await liveRecord(id, team);
    if (coldBoot && e2bState(rec.state) === 'paused') throw memoryLess("connect({ onResume: 'reboot' })");
    const resumed = await runIt(rec, log);
    await extendAtLeast(rec, timeoutSec);
    const now = await liveRecord(id, team);
    return { status: resumed ? 201 : 200, body: toE2bSandbox(now, await envdToken(deps, now)) };
  }

  return async (app) => {
    app.addHook('onRoute', (route) => {
      route.config = { ...(route.config ?? {}), e2b: true };
    });
    app.addHook('onRequest', async (req) => {
      if (req.routeOptions.config.unserved) return; // 501 whatever the auth
      const key = req.headers['x-api-key'];
      if (typeof key !== 'string' || !key) {
        throw new SpaceError('UNAUTHENTICATED', 'missing X-API-KEY header (an API key of this SPACE)');
      }
      req.auth = await deps.apiKeys.authenticate(`Bearer ${key}`);
      const scope = req.routeOptions.config.scope;
      if (scope) requireScope(req.auth, scope);
    });
    app.setErrorHandler((original, req, reply) => {
      const err = fromRedisOutage(original);
      const body = err instanceof TimeoutOf ? { code: 504, message: err.message } : toE2bError(err);
      const retryAfter = err instanceof SpaceError ? retryAfterSec(err) : null;
      if (retryAfter !== null) void reply.header('retry-after', retryAfter);
      if (body.code >= 500) req.log.error({ err }, 'e2b request failed');
      else req.log.info({ code: body.code, msg: body.message }, 'e2b request refused');
      void reply.status(body.code).type('application/json').send(body);
    });

    const create = async (req: FastifyRequest, v1: boolean) => {
      const b = req.body as CreateBody;
      const lifecycle = lifecycleOf(b);
      const unsupported = [
        b.mcp !== undefined ? 'mcp' : null,
        b.volumeMounts !== undefined ? 'volumeMounts' : null,
        b.iam !== undefined ? 'iam' : null,
      ].filter(Boolean);
      if (unsupported.length) {
        throw new SpaceError(
          'BAD_REQUEST',
          `not supported by this SPACE server yet: ${unsupported.join(', ')}`,
        );
      }
      const egress = egressOf(b.allow_internet_access, b.network);
      const template = (b.templateID ?? 'base').split(':')[0] ?? 'base';
      const timeoutSec = b.timeout || (v1 ? 15 : E2B_DEFAULT_TIMEOUT_SEC);
      const who = principalOf(req);
      // SPACE's create body, checked as POST /v1/sandboxes checks it
      const body = {
        template,
        timeoutSec: Math.min(timeoutSec, deps.config.maxTimeoutSec),
        metadata: b.metadata ?? {},
        env: b.envVars ?? {},
        egress,
        // private servers: reached only with the traffic access token (§4)
        ...(b.network?.allowPublicTraffic === false ? { ports: { public: false } } : {}),
        ...lifecycle,
      };
      checkBody(CreateSandboxBody, body);
      let out: Awaited<ReturnType<typeof createSandbox>>;
      try {
        out = await createSandbox(deps, {
          who,
          body: body as CreateSandboxBody,
          log: req.log,
        });
      } catch (err) {
        if (err instanceof SpaceError && err.code === 'TEMPLATE_NOT_FOUND') {
          throw new SpaceError('BAD_REQUEST', `template "${b.templateID}" not found: ${err.message}`);
        }
        throw err;
      }
      req.auditTarget = out.sandbox.id;
      await settle(out.operation.id, 2 * MAX_WAIT_MS);
      const rec = await liveRecord(out.sandbox.id, who.team);
      deps.log.info({ [F.sandboxId]: rec.id, [F.templateId]: template }, 'e2b sandbox created');
      return toE2bSandbox(rec, await envdToken(deps, rec));
    };

    const write = { scope: 'sandboxes:write' } as const;
    const read = { scope: 'sandboxes:read' } as const;
    app.post('/sandboxes', { schema: { body: CreateSchema }, config: write }, async (req, reply) =>
      reply.status(201).send(await create(req, true)),
    );
    app.post('/v2/sandboxes', { schema: { body: CreateSchema }, config: write }, async (req, reply) =>
      reply.status(201).send(await create(req, false)),
    );

    const list = async (q: Record<string, string | undefined>, team: string) => {
      const order = q.order ?? 'desc';
      if (order !== 'asc' && order !== 'desc') {
        throw new SpaceError('BAD_REQUEST', 'order must be asc or desc');
      }
      const states = (q.state ?? 'running,paused').split(',').filter(Boolean);
      for (const s of states) {
        if (s !== 'running' && s !== 'paused') throw new SpaceError('BAD_REQUEST', `unknown state "${s}"`);
      }
      const limit = q.limit === undefined ? 100 : Number(q.limit);
      if (!Number.isInteger(limit) || limit < 1 || limit > 100) {
        throw new SpaceError('BAD_REQUEST', 'limit must be an integer from 1 to 100');
      }
      const after = q.startedAfter === undefined ? null : Date.parse(q.startedAfter);
      if (after !== null && Number.isNaN(after))
        throw new SpaceError('BAD_REQUEST', 'startedAfter is not a date');
      // every filter applies before the limit (in the store), so a page is short only at the end
      const match =
        q.template || after !== null
          ? (r: SandboxRecord) =>
              (!q.template || r.template === q.template) &&
              (after === null || Date.parse(r.createdAt) >= after)
          : undefined;
      const page = await deps.sandboxes.list({
        limit,
        order,
        ...(q.nextToken ? { cursor: q.nextToken } : {}),
        state: spaceStates(states as E2bState[]),
        team,
        ...(q.metadata ? { metadata: parseMetadataFilter(q.metadata) } : {}),
        ...(match ? { match } : {}),
      });
      return { rows: page.sandboxes.map(toE2bListed), next: page.nextCursor };
    };
    for (const url of ['/v2/sandboxes', '/sandboxes']) {
      app.get<{ Querystring: Record<string, string | undefined> }>(
        url,
        { config: read },
        async (req, reply) => {
          const { rows, next } = await list(req.query, principalOf(req).team);
          if (next) void reply.header('x-next-token', next);
          return rows;
        },
      );
    }

    app.get<IdReq>('/sandboxes/:id', { config: read }, async (req) => {
      const rec = await liveRecord(req.params.id, principalOf(req).team);
      return toE2bDetail(rec, await envdToken(deps, rec));
    });

    app.delete<IdReq>('/sandboxes/:id', { config: write }, async (req, reply) => {
      const team = principalOf(req).team;
      await liveRecord(req.params.id, team);
      const op = await deleteSandbox(deps, team, req.params.id);
      await settle(op.id, MAX_WAIT_MS);
      req.log.info({ [F.sandboxId]: req.params.id }, 'e2b sandbox killed');
      return reply.status(204).send();
    });

    app.post<IdReq & { Body: { timeout: number } }>(
      '/sandboxes/:id/timeout',
      { schema: { body: TimeoutSchema }, config: write },
      async (req, reply) => {
        await liveRecord(req.params.id, principalOf(req).team);
        await setTimeoutSec(req.params.id, req.body.timeout);
        return reply.status(204).send();
      },
    );

    app.post<IdReq>(
      '/sandboxes/:id/pause',
      { schema: { body: PauseSchema }, config: write },
      async (req, reply) => {
        const rec = await liveRecord(req.params.id, principalOf(req).team);
        if ((req.body as { memory?: boolean } | null)?.memory === false)
          throw memoryLess('pause({ keepMemory: false })');
        if (e2bState(rec.state) === 'paused') {
          throw new SpaceError('SANDBOX_PAUSED', `sandbox "${rec.id}" is already paused`);
        }
        const op = await pauseSandbox(deps, rec.team, rec.id, undefined, req.log);
        await settle(op.id, MAX_WAIT_MS);
        return reply.status(204).send();
      },
    );

    const connectRoute = async (
      req: FastifyRequest<IdReq>,
      reply: { status(n: number): { send(b: unknown): unknown } },
    ) => {
      const body = req.body as { timeout?: number; memory?: boolean } | undefined;
      const r = await connect(
        req.params.id,
        principalOf(req).team,
        body?.timeout || E2B_DEFAULT_TIMEOUT_SEC,
        req.log,
        body?.memory === false,
      );
      return reply.status(r.status).send(r.body);
    };
    const connectOpts = { schema: { body: ConnectSchema }, config: write };
    app.post<IdReq>('/sandboxes/:id/connect', connectOpts, connectRoute);
    app.post<IdReq>('/v2/sandboxes/:id/connect', connectOpts, connectRoute);
    // deprecated in E2B, still served: resume = connect that resumes a paused sandbox
    app.post<IdReq>('/sandboxes/:id/resume', connectOpts, connectRoute);

    // PUT …/network replaces the whole egress configuration (§1.8), as SPACE's PATCH …/egress does
    app.put<IdReq & { Body: E2bNetwork & { allow_internet_access?: boolean } }>(
      '/sandboxes/:id/network',
      { schema: { body: NetworkSchema }, config: write },
      async (req, reply) => {
        const team = principalOf(req).team;
        await liveRecord(req.params.id, team);
        // SPACE's egress policy, checked as PATCH /v1/sandboxes/:id/egress checks it
        const policy = egressOf(req.body.allow_internet_access, req.body);
        checkBody(EgressPolicySchema, policy);
        await replaceEgress(deps, team, req.params.id, policy, req.log);
        return reply.status(204).send();
      },
    );

    for (const [method, url, what] of E2B_UNSERVED) {
      app.route({
        method: method as 'GET',
        url,
        config: { public: true, unserved: true },
        schema: { hide: true },
        handler: async () => {
          throw new SpaceError(
            'NOT_IMPLEMENTED',
            `${what} is not served by this SPACE server yet (${method} ${url})`,
          );
        },
      });
    }
  };
}

/** A SPACE operation that has not ended within the route's wait (answered as 504). */
class TimeoutOf extends Error {
  constructor(operationId: string) {
    super(`operation ${operationId} has not finished yet; try again`);
  }
}

/**
 * The refusal of a filesystem-only pause or resume (E2B's `memory: false`): every SPACE pause keeps
 * the sandbox's memory (frozen, or hibernated with its memory snapshot), and a cold boot from the
 * file system alone is not built yet. Refused rather than done as a memory pause.
 */
function memoryLess(what: string): SpaceError {
  return new SpaceError(
    'NOT_IMPLEMENTED',
    `${what} is not served by this SPACE server yet: its pauses keep the sandbox's memory (leave keepMemory/memory unset or true)`,
  );
}

/**
 * SPACE's lifecycle options for E2B's create keys (§3.4 of the reference; the SDK's
 * `lifecycle: { onTimeout, autoResume }` becomes `autoPause`, `autoPauseMemory`,
 * `autoResume.enabled`): `autoPause` ⇒ `onTimeout: 'pause'`; `autoResume.enabled` ⇒ `autoResume`
 * (absent: SPACE's default, traffic resumes — E2B's default is not to). As E2B's API: 400 for
 * `autoPauseMemory: false` without `autoPause` or with auto-resume on.
 * @throws SpaceError BAD_REQUEST as above; NOT_IMPLEMENTED for `autoPauseMemory: false`
 *   (a filesystem-only pause).
 */
export function lifecycleOf(b: {
  autoPause?: boolean;
  autoPauseMemory?: boolean;
  autoResume?: { enabled?: boolean } | null;
}): { onTimeout: 'kill' | 'pause'; autoResume?: boolean } {
  const enabled = b.autoResume?.enabled;
  if (b.autoPauseMemory === false) {
    if (!b.autoPause) throw new SpaceError('BAD_REQUEST', 'autoPauseMemory: false needs autoPause: true');
    if (enabled) {
      throw new SpaceError('BAD_REQUEST', 'autoResume cannot be enabled with autoPauseMemory: false');
    }
    throw memoryLess("lifecycle onTimeout { action: 'pause', keepMemory: false }");
  }
  return {
    onTimeout: b.autoPause ? 'pause' : 'kill',
    ...(enabled === undefined ? {} : { autoResume: enabled }),
  };
}
