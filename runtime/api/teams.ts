/**
 * Teams: who owns sandboxes, operations, credentials, usage and API keys. A team is a Redis hash
 * (`keys.team(id)`) holding its creation time and its quota overrides; the quotas in force are the
 * config's defaults with the overrides laid over them ({@link effectiveQuotas}).
 */
import type { Redis } from 'ioredis';
import { SpaceError } from '../core/errors.ts';
import { keys } from '../core/redis-keys.ts';
import { isTeamId, QUOTA_NAMES, TEAM_ID_PATTERN, type TeamQuotas } from '../core/tenancy.ts';

/** A team as the API shows it. */
export interface TeamView {
  id: string;
  createdAt: string;
  /** Overrides set for this team (absent names use the defaults). */
  quotaOverrides: Partial<TeamQuotas>;
  /** The quotas in force: defaults with the overrides laid over them (0 = unlimited). */
  quotas: TeamQuotas;
}

/** The defaults with a team's overrides laid over them. Pure. */
export function effectiveQuotas(defaults: TeamQuotas, overrides: Partial<TeamQuotas>): TeamQuotas {
  const out = { ...defaults };
  for (const q of QUOTA_NAMES) {
    const v = overrides[q];
    if (typeof v === 'number' && Number.isInteger(v) && v >= 0) out[q] = v;
  }
  return out;
}

function parseOverrides(text: string | undefined): Partial<TeamQuotas> {
  const raw = JSON.parse(text || '{}') as Record<string, unknown>;
  const out: Partial<TeamQuotas> = {};
  for (const q of QUOTA_NAMES) if (typeof raw[q] === 'number') out[q] = raw[q];
  return out;
}

export class TeamStore {
  readonly #redis: Redis;
  readonly #defaults: TeamQuotas;

  /** `defaults`: the quotas of a team without overrides (from the API config). */
  constructor(redis: Redis, defaults: TeamQuotas) {
    this.#redis = redis;
    this.#defaults = defaults;
  }

  /**
   * Makes team `id` with optional quota overrides.
   * @throws SpaceError BAD_REQUEST (malformed id), TEAM_EXISTS.
   */
  async create(id: string, quotas: Partial<TeamQuotas> = {}): Promise<TeamView> {
    if (!isTeamId(id)) throw new SpaceError('BAD_REQUEST', `team id must match ${TEAM_ID_PATTERN}`);
    const made = await this.#redis.hsetnx(keys.team(id), 'id', id);
    if (made === 0) throw new SpaceError('TEAM_EXISTS', `team ${id} exists already`, { team: id });
    await this.#redis
      .multi()
      .hset(keys.team(id), { createdAt: String(Date.now()), quotas: JSON.stringify(quotas) })
      .sadd(keys.teamIndex(), id)
      .exec();
    return (await this.get(id))!;
  }

  /** Makes team `id` unless it exists (the default team at first start and at key migration). */
  async ensure(id: string): Promise<void> {
    if ((await this.#redis.hsetnx(keys.team(id), 'id', id)) === 1) {
      await this.#redis
        .multi()
        .hset(keys.team(id), { createdAt: String(Date.now()), quotas: '{}' })
        .sadd(keys.teamIndex(), id)
        .exec();
    }
  }

  /** Team `id`, or null. */
  async get(id: string): Promise<TeamView | null> {
    const h = await this.#redis.hgetall(keys.team(id));
    if (!h.id) return null;
    const quotaOverrides = parseOverrides(h.quotas);
    return {
      id: h.id,
      createdAt: new Date(Number(h.createdAt ?? 0)).toISOString(),
      quotaOverrides,
      quotas: effectiveQuotas(this.#defaults, quotaOverrides),
    };
  }

  /** Team `id` or TEAM_NOT_FOUND. */
  async require(id: string): Promise<TeamView> {
    const t = await this.get(id);
    if (!t) throw new SpaceError('TEAM_NOT_FOUND', `no team ${id}`, { team: id });
    return t;
  }

  /** Every team, by id. */
  async list(): Promise<TeamView[]> {
    const ids = (await this.#redis.smembers(keys.teamIndex())).sort();
    return (await Promise.all(ids.map((id) => this.get(id)))).filter((t): t is TeamView => t !== null);
  }

  /**
   * Lays `quotas` over team `id`'s overrides (a `null` value removes that override).
   * @throws SpaceError TEAM_NOT_FOUND.
   */
  async setQuotas(id: string, quotas: Partial<Record<keyof TeamQuotas, number | null>>): Promise<TeamView> {
    const team = await this.require(id);
    const next: Partial<TeamQuotas> = { ...team.quotaOverrides };
    for (const q of QUOTA_NAMES) {
      const v = quotas[q];
      if (v === null) delete next[q];
      else if (v !== undefined) next[q] = v;
    }
    await this.#redis.hset(keys.team(id), 'quotas', JSON.stringify(next));
    return (await this.get(id))!;
  }

  /** The quotas in force for team `id` (the defaults when it has no record). */
  async quotas(id: string): Promise<TeamQuotas> {
    return (await this.get(id))?.quotas ?? { ...this.#defaults };
  }
}
