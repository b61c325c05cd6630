/**
 * Reading usage (metering is written by `core/usage.ts`): per-sandbox totals, and sums over a time
 * range grouped by sandbox, API key or template, for one team. Closed time comes from one-minute buckets; the
 * interval each live sandbox is in now is added up to the moment of the query (on Redis's clock).
 */
import type { Static } from '@sinclair/typebox';
import type { Redis } from 'ioredis';
import type {
  SandboxUsageSchema,
  UsageFigures as UsageFiguresSchema,
  UsageReportSchema,
} from '../core/api-schemas.ts';
import { SpaceError } from '../core/errors.ts';
import { keys } from '../core/redis-keys.ts';
import { DEFAULT_TEAM } from '../core/tenancy.ts';
import { USAGE_STATES, type UsageState } from '../core/usage.ts';

/** Seconds, vCPU-seconds and GiB-seconds per activity state (the public schema's shape). */
export type UsageFigures = Static<typeof UsageFiguresSchema>;

/** One sandbox's whole-life usage (`GET /v1/sandboxes/:id/usage`). */
export type SandboxUsage = Static<typeof SandboxUsageSchema>;

export type UsageGroupBy = 'sandbox' | 'apiKey' | 'template';

/** The answer of GET /v1/usage. */
export type UsageReportBody = Omit<Static<typeof UsageReportSchema>, 'groupBy'> & { groupBy: UsageGroupBy };

/** Longest range one usage query may cover (ms): 31 days of one-minute buckets. */
export const MAX_USAGE_RANGE_MS = 31 * 24 * 3600 * 1000;
const MINUTE_MS = 60_000;

const zero = (): Record<UsageState, number> => ({ active: 0, idle: 0, paused: 0 });
const emptyFigures = (): UsageFigures => ({ seconds: zero(), vcpuSeconds: zero(), gibSeconds: zero() });
const isState = (s: string): s is UsageState => (USAGE_STATES as readonly string[]).includes(s);

interface Dims {
  vcpus: number;
  memoryMiB: number;
  template: string;
  apiKey: string;
  /** Owning team ({@link DEFAULT_TEAM} for sandboxes metered before teams). */
  team: string;
}

/** Adds `ms` of `state` for a sandbox of `dims` to `f`. */
function add(f: UsageFigures, state: UsageState, ms: number, dims: Dims): void {
  const s = ms / 1000;
  f.seconds[state] += s;
  f.vcpuSeconds[state] += s * dims.vcpus;
  f.gibSeconds[state] += (s * dims.memoryMiB) / 1024;
}

/** Rounds every figure to ms precision (sums of floats print badly). */
function tidy(f: UsageFigures): UsageFigures {
  const r = (x: Record<UsageState, number>) =>
    Object.fromEntries(Object.entries(x).map(([k, v]) => [k, Math.round(v * 1000) / 1000])) as Record<
      UsageState,
      number
    >;
  return { seconds: r(f.seconds), vcpuSeconds: r(f.vcpuSeconds), gibSeconds: r(f.gibSeconds) };
}

async function redisNow(redis: Redis): Promise<number> {
  const [sec, usec] = await redis.time();
  return Number(sec) * 1000 + Math.floor(Number(usec) / 1000);
}

async function dimsOf(redis: Redis, ids: string[]): Promise<Map<string, Dims>> {
  const out = new Map<string, Dims>();
  const p = redis.pipeline();
  for (const id of ids) p.hmget(keys.usageSandbox(id), 'vcpus', 'memoryMiB', 'template', 'apiKey', 'team');
  const res = (await p.exec()) ?? [];
  ids.forEach((id, i) => {
    const [vcpus, mem, template, apiKey, team] = (res[i]?.[1] as (string | null)[] | undefined) ?? [];
    out.set(id, {
      vcpus: Number(vcpus ?? 0),
      memoryMiB: Number(mem ?? 0),
      template: template ?? '',
      apiKey: apiKey ?? '',
      team: team || DEFAULT_TEAM,
    });
  });
  return out;
}

/**
 * Whole-life usage of sandbox `id`: closed totals plus the open interval up to now. Active, idle
 * and paused seconds add up to its metered life (from running to ended, or to now).
 * @throws SpaceError SANDBOX_NOT_FOUND when nothing was ever metered for it (or it aged out).
 */
export async function sandboxUsage(redis: Redis, id: string): Promise<SandboxUsage> {
  const [totals, open, now] = await Promise.all([
    redis.hgetall(keys.usageSandbox(id)),
    redis.hgetall(keys.usageOpen(id)),
    redisNow(redis),
  ]);
  if (!totals.startedAt) throw new SpaceError('SANDBOX_NOT_FOUND', `no usage recorded for sandbox ${id}`);
  const dims: Dims = {
    vcpus: Number(totals.vcpus ?? 0),
    memoryMiB: Number(totals.memoryMiB ?? 0),
    template: totals.template ?? '',
    apiKey: totals.apiKey ?? '',
    team: totals.team || DEFAULT_TEAM,
  };
  const f = emptyFigures();
  for (const s of USAGE_STATES) add(f, s, Number(totals[`${s}Ms`] ?? 0), dims);
  const state = open.state && isState(open.state) ? open.state : null;
  if (state) add(f, state, Math.max(0, now - Number(open.since)), dims);
  return {
    sandboxId: id,
    template: dims.template,
    startedAt: new Date(Number(totals.startedAt)).toISOString(),
    endedAt: totals.endedAt ? new Date(Number(totals.endedAt)).toISOString() : null,
    state,
    ...tidy(f),
  };
}

