/**
 * The data plane's one token hook. Every data-plane route is registered from its row of
 * `DATA_PLANE_ROUTES` (`core/data-plane.ts`), which names its session-token scope and its auth kind
 * (`DataPlaneAuth`); this hook admits each request by that row before its handler runs, and the
 * handler reads what was admitted ({@link DataPlaneGate.sandbox}, {@link DataPlaneGate.hibernated}).
 * Tokens go in `Authorization: Bearer` or `?token=`; a token for another sandbox, another session of
 * this sandbox, or without the route's scope is refused.
 */
import type { FastifyRequest } from 'fastify';
import { DATA_PLANE_ROUTES, type DataPlaneRoute } from '../../core/data-plane.ts';
import { SpaceError } from '../../core/errors.ts';
import { type SessionClaims, verifySessionToken } from '../../core/tokens.ts';
import type { AgentDeps } from '../app.ts';
import type { HibernatedView } from '../sandboxes/hibernated-view.ts';
import type { LocalSandbox } from '../sandboxes/manager.ts';

/** Name of a declared data-plane route. */
export type DataPlaneRouteName = (typeof DATA_PLANE_ROUTES)[number]['name'];

/** Where a route's row of the table rides on the Fastify route (`config`). */
interface RouteConfig {
  dataPlane?: DataPlaneRoute;
}

/**
 * Method, URL and config of the declared route `name`, for `app.route({ ...declared(name), schema,
 * handler })`: the table is the one place a data-plane route's method, path, scope and auth kind
 * are written.
 * @throws Error when no route has that name (a programming error).
 */
export function declared(name: DataPlaneRouteName): {
  method: DataPlaneRoute['method'];
  url: string;
  config: RouteConfig;
} {
  const route = DATA_PLANE_ROUTES.find((r) => r.name === name);
  if (!route) throw new Error(`no data-plane route ${name}`);
  return { method: route.method, url: route.path, config: { dataPlane: route } };
}

/** The admitted request's sandbox: running here, or hibernated in this node's store (`spool` routes). */
type Admitted = { sb: LocalSandbox; claims: SessionClaims } | { hib: HibernatedView };

/** The hook and what handlers read of it. */
export interface DataPlaneGate {
  /** The `preHandler` hook (after validation, as the hand-written checks it replaces ran). */
  hook: (req: FastifyRequest) => Promise<void>;
  /** The running sandbox `req` was admitted to. @throws Error when it was not (a programming error). */
  sandbox(req: FastifyRequest): LocalSandbox;
  /** The hibernated sandbox a `spool` route's request was admitted to, else undefined. */
  hibernated(req: FastifyRequest): HibernatedView | undefined;
  /** The verified token of a request admitted to a running sandbox. */
  claims(req: FastifyRequest): SessionClaims | undefined;
  /** Ends the activity (metering) and guest hold of `req` (its response closed). Idempotent. */
  release(req: FastifyRequest): void;
}

/** The data plane's token hook over `deps` (see the module doc). */
export function dataPlaneGate(deps: AgentDeps): DataPlaneGate {
  const admitted = new WeakMap<object, Admitted>();
  /** Ends the activity (metering) and guest hold of each admitted request once its response closes. */
  const activityEnds = new WeakMap<object, () => void>();

  /** @throws SpaceError TOKEN_SCOPE when the token is of another session than `sessionId`. */
  function sameSession(claims: SessionClaims, sessionId: string | undefined): void {
    if (sessionId !== undefined && claims.sessionId !== sessionId)
      throw new SpaceError('TOKEN_SCOPE', 'token is for another session');
  }

  /**
   * Admits `req` to sandbox `id` as `route` declares: the session token's sandbox, scope and
   * session first; then, for a sandbox hibernated into this node's store, its spool (`spool`) or
   * SANDBOX_PAUSED (its guest cannot answer; the router resumes it and retries); else the running
   * sandbox (SANDBOX_NOT_FOUND), held for its guest (`guest`: SANDBOX_PAUSED while paused) and
   * counted as activity until the response closes.
   */
  async function admit(req: FastifyRequest, route: DataPlaneRoute, id: string): Promise<void> {
    const header = /^Bearer\s+(\S+)$/i.exec(req.headers.authorization ?? '')?.[1];
    const token = header ?? (req.query as { token?: string } | undefined)?.token;
    if (!token)
      throw new SpaceError('UNAUTHENTICATED', 'session token required (Authorization: Bearer or ?token=)');
    const claims = await verifySessionToken(deps.verifyKey, token, { sandboxId: id, scope: route.scope });
    if (!deps.sandboxes.find(id)) {
      // hibernated into this node's store: paused, as the docs say, not unknown (R27)
      const hib = await deps.sandboxes.hibernated(id);
      if (hib) {
        sameSession(claims, hib.sessionId);
        if (route.auth === 'spool') {
          admitted.set(req.raw, { hib });
          return;
        }
        throw new SpaceError('SANDBOX_PAUSED', `sandbox ${id} is hibernated; resume it first`, {
          sandboxId: id,
          mode: 'hibernated',
        });
      }
    }
    const sb = deps.sandboxes.get(id);
    sameSession(claims, sb.sessionId);
    admitted.set(req.raw, { sb, claims });
    // a guest call holds the guest until its response closes: a pause waits for it first
    const release = route.auth === 'guest' ? deps.sandboxes.holdGuest(id).release : () => {};
    const endActivity = deps.sandboxes.beginActivity(id);
    activityEnds.set(req.raw, () => {
      release();
      endActivity();
    });
  }

  return {
    hook: async (req) => {
      const route = (req.routeOptions.config as RouteConfig).dataPlane;
      if (!route) return;
      await admit(req, route, (req.params as { id: string }).id);
    },
    sandbox(req) {
      const a = admitted.get(req.raw);
      if (!a || !('sb' in a)) throw new Error('the request was not admitted to a running sandbox');
      return a.sb;
    },
    hibernated(req) {
      const a = admitted.get(req.raw);
      return a && 'hib' in a ? a.hib : undefined;
    },
    claims(req) {
      const a = admitted.get(req.raw);
      return a && 'claims' in a ? a.claims : undefined;
    },
    release(req) {
      const end = activityEnds.get(req.raw);
      activityEnds.delete(req.raw);
      end?.();
    },
  };
}
