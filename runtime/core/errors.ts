/**
 * The one error registry of SPACE. Every error a service returns to a client has a stable
 * `code` from this table, an HTTP status and a `retryable` flag. Codes are never reused once
 * retired; the error table of docs/api.md lists exactly these rows (a unit test checks both ways).
 *
 * Wire shape (every service): `{ "error": { "code": "SANDBOX_NOT_FOUND", "message": "…", "details"?: {…} } }`.
 */

/** Static description of one error code. */
export interface ErrorSpec {
  /** HTTP status code returned with this error. */
  readonly status: number;
  /** Whether the same request may succeed if retried unchanged later. */
  readonly retryable: boolean;
  /** One-line meaning, copied into the error table of docs/api.md. */
  readonly doc: string;
}

/** Every error code SPACE can return, with its status and meaning. */
export const ERROR_CODES = {
  BAD_REQUEST: { status: 400, retryable: false, doc: 'The body, params or query failed validation.' },
  BODY_TOO_LARGE: {
    status: 413,
    retryable: false,
    doc: 'The request body exceeds the size limit (answered by the first hop that sees the size: router, API or agent).',
  },
  HEADERS_TOO_LARGE: {
    status: 431,
    retryable: false,
    doc: 'The request headers (URL included) are larger than the server accepts.',
  },
  REQUEST_TIMEOUT: {
    status: 408,
    retryable: true,
    doc: 'The request (its headers or body) did not arrive in time; the connection is closed.',
  },
  PATH_INVALID: {
    status: 400,
    retryable: false,
    doc: 'A sandbox file path is malformed, escapes with `..`, or names a platform-owned location.',
  },
  UNAUTHENTICATED: { status: 401, retryable: false, doc: 'No credentials, or an unknown API key.' },
  API_KEY_EXPIRED: {
    status: 401,
    retryable: false,
    doc: 'The API key has expired (or its rotation overlap ended); use its successor or ask for a new key.',
  },
  SCOPE_DENIED: {
    status: 403,
    retryable: false,
    doc: 'The API key lacks the scope this route needs (`details.scope`), or may not act on that team.',
  },
  QUOTA_EXCEEDED: {
    status: 403,
    retryable: false,
    doc: 'The team is at one of its quotas (`details.quota`, `details.limit`, `details.current`); end sandboxes or raise the quota.',
  },
  TOKEN_INVALID: { status: 401, retryable: false, doc: 'The session token is malformed or badly signed.' },
  TOKEN_EXPIRED: {
    status: 401,
    retryable: false,
    doc: 'The session token has expired; ask the API for a new one.',
  },
  TOKEN_SCOPE: {
    status: 403,
    retryable: false,
    doc: 'The session token is for another sandbox, session or scope.',
  },
  NOT_FOUND: { status: 404, retryable: false, doc: 'No such route.' },
  NOT_IMPLEMENTED: {
    status: 501,
    retryable: false,
    doc: 'A route or option of the E2B API (docs/e2b.md) that SPACE does not serve yet (snapshots, fork, templates, volumes, logs, a filesystem-only pause…); the message names it.',
  },
  SANDBOX_NOT_FOUND: { status: 404, retryable: false, doc: 'No sandbox with this id (or it was deleted).' },
  SANDBOX_NOT_RUNNING: { status: 409, retryable: true, doc: 'The sandbox is not in the running state.' },
  SANDBOX_PAUSED: {
    status: 409,
    retryable: true,
    doc: 'The sandbox is paused; resume it (the router and `POST …/commands` resume it themselves; the router not when it was created with `autoResume: false`, `details.autoResume`) and retry.',
  },
  SANDBOX_BUSY: {
    status: 409,
    retryable: true,
    doc: 'A pause could not start: calls to the sandbox’s guest (an upload, a command start) did not finish in time; or a terminal did not take its new size in time (its output is not being read); retry.',
  },
  OPERATION_NOT_FOUND: { status: 404, retryable: false, doc: 'No operation with this id.' },
  COMMAND_NOT_FOUND: { status: 404, retryable: false, doc: 'No command with this id in the sandbox.' },
  PROCESS_EXITED: { status: 409, retryable: false, doc: 'The command has exited or closed its stdin.' },
  OUTPUT_GONE: {
    status: 409,
    retryable: false,
    doc: 'The requested output offset is no longer held by the guest (outside its replay window).',
  },
  FILE_NOT_FOUND: { status: 404, retryable: false, doc: 'No file or directory at this path in the sandbox.' },
  DISK_FULL: {
    status: 507,
    retryable: false,
    doc: 'The sandbox’s file system has no space left for the write (ENOSPC, or its quota); free space and retry.',
  },
  FILE_CONFLICT: {
    status: 409,
    retryable: false,
    doc: 'The path exists with the wrong type (a directory where a file is expected, or a non-empty directory).',
  },
  TEAM_NOT_FOUND: { status: 404, retryable: false, doc: 'No team with this id.' },
  TEAM_EXISTS: { status: 409, retryable: false, doc: 'A team with this id exists already.' },
  API_KEY_NOT_FOUND: {
    status: 404,
    retryable: false,
    doc: 'No API key with this id in the caller’s team (or it was revoked).',
  },
  CREDENTIAL_NOT_FOUND: { status: 404, retryable: false, doc: 'No credential with this name is registered.' },
  TEMPLATE_NOT_FOUND: { status: 404, retryable: false, doc: 'No template with this name.' },
  TEMPLATE_NOT_READY: {
    status: 409,
    retryable: true,
    doc: 'The template exists but is not built on any node.',
  },
  TEMPLATE_START_FAILED: {
    status: 500,
    retryable: false,
    doc: "The template's start command did not pass its ready check in time (the message has its log's tail).",
  },
  IDEMPOTENCY_CONFLICT: {
    status: 422,
    retryable: false,
    doc: 'The Idempotency-Key was used before with a different request body.',
  },
  NODE_CAPACITY_EXHAUSTED: {
    status: 503,
    retryable: true,
    doc: 'No node has room for the sandbox right now (CPU, memory or sandbox count): a create is refused at POST, nothing written; retry after the `Retry-After` header’s seconds (E2B routes: 429). A shape no node could ever hold is `SHAPE_TOO_LARGE`.',
  },
  NODE_DISK_FULL: {
    status: 507,
    retryable: true,
    doc: 'The node’s own state disk has no room for this (a create, a command’s record or output); the sandbox keeps running, and the node takes no new sandboxes until space is freed.',
  },
  NODE_UNAVAILABLE: { status: 503, retryable: true, doc: 'The node holding the sandbox is not reachable.' },
  NODE_NOT_FOUND: { status: 404, retryable: false, doc: 'No node with this id is registered.' },
  HIBERNATE_STORE_LOCAL: {
    status: 409,
    retryable: false,
    doc: 'A drain was asked to hibernate the node’s sandboxes, but the node’s hibernation store is its own disk: they could not resume on another node (set `SPACE_HIBERNATE_STORE`/`_DIR` to shared storage, or drain without hibernating).',
  },
  WRITE_NOT_REPLICATED: {
    status: 503,
    retryable: true,
    doc: 'The change was made on the Redis primary but no replica acknowledged it in time (`SPACE_REDIS_WAIT_REPLICAS`): a failover now could lose it; read it back, or retry.',
  },
  UPSTREAM_UNAVAILABLE: {
    status: 503,
    retryable: true,
    doc: 'Answered by the load balancer in front of the APIs or routers (`space up --ha`): no member is ready, or the member died holding the request; retry after `Retry-After` (a change may have been made: read it back before repeating).',
  },
  CONTROL_PLANE_UNAVAILABLE: {
    status: 503,
    retryable: true,
    doc: 'The control plane’s store (Redis) cannot be reached right now (restarting, failing over); retry after the `Retry-After` header’s seconds.',
  },
  DRIVER_FAILED: {
    status: 500,
    retryable: true,
    doc: 'The VM driver failed to create or control a sandbox.',
  },
  NODE_UNSUPPORTED: {
    status: 409,
    retryable: false,
    doc: 'The node runs an agent one release older that cannot do this (e.g. pause); it can once upgraded.',
  },
  SNAPSHOT_UNSUPPORTED: {
    status: 501,
    retryable: false,
    doc: 'The node’s driver cannot snapshot sandboxes.',
  },
  SHAPE_UNSUPPORTED: {
    status: 400,
    retryable: false,
    doc: 'No node’s driver can run this vCPU/memory shape (e.g. Firecracker takes 1 or an even number of vCPUs).',
  },
  SHAPE_TOO_LARGE: {
    status: 400,
    retryable: false,
    doc: 'The vCPU/memory shape is larger than any node on offer (`details.largest`: the largest vCPUs and memory a sandbox can have); it can never be placed as asked.',
  },
  INSTANCE_LOST: {
    status: 410,
    retryable: false,
    doc: 'The sandbox’s VM (or its VMM process) is gone from its node.',
  },
  SANDBOX_CRASHED: {
    status: 410,
    retryable: false,
    doc: 'The sandbox ended on its own (out of memory or processes, or its kernel failed); its record’s endMessage names the cause.',
  },
  GUEST_UNAVAILABLE: {
    status: 502,
    retryable: true,
    doc: 'The guest daemon inside the sandbox did not answer.',
  },
  PORT_CLOSED: {
    status: 502,
    retryable: true,
    doc: 'Nothing in the sandbox listens on the port a request through the router (`<port>-<id>.<domain>`) asked for.',
  },
  RATE_LIMITED: {
    status: 429,
    retryable: true,
    doc: 'Too many requests or concurrent streams (a team’s creates per minute or open streams: `details.quota`, `details.limit`).',
  },
  INTERNAL: { status: 500, retryable: true, doc: 'An unexpected server error; the log has the details.' },
  // `space backup` (the CLI, beside Redis): no HTTP; the status says what kind of refusal it is
  BACKUP_NOT_CONFIGURED: {
    status: 400,
    retryable: false,
    doc: '`space backup`: no store is configured (`SPACE_BACKUP_S3_BUCKET` unset).',
  },
  BACKUP_NOT_FOUND: {
    status: 404,
    retryable: false,
    doc: '`space backup restore`: no backup of this deployment by that name (or none at all for `latest`).',
  },
  BACKUP_CORRUPT: {
    status: 422,
    retryable: false,
    doc: '`space backup restore`: the object does not match the SHA-256 recorded with it, has none, or is not an RDB Redis can load; nothing was restored.',
  },
  BACKUP_WRITERS_RUNNING: {
    status: 409,
    retryable: true,
    doc: '`space backup restore`: an API is connected to the target Redis; stop it first (nothing was written).',
  },
  BACKUP_SOURCE_UNAVAILABLE: {
    status: 503,
    retryable: true,
    doc: '`space backup run`: no sentinel named the primary, or the server reached is not (or no longer) the primary.',
  },
  BACKUP_SNAPSHOT_FAILED: {
    status: 502,
    retryable: true,
    doc: '`space backup run`: `redis-cli --rdb` did not produce a snapshot (its message is included).',
  },
  BACKUP_STORE_FAILED: {
    status: 502,
    retryable: true,
    doc: '`space backup`: the S3-compatible store refused a request or could not be reached (its error is included).',
  },
  BACKUP_RESTORE_FAILED: {
    status: 500,
    retryable: false,
    doc: '`space backup restore`: copying the snapshot into the target failed part-way; run the restore again.',
  },
} as const satisfies Record<string, ErrorSpec>;