/**
 * Team `team`'s usage in [from, to) summed per group (other teams' sandboxes are left out). `from` and `to` are rounded out to whole minutes (the
 * buckets' resolution); the open intervals of live sandboxes count up to the query's moment.
 * @throws SpaceError BAD_REQUEST when `to` ≤ `from` or the range exceeds {@link MAX_USAGE_RANGE_MS}.
 */
export async function queryUsage(
  redis: Redis,
  range: { fromMs: number; toMs: number },
  groupBy: UsageGroupBy,
  team: string,
): Promise<UsageReportBody> {
  const firstMinute = Math.floor(range.fromMs / MINUTE_MS);
  const endMinute = Math.ceil(range.toMs / MINUTE_MS);
  if (endMinute <= firstMinute) throw new SpaceError('BAD_REQUEST', '`to` must be after `from`');
  if ((endMinute - firstMinute) * MINUTE_MS > MAX_USAGE_RANGE_MS) {
    throw new SpaceError('BAD_REQUEST', 'a usage query covers at most 31 days', {
      maxDays: MAX_USAGE_RANGE_MS / 86_400_000,
    });
  }
  const fromMs = firstMinute * MINUTE_MS;
  const toMs = endMinute * MINUTE_MS;
  const perSandbox = new Map<string, Map<UsageState, number>>();
  const bump = (id: string, state: UsageState, ms: number) => {
    if (ms <= 0) return;
    const m = perSandbox.get(id) ?? new Map<UsageState, number>();
    m.set(state, (m.get(state) ?? 0) + ms);
    perSandbox.set(id, m);
  };
  const BATCH = 720;
  for (let m = firstMinute; m < endMinute; m += BATCH) {
    const p = redis.pipeline();
    for (let k = m; k < Math.min(endMinute, m + BATCH); k++) p.hgetall(keys.usageMinute(k));
    for (const [err, h] of (await p.exec()) ?? []) {
      if (err) throw err;
      for (const [field, ms] of Object.entries(h as Record<string, string>)) {
        const cut = field.lastIndexOf('|');
        const state = field.slice(cut + 1);
        if (isState(state)) bump(field.slice(0, cut), state, Number(ms));
      }
    }
  }
  const now = await redisNow(redis);
  const openIds = await redis.smembers(keys.usageOpenIndex());
  if (openIds.length) {
    const p = redis.pipeline();
    for (const id of openIds) p.hmget(keys.usageOpen(id), 'state', 'since');
    const res = (await p.exec()) ?? [];
    openIds.forEach((id, i) => {
      const [state, since] = (res[i]?.[1] as (string | null)[] | undefined) ?? [];
      if (!state || !isState(state) || !since) return;
      bump(id, state, Math.min(now, toMs) - Math.max(Number(since), fromMs));
    });
  }
  const dims = await dimsOf(redis, [...perSandbox.keys()]);
  const groups = new Map<string, UsageFigures>();
  const total = emptyFigures();
  for (const [id, byState] of perSandbox) {
    const d = dims.get(id)!;
    if (d.team !== team) continue;
    const key = groupBy === 'sandbox' ? id : groupBy === 'template' ? d.template : d.apiKey;
    const g = groups.get(key) ?? emptyFigures();
    for (const [state, ms] of byState) {
      add(g, state, ms, d);
      add(total, state, ms, d);
    }
    groups.set(key, g);
  }
  return {
    from: new Date(fromMs).toISOString(),
    to: new Date(toMs).toISOString(),
    groupBy,
    resolutionSec: MINUTE_MS / 1000,
    groups: [...groups.entries()]
      .sort(([a], [b]) => a.localeCompare(b))
      .map(([key, f]) => ({ key, ...tidy(f) })),
    total: tidy(total),
  };
}

/** The usage reads of the API's routes, over one Redis connection. */
export class UsageReader {
  readonly #redis: Redis;
  constructor(redis: Redis) {
    this.#redis = redis;
  }

  /** {@link sandboxUsage} of sandbox `id`. */
  sandbox(id: string): Promise<SandboxUsage> {
    return sandboxUsage(this.#redis, id);
  }

  /** {@link queryUsage} for team `team`. */
  query(
    range: { fromMs: number; toMs: number },
    groupBy: UsageGroupBy,
    team: string,
  ): Promise<UsageReportBody> {
    return queryUsage(this.#redis, range, groupBy, team);
  }
}
