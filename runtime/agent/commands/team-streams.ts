/**
 * The open-streams quota of a team, counted where every client stream ends: the agent's command
 * events route. Streams through the router (SPACE and E2B envd) and streams a client opens on the
 * agent directly (`space up --no-router`) both arrive there, so each is counted exactly once;
 * counting at the router as well would count a routed stream twice, unless both hops shared a
 * stream id that a client talking to the agent directly could then forge to hide its streams.
 *
 * The limit travels in the session token (`streams`, the quota when the API minted it), so the
 * agent needs neither the API's config nor a read per stream; a changed quota applies to tokens
 * minted after the change. The count lives in Redis as a sorted set of leases
 * (`agent/scripts/team-stream.lua`): renewed while the stream is open, removed when it closes,
 * pruned when they expire, so a crashed agent's streams stop counting one lease later.
 */

import { randomUUID } from 'node:crypto';
import { readFileSync } from 'node:fs';
import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import { SpaceError } from '../../core/errors.ts';
import { keys } from '../../core/redis-keys.ts';

const SCRIPT = readFileSync(new URL('../scripts/team-stream.lua', import.meta.url), 'utf8');

/**
 * How long a stream's lease lasts without renewal, ms: what a crashed agent's streams keep
 * counting at most. Three renewals fit in it, so one slow Redis round trip loses nothing.
 */
export const STREAM_LEASE_MS = 30_000;

type TeamStreamRedis = Redis & {
  spaceTeamStream(key: string, op: string, id: string, leaseMs: string, limit: string): Promise<number[]>;
};

export class TeamStreams {
  readonly #redis: TeamStreamRedis;
  readonly #log: Logger;
  readonly #leaseMs: number;

  /** `leaseMs`: lease length (tests shorten it); renewed every third of it. */
  constructor(o: { redis: Redis; log: Logger; leaseMs?: number }) {
    o.redis.defineCommand('spaceTeamStream', { numberOfKeys: 1, lua: SCRIPT });
    this.#redis = o.redis as TeamStreamRedis;
    this.#log = o.log;
    this.#leaseMs = o.leaseMs ?? STREAM_LEASE_MS;
  }

  /**
   * Counts one stream of `team` against `limit` (0 = unlimited) until the returned function is
   * called. Redis unreachable: the stream is let through uncounted (the data plane does not
   * depend on the control plane's store) and a warning logged.
   * @throws SpaceError RATE_LIMITED with `details.quota = 'streams'`, `limit`, `current` when the
   *   team's streams already fill its quota.
   */
  async open(team: string, limit: number): Promise<() => void> {
    const key = keys.teamStreams(team);
    const id = randomUUID();
    const lease = String(this.#leaseMs);
    let answer: number[];
    try {
      answer = await this.#redis.spaceTeamStream(key, 'admit', id, lease, String(limit));
    } catch (err) {
      this.#log.warn({ err, team }, 'team stream not counted: redis unavailable');
      return () => {};
    }
    const [admitted, open] = answer;
    if (admitted !== 1) {
      throw new SpaceError(
        'RATE_LIMITED',
        `team ${team} has ${open} of its ${limit} streams open; close one or raise the quota`,
        { team, quota: 'streams', limit, current: open },
      );
    }
    const renew = setInterval(
      () => {
        this.#redis.spaceTeamStream(key, 'renew', id, lease, '0').catch((err: unknown) => {
          this.#log.warn({ err, team }, 'team stream lease not renewed');
        });
      },
      Math.max(1, Math.floor(this.#leaseMs / 3)),
    );
    renew.unref();
    let closed = false;
    return () => {
      if (closed) return;
      closed = true;
      clearInterval(renew);
      // a removal that fails is made good by the lease running out
      this.#redis.spaceTeamStream(key, 'remove', id, lease, '0').catch((err: unknown) => {
        this.#log.warn({ err, team }, 'team stream not removed; its lease will expire');
      });
    };
  }
}
