/**
 * The audit log: every mutating API call (who — team and key id —, what, on which target, with
 * which result) as a structured log line (`msg: "audit"`, field `audit`) and as an entry of its
 * team's Redis stream (`keys.teamAudit(team)`), trimmed by age (MINID) and length (MAXLEN, both
 * approximate, so trimming stays O(1)). Read by `GET /v1/audit`.
 */
import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import { SpaceError } from '../core/errors.ts';
import { keys } from '../core/redis-keys.ts';

/** One audit entry. */
export interface AuditEntry {
  /** Stream id (`<ms>-<seq>`): unique, ordered; a listing's cursor. */
  id: string;
  /** When the call ended (ISO 8601). */
  at: string;
  team: string;
  /** Id of the API key that made the call. */
  keyId: string;
  /** `<METHOD> <route pattern>`, e.g. `DELETE /v1/sandboxes/:id`. */
  action: string;
  /** What the call acted on (a sandbox id, a credential name, a key id, a team id) or ''. */
  target: string;
  /** `ok` (2xx/3xx), `denied` (401/403/404 on the caller's side of the line) or `failed`. */
  result: 'ok' | 'denied' | 'failed';
  /** HTTP status sent. */
  status: number;
  /** Error code sent, when the call failed. */
  code: string | null;
}

/** What the caller records; id and time are added. */
export type AuditRecord = Omit<AuditEntry, 'id' | 'at'>;

/** The result class of an HTTP status. Pure. */
export function auditResult(status: number): AuditEntry['result'] {
  if (status < 400) return 'ok';
  if (status === 401 || status === 403 || status === 404) return 'denied';
  return 'failed';
}

const FIELDS = ['team', 'keyId', 'action', 'target', 'result', 'status', 'code'] as const;

export class AuditLog {
  readonly #redis: Redis;
  readonly #log: Logger;
  readonly #retentionMs: number;
  readonly #maxEntries: number;

  /** `retentionSec`: age after which entries are trimmed; `maxEntries`: per-team length bound. */
  constructor(redis: Redis, log: Logger, opts: { retentionSec: number; maxEntries: number }) {
    this.#redis = redis;
    this.#log = log;
    this.#retentionMs = opts.retentionSec * 1000;
    this.#maxEntries = opts.maxEntries;
  }

  /**
   * Writes `r` to the log and to its team's stream. A Redis failure is logged, never thrown: the
   * call it describes has already happened.
   */
  async record(r: AuditRecord, now = Date.now()): Promise<void> {
    this.#log.info({ audit: r }, 'audit');
    const key = keys.teamAudit(r.team);
    const values = FIELDS.flatMap((f) => [f, String(r[f] ?? '')]);
    try {
      await this.#redis
        .multi()
        .xadd(key, 'MAXLEN', '~', this.#maxEntries, '*', ...values)
        .xtrim(key, 'MINID', '~', `${now - this.#retentionMs}-0`)
        .exec();
    } catch (err) {
      this.#log.error({ err, audit: r }, 'audit entry not stored');
    }
  }

  /**
   * Team `team`'s entries newest first, at most `limit`, older than cursor `before` (an entry id).
   * `nextCursor` is set only when an older entry follows the page (one more is read to know).
   * @throws SpaceError BAD_REQUEST for a malformed cursor.
   */
  async list(
    team: string,
    opts: { limit: number; before?: string },
  ): Promise<{ entries: AuditEntry[]; nextCursor: string | null }> {
    if (opts.before !== undefined && !/^\d{1,16}-\d{1,16}$/.test(opts.before)) {
      throw new SpaceError('BAD_REQUEST', 'before must be an audit entry id');
    }
    const end = opts.before === undefined ? '+' : `(${opts.before}`;
    const read = await this.#redis.xrevrange(keys.teamAudit(team), end, '-', 'COUNT', opts.limit + 1);
    const rows = read.slice(0, opts.limit);
    const entries = rows.map(([id, flat]) => {
      const h: Record<string, string> = {};
      for (let i = 0; i < flat.length; i += 2) h[flat[i]!] = flat[i + 1] ?? '';
      return {
        id,
        at: new Date(Number(id.split('-')[0])).toISOString(),
        team: h.team ?? team,
        keyId: h.keyId ?? '',
        action: h.action ?? '',
        target: h.target ?? '',
        result: (h.result ?? 'ok') as AuditEntry['result'],
        status: Number(h.status ?? 0),
        code: h.code || null,
      };
    });
    return { entries, nextCursor: read.length > opts.limit ? (entries.at(-1)?.id ?? null) : null };
  }
}