/** Union of every stable error code. */
export type ErrorCode = keyof typeof ERROR_CODES;

/** Wire shape of every error response body. */
export interface ErrorBody {
  error: { code: ErrorCode; message: string; details?: Record<string, unknown> };
}

/**
 * The only error type services throw on purpose. Carries a stable code, readonly context
 * (`sandboxId`, `nodeId`, …) that goes to logs and `details`, and an optional `cause`.
 */
export class SpaceError extends Error {
  readonly code: ErrorCode;
  readonly status: number;
  readonly retryable: boolean;
  readonly details: Readonly<Record<string, unknown>> | undefined;

  constructor(
    code: ErrorCode,
    message: string,
    details?: Record<string, unknown>,
    options?: { cause?: unknown },
  ) {
    super(message, options);
    this.name = 'SpaceError';
    this.code = code;
    this.status = ERROR_CODES[code].status;
    this.retryable = ERROR_CODES[code].retryable;
    this.details = details ? Object.freeze({ ...details }) : undefined;
  }

  /** The wire body for this error. */
  toBody(): ErrorBody {
    return {
      error: {
        code: this.code,
        message: this.message,
        ...(this.details ? { details: { ...this.details } } : {}),
      },
    };
  }
}

/** True when `value` is a known error code. */
export function isErrorCode(value: unknown): value is ErrorCode {
  return typeof value === 'string' && Object.hasOwn(ERROR_CODES, value);
}

/**
 * Rebuilds a SpaceError from a response body of another SPACE service (agent → api, guest → agent),
 * so a coded error crosses a hop unchanged. Unknown bodies become `fallback`.
 */
export function errorFromBody(status: number, body: unknown, fallback: ErrorCode): SpaceError {
  const err = (body as ErrorBody | undefined)?.error;
  if (err && isErrorCode(err.code) && typeof err.message === 'string') {
    return new SpaceError(err.code, err.message, err.details);
  }
  return new SpaceError(fallback, `upstream answered HTTP ${status}`, { status });
}
