/**
 * The data-plane routes, declared once: the node agent serves them, the router forwards exactly
 * these (and nothing else: the agent's `/internal/…` routes never cross the router). Each route
 * names the session-token scope it needs. `data-plane.test.ts` checks the agent registers the
 * same table.
 */
import type { SessionScope } from './tokens.ts';

/**
 * How the agent admits a data-plane request once its session token (for the sandbox `:id`, the
 * route's scope and the sandbox's session) is verified — one hook, `runtime/agent/routes/auth.ts`:
 * - `guest`: the sandbox runs on this node and is not paused; the request holds its guest until
 *   its response closes (a pause waits for it first);
 * - `sandbox`: the sandbox runs on this node, paused or not; no hold on the guest (a long watch);
 * - `spool`: as `sandbox`, and a sandbox hibernated into this node's store is served from there
 *   (its spooled command output, case R27).
 * Any other sandbox hibernated into the store is refused with SANDBOX_PAUSED.
 */
export type DataPlaneAuth = 'guest' | 'sandbox' | 'spool';

/** One data-plane route: HTTP method, Fastify path pattern (`:id` = sandbox id), scope, auth kind. */
export interface DataPlaneRoute {
  /** Short stable name, used as a metrics label. */
  readonly name: string;
  readonly method: 'GET' | 'POST' | 'PUT' | 'DELETE';
  readonly path: string;
  readonly scope: SessionScope;
  readonly auth: DataPlaneAuth;
  /** True when the route streams its answer for long (SSE): counted as a stream. */
  readonly stream?: boolean;
  /**
   * False: the agent serves it but the router does not forward it as is; only the router's own
   * E2B data plane calls it (starting commands stays an API call for SPACE clients).
   */
  readonly forwarded?: false;
  /**
   * The request body it takes: `json` (at most {@link DATA_PLANE_JSON_BODY_LIMIT} bytes, as is any
   * body of a route without one), `upload` (a file's bytes, at most the upload limit,
   * `SPACE_MAX_UPLOAD_BYTES`), `stream` (stdin: no limit). Every hop refuses a body over its limit
   * with 413 BODY_TOO_LARGE as soon as it sees the size (R23).
   */
  readonly body?: 'json' | 'upload' | 'stream';
}

/** Largest JSON body of a data-plane route, bytes (1 MiB): the agent's and the router's limit. */
export const DATA_PLANE_JSON_BODY_LIMIT = 1_048_576;

/** Every data-plane route, on the agent and through the router (paths are the same on both). */
export const DATA_PLANE_ROUTES = [
  // starting a command with a session token: what the router's E2B data plane does for an envd
  // `Process/Start` (its access token is a session token with the `commands` scope)
  {
    name: 'command.start',
    method: 'POST',
    path: '/v1/sandboxes/:id/commands',
    scope: 'commands',
    auth: 'guest',
    forwarded: false,
    body: 'json',
  },
  {
    name: 'command.events',
    method: 'GET',
    path: '/v1/sandboxes/:id/commands/:cmd/events',
    scope: 'commands',
    auth: 'spool',
    stream: true,
  },
  // the commands of the sandbox (running ones; `?all=true` also ended ones), filtered by `pid` or
  // `tag`: how any router replica finds a command by the pid an E2B client holds
  {
    name: 'command.list',
    method: 'GET',
    path: '/v1/sandboxes/:id/commands',
    scope: 'commands',
    auth: 'spool',
  },
  {
    name: 'command.get',
    method: 'GET',
    path: '/v1/sandboxes/:id/commands/:cmd',
    scope: 'commands',
    auth: 'spool',
  },
  {
    name: 'command.stdin',
    method: 'POST',
    path: '/v1/sandboxes/:id/commands/:cmd/stdin',
    scope: 'commands',
    auth: 'guest',
    body: 'stream',
  },
  {
    name: 'command.stdin-close',
    method: 'POST',
    path: '/v1/sandboxes/:id/commands/:cmd/stdin/close',
    scope: 'commands',
    auth: 'guest',
  },
  // a PTY command's terminal size
  {
    name: 'command.resize',
    method: 'POST',
    path: '/v1/sandboxes/:id/commands/:cmd/resize',
    scope: 'commands',
    auth: 'guest',
    body: 'json',
  },
  {
    name: 'command.signal',
    method: 'POST',
    path: '/v1/sandboxes/:id/commands/:cmd/signal',
    scope: 'commands',
    auth: 'guest',
    body: 'json',
  },
  { name: 'files.read', method: 'GET', path: '/v1/sandboxes/:id/files', scope: 'files', auth: 'guest' },
  {
    name: 'files.write',
    method: 'PUT',
    path: '/v1/sandboxes/:id/files',
    scope: 'files',
    auth: 'guest',
    body: 'upload',
  },
  { name: 'fs.stat', method: 'GET', path: '/v1/sandboxes/:id/fs/stat', scope: 'files', auth: 'guest' },
  { name: 'fs.list', method: 'GET', path: '/v1/sandboxes/:id/fs/list', scope: 'files', auth: 'guest' },
  {
    name: 'fs.mkdir',
    method: 'POST',
    path: '/v1/sandboxes/:id/fs/mkdir',
    scope: 'files',
    auth: 'guest',
    body: 'json',
  },
  { name: 'fs.remove', method: 'DELETE', path: '/v1/sandboxes/:id/fs', scope: 'files', auth: 'guest' },
  {
    name: 'fs.rename',
    method: 'POST',
    path: '/v1/sandboxes/:id/fs/rename',
    scope: 'files',
    auth: 'guest',
    body: 'json',
  },
  // NDJSON lines of core/guest-protocol.ts WatchEvent, `start` first, until the client leaves
  {
    name: 'fs.watch',
    method: 'GET',
    path: '/v1/sandboxes/:id/fs/watch',
    scope: 'files',
    auth: 'sandbox',
    stream: true,
  },
] as const satisfies readonly DataPlaneRoute[];

/**
 * One row of `GET /v1/sandboxes/:id/commands` (`{ commands: CommandSummary[] }`, newest first).
 * `cmd`/`args`/`env`/`cwd` are what the command was started with (empty for commands an agent
 * before this field re-adopted).
 */
export interface CommandSummary {
  /** Command id (`cmd…`). */
  id: string;
  /** Process id in the sandbox. */
  pid: number;
  running: boolean;
  /** Epoch ms. */
  startedAt: number;
  cmd: string;
  args: string[];
  env: Record<string, string>;
  cwd?: string;
  tag?: string;
  /** Set when it runs on a pseudo-terminal: its size at start. */
  pty?: { cols: number; rows: number };
}

/**
 * The session token of a data-plane request: `Authorization: Bearer <t>` first, else `?token=`.
 * Returns undefined when neither is present. Pure.
 */
export function sessionTokenOf(
  authorization: string | undefined,
  query: URLSearchParams,
): string | undefined {
  const header = /^Bearer\s+(\S+)$/i.exec(authorization ?? '')?.[1];
  return header ?? (query.get('token') || undefined);
}
