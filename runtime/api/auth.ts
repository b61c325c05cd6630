/**
 * Authentication, scopes and the audit trail as hooks (a route cannot forget them): every route
 * names in its config either `public: true` or the one `scope` its key must carry; the app refuses
 * to build when a route names neither. The `onRequest` hook authenticates the key (Redis, every
 * request) and checks the scope; the `onResponse` hook audits every mutating call of a known key.
 */
import type { FastifyInstance, FastifyRequest } from 'fastify';
import { SpaceError } from '../core/errors.ts';
import type { ApiScope } from '../core/tenancy.ts';
import type { ApiKeyStore, Principal } from './api-keys.ts';
import { type AuditLog, auditResult } from './audit.ts';

declare module 'fastify' {
  interface FastifyContextConfig {
    /** The scope a key must carry for this route. */
    scope?: ApiScope;
    /** True for routes that need no key (health, metrics, the OpenAPI document). */
    public?: boolean;
    /** True for E2B routes: authenticated by their own hook (`X-API-KEY`). */
    e2b?: boolean;
    /** True for E2B routes SPACE does not serve: 501 whatever the auth (e2b/routes.ts). */
    unserved?: boolean;
  }
  interface FastifyRequest {
    /** The key that authenticated the request (absent on public routes). */
    auth?: Principal;
    /** What a mutating call acted on, when its params don't say (e.g. the id of a new sandbox). */
    auditTarget?: string;
    /** Error code the request was answered with (set by the error hook, for the audit). */
    auditCode?: string;
  }
}

const MUTATING = new Set(['POST', 'PUT', 'PATCH', 'DELETE']);

/** The principal of an authenticated request. @throws SpaceError UNAUTHENTICATED when there is none. */
export function principalOf(req: FastifyRequest): Principal {
  if (!req.auth) throw new SpaceError('UNAUTHENTICATED', 'this route needs an API key');
  return req.auth;
}

/**
 * @throws SpaceError SCOPE_DENIED when `p` lacks `scope`.
 */
export function requireScope(p: Principal, scope: ApiScope): void {
  if (!p.scopes.has(scope)) {
    throw new SpaceError('SCOPE_DENIED', `this API key lacks the scope "${scope}"`, {
      scope,
      keyId: p.keyId,
    });
  }
}

/**
 * The team a request acts on: its key's own, or `asked` — another team only for a key with
 * `teams:admin`. @throws SpaceError SCOPE_DENIED.
 */
export function actingTeam(p: Principal, asked: string | undefined): string {
  if (asked === undefined || asked === p.team) return p.team;
  if (!p.scopes.has('teams:admin')) {
    throw new SpaceError('SCOPE_DENIED', 'acting on another team needs the scope "teams:admin"', {
      scope: 'teams:admin',
      team: asked,
    });
  }
  return asked;
}

/**
 * Installs the hooks on `app` (before any route is registered). Call the returned `check()` after
 * every route is registered: it throws naming every route without `scope` or `public`.
 */
export function installAuth(
  app: FastifyInstance,
  deps: { apiKeys: ApiKeyStore; audit: AuditLog },
): { check(): void } {
  const unscoped: string[] = [];
  app.addHook('onRoute', (route) => {
    const c = route.config as { scope?: string; public?: boolean } | undefined;
    if (!c?.public && !c?.scope) unscoped.push(`${String(route.method)} ${route.url}`);
  });
  app.addHook('onRequest', async (req) => {
    const c = req.routeOptions.config;
    // no route: 404 whoever asks (an E2B client told "missing Bearer header" checks its key)
    if (c.public || c.e2b || req.routeOptions.url === undefined) return;
    req.auth = await deps.apiKeys.authenticate(req.headers.authorization);
    if (c.scope) requireScope(req.auth, c.scope);
  });
  app.addHook('onError', async (req, _reply, err) => {
    req.auditCode = err instanceof SpaceError ? err.code : (err as { code?: string }).code;
  });
  app.addHook('onResponse', async (req, reply) => {
    if (!req.auth || !MUTATING.has(req.method) || !req.routeOptions.url) return;
    const params = (req.params ?? {}) as Record<string, string | undefined>;
    await deps.audit.record({
      team: req.auth.team,
      keyId: req.auth.keyId,
      action: `${req.method} ${req.routeOptions.url}`,
      target: req.auditTarget ?? params.id ?? params.name ?? '',
      result: auditResult(reply.statusCode),
      status: reply.statusCode,
      code: reply.statusCode >= 400 ? (req.auditCode ?? null) : null,
    });
  });
  return {
    check() {
      if (unscoped.length > 0) {
        throw new Error(`routes without a scope or public: true: ${unscoped.join(', ')}`);
      }
    },
  };
}
