/**
 * How the router's envd layer talks to a sandbox's agent: the data-plane routes of
 * `core/data-plane.ts`, authorised by the request's own session token (the E2B access token), and
 * SPACE's errors turned into Connect errors in the E2B SDK's terms (its Connect error mapping,
 * https://github.com/e2b-dev/e2b: Unavailable reads as "sandbox not running", NotFound as not
 * found, …).
 */
import type { Readable } from 'node:stream';
import { Code, ConnectError, createContextKey, type HandlerContext } from '@connectrpc/connect';
import type { Context } from '@opentelemetry/api';
import type { Dispatcher } from 'undici';
import { SpaceError } from '../../core/errors.ts';
import { injectTraceHeaders, inSpan } from '../../core/tracing.ts';
import type { RouterDeps } from '../app.ts';
import { ENVD_USERS, type EnvdUser, envdUserOf } from './paths.ts';

/** Who a checked envd request is for: the sandbox and the session token that was verified for it. */
export interface Target {
  sandboxId: string;
  token: string;
  /** The token's team (the default team for tokens minted before teams). */
  team: string;
  /**
   * What was asked, as the span attribute `space.route`: the Connect method
   * (`process.Process/Start`) or `files.read` / `files.write`.
   */
  route: string;
  /** The caller's trace context (its W3C `traceparent`): the agent calls made for it join it. */
  trace: Context;
}

/** Context key the Connect handlers read their checked {@link Target} from. */
export const kTarget = createContextKey<Target | null>(null);

/** The checked target of a Connect call. @throws ConnectError Unauthenticated when none was set. */
export function target(ctx: HandlerContext): Target {
  const t = ctx.values.get(kTarget);
  if (!t) throw new ConnectError('no sandbox for this request', Code.Unauthenticated);
  return t;
}

/**
 * The user a call acts as (Basic auth username; §2.1).
 * @throws ConnectError InvalidArgument for a user SPACE sandboxes do not have.
 */
export function userOf(ctx: HandlerContext): EnvdUser {
  const user = envdUserOf(ctx.requestHeader.get('authorization'));
  if (!user) {
    throw new ConnectError(
      `unknown user: SPACE sandboxes offer ${Object.keys(ENVD_USERS).join(' and ')}`,
      Code.InvalidArgument,
    );
  }
  return user;
}

/** A Connect error for a SPACE error code and HTTP status (an agent's error body, or a thrown one). Pure. */
export function connectErrorOf(status: number, code: string, message: string): ConnectError {
  if (code === 'SANDBOX_NOT_FOUND' || code === 'SANDBOX_NOT_RUNNING' || code === 'NODE_UNAVAILABLE') {
    return new ConnectError(message, Code.Unavailable);
  }
  if (status === 404) return new ConnectError(message, Code.NotFound);
  if (status === 400 || status === 422) return new ConnectError(message, Code.InvalidArgument);
  if (status === 401) return new ConnectError(message, Code.Unauthenticated);
  if (status === 403) return new ConnectError(message, Code.PermissionDenied);
  if (status === 409) return new ConnectError(message, Code.FailedPrecondition);
  if (status === 413) return new ConnectError(message, Code.ResourceExhausted);
  if (status === 429) return new ConnectError(message, Code.ResourceExhausted);
  if (status === 501) return new ConnectError(message, Code.Unimplemented);
  return new ConnectError(message, Code.Internal);
}

/** The `{ error: { code, message } }` body of an agent's refusal, as a Connect error. Pure. */
export function connectErrorOfBody(status: number, text: string): ConnectError {
  let err = { code: '', message: text };
  try {
    err = (JSON.parse(text) as { error: typeof err }).error;
  } catch {}
  return connectErrorOf(status, err.code, err.message);
}

/** Calls on one sandbox's agent data plane. */
export interface Upstream {
  /**
   * Sends a request to the agent serving `t.sandboxId` (resuming a paused sandbox first, as the
   * router does for its own routes), with `t.token` as the bearer. The answer is returned as is.
   * @throws ConnectError Unavailable when the sandbox is gone or its node is down.
   */
  request(
    t: Target,
    method: Dispatcher.HttpMethod,
    path: string,
    body?: { json?: unknown; raw?: Buffer | Readable; type?: string; headers?: Record<string, string> },
    signal?: AbortSignal,
  ): Promise<Dispatcher.ResponseData>;
  /**
   * As {@link Upstream.request}, for JSON answers: the parsed body, or the agent's refusal as a
   * ConnectError.
   */
  json<T>(t: Target, method: Dispatcher.HttpMethod, path: string, json?: unknown): Promise<T>;
}

/** The agent client of the envd layer over the router's locator and upstream dispatcher. */
export function createUpstream(deps: RouterDeps): Upstream {
  /** One agent call (see {@link Upstream.request}), inside its span. */
  async function send(...[t, method, path, body, signal]: Parameters<Upstream['request']>) {
    let loc: Awaited<ReturnType<typeof deps.proxy.locator.locate>>;
    try {
      loc = await deps.proxy.locator.locate(t.sandboxId, { team: t.team });
    } catch (err) {
      if (err instanceof SpaceError) throw connectErrorOf(err.status, err.code, err.message);
      throw err;
    }
    // the agent's spans are children of this call's
    const headers = injectTraceHeaders<Record<string, string>>({
      ...body?.headers,
      authorization: `Bearer ${t.token}`,
    });
    let payload: string | Buffer | Readable | null = null;
    if (body?.json !== undefined) {
      headers['content-type'] = 'application/json';
      payload = JSON.stringify(body.json);
    } else if (body?.raw !== undefined) {
      headers['content-type'] = body.type ?? 'application/octet-stream';
      payload = body.raw;
    }
    try {
      return await deps.proxy.dispatcher.request({
        origin: loc.url,
        path,
        method,
        headers,
        body: payload,
        ...(signal ? { signal } : {}),
      });
    } catch (err) {
      if (signal?.aborted) throw new ConnectError('the client went away', Code.Canceled);
      throw new ConnectError(
        `node of sandbox ${t.sandboxId} did not answer`,
        Code.Unavailable,
        undefined,
        [],
        err,
      );
    }
  }
  const up: Upstream = {
    // one span per agent call (a ListDir makes several), as the router's own routes have
    request: (...args) =>
      inSpan(
        'router.forward',
        { 'space.route': args[0].route, 'space.sandbox.id': args[0].sandboxId },
        () => send(...args),
        args[0].trace,
      ),
    async json<T>(t: Target, method: Dispatcher.HttpMethod, path: string, json?: unknown) {
      const res = await up.request(t, method, path, json === undefined ? undefined : { json });
      const text = await res.body.text();
      if (res.statusCode >= 400) throw connectErrorOfBody(res.statusCode, text);
      return (text ? JSON.parse(text) : {}) as T;
    },
  };
  return up;
}

/** The agent data-plane path of sandbox `t` (`/v1/sandboxes/<id>`). Pure. */
export const sandboxPath = (t: Target): string => `/v1/sandboxes/${t.sandboxId}`;
