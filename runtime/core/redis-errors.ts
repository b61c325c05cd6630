/**
 * Telling "Redis is away" apart from every other failure. The control plane keeps all its state in
 * Redis, so while Redis cannot be reached a request fails through no fault of its own and may
 * succeed unchanged a moment later: it deserves 503 `CONTROL_PLANE_UNAVAILABLE` with a
 * `Retry-After`, not 500 `INTERNAL`. What ioredis throws then (v5):
 *
 * - `MaxRetriesPerRequestError` — a command waited through `maxRetriesPerRequest` reconnects;
 * - `Error: Connection is closed.` — the connection closed with the command in flight, or the
 *   client was told not to reconnect;
 * - `Error: Stream isn't writeable and enableOfflineQueue options is false`;
 * - `Error: Command timed out` — `commandTimeout` elapsed (a hung or partitioned server);
 * - a socket error with `code` `ECONNREFUSED`, `ECONNRESET`, `ETIMEDOUT`, `EPIPE`, `EHOSTUNREACH`,
 *   `ENETUNREACH`, `ENOTFOUND`, `EAI_AGAIN` (when `enableOfflineQueue` is off or on connect);
 * - a server reply `LOADING …` (restarted, still reading its append-only file), `MASTERDOWN …`,
 *   `TRYAGAIN …` or `CLUSTERDOWN …` (cluster failover), `NOREPLICAS …` (a primary that has lost
 *   its replicas refuses writes under `min-replicas-to-write`, e.g. just after a Sentinel
 *   failover) or `READONLY …` (a demoted primary the client still held);
 * - `EXECABORT …` whose `previousErrors` (ioredis: the queued commands' refusals) are any of these:
 *   a MULTI during a failover has each write refused as it is queued, and EXEC aborts.
 *
 * Errors are matched by name, code and message, not by class, so an error that crossed a module
 * boundary (or sits in a `cause` chain, as SpaceError INTERNAL wraps it) is still recognised.
 */
import { SpaceError } from './errors.ts';

/** Seconds a client is told to wait (`Retry-After`) before retrying while Redis is away. */
export const CONTROL_PLANE_RETRY_AFTER_SEC = 2;

const SOCKET_CODES = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'ETIMEDOUT',
  'EPIPE',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'ENOTFOUND',
  'EAI_AGAIN',
]);
const MESSAGES = [
  'Connection is closed.',
  "Stream isn't writeable and enableOfflineQueue options is false",
  'Command timed out',
];
const REPLY_PREFIXES = ['LOADING ', 'MASTERDOWN ', 'TRYAGAIN ', 'CLUSTERDOWN ', 'NOREPLICAS ', 'READONLY '];
/** How deep a `cause` chain is followed (a guard against cycles). */
const MAX_CAUSE_DEPTH = 5;

/**
 * True when `err` (or an error in its `cause` chain, up to 5 deep) says Redis could not be
 * reached or could not serve right now — a transient condition — rather than that the command
 * itself was wrong. Never throws; any value is accepted.
 */
export function isRedisUnavailable(err: unknown): boolean {
  let e: unknown = err;
  for (let depth = 0; depth < MAX_CAUSE_DEPTH && e instanceof Error; depth++) {
    if (e instanceof SpaceError) {
      // a coded error decided already; only an INTERNAL one may hide a Redis failure in its cause
      if (e.code !== 'INTERNAL') return false;
    } else {
      if (e.name === 'MaxRetriesPerRequestError' || e.name === 'ClusterAllFailedError') return true;
      const code = (e as { code?: unknown }).code;
      if (typeof code === 'string' && SOCKET_CODES.has(code)) return true;
      if (MESSAGES.includes(e.message)) return true;
      if (
        e.name === 'ReplyError' &&
        REPLY_PREFIXES.some((p) => e instanceof Error && e.message.startsWith(p))
      )
        return true;
      const previous = (e as { previousErrors?: unknown }).previousErrors;
      if (
        e.message.startsWith('EXECABORT') &&
        Array.isArray(previous) &&
        previous.some((p) => isRedisUnavailable(p))
      )
        return true;
    }
    e = e.cause;
  }
  return false;
}

/**
 * `err` as a SpaceError `CONTROL_PLANE_UNAVAILABLE` (503, retryable, the original as `cause`)
 * when it is a Redis outage (see {@link isRedisUnavailable}); otherwise `err` unchanged.
 */
export function fromRedisOutage(err: unknown): unknown {
  if (!isRedisUnavailable(err)) return err;
  return new SpaceError(
    'CONTROL_PLANE_UNAVAILABLE',
    'the control plane’s store (Redis) cannot be reached right now; retry shortly',
    undefined,
    { cause: err },
  );
}
