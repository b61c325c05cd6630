/**
 * Activity metering, shared by the agents (active ↔ idle, as they see requests and commands) and
 * the API (paused, resumed, ended). A sandbox is always in exactly one open interval in Redis;
 * each report closes it and opens the next, on Redis's clock (`TIME`), so nodes with skewed
 * clocks agree and an interval left open by a process that died is closed by the next report.
 * Closed time lands in per-sandbox totals and in one-minute buckets that `GET /v1/usage` sums.
 */
import { readFileSync } from 'node:fs';
import type { Redis } from 'ioredis';
import { KEY_PREFIX, keys, USAGE_RETENTION_SEC } from './redis-keys.ts';

/** Activity states that are billed separately. */
export const USAGE_STATES = ['active', 'idle', 'paused'] as const;
export type UsageState = (typeof USAGE_STATES)[number];

/** What one report did. */
export interface UsageReport {
  /** The state whose interval was closed (null when none was open). */
  previous: UsageState | null;
  /** Length of the closed interval, ms. */
  closedMs: number;
  /** Redis time of the report, epoch ms (the boundary, when `agoMs` moved it). */
  at: number;
  /** The state now open (null once ended, or unchanged when `onlyIf` did not match). */
  state: UsageState | null;
}

const METER_LUA = readFileSync(new URL('./scripts/meter.lua', import.meta.url), 'utf8');

/** A client that runs meter.lua by its SHA1 (EVALSHA; ioredis loads the script on NOSCRIPT). */
type MeteringRedis = Redis & {
  spaceMeter(...args: string[]): Promise<[string, number, number, string]>;
};

/**
 * `redis` with meter.lua defined on it (once per client). Sent with EVAL, the script's ~3 KiB of
 * source went to Redis and was hashed there on every report, twice per create.
 */
function metering(redis: Redis): MeteringRedis {
  const r = redis as MeteringRedis;
  if (typeof r.spaceMeter !== 'function')
    redis.defineCommand('spaceMeter', { numberOfKeys: 5, lua: METER_LUA });
  return r;
}

/**
 * Closes the sandbox's open interval and opens `state` (or closes for good with `ended`).
 * A sandbox that is killing or killed is always ended. Dimensions (vCPUs, memory, template, API
 * key) and `autoPauseSec` come from the sandbox's record. With `onlyIf`, nothing happens unless
 * the open interval is in that state (e.g. the API's "resumed → idle" must not overwrite an
 * agent's "active" that arrived first). Idle running sandboxes with `autoPauseSec` > 0 are put on
 * the auto-pause timer; any other state takes them off it. With `agoMs`, the change happened that
 * long before the report (a node's "the instance paused 30 s ago"): the boundary between the two
 * intervals is Redis's now minus `agoMs`, but never before the open interval began nor after now,
 * so no interval is negative or overlaps another.
 * @throws whatever ioredis throws (Redis unreachable).
 */
export async function reportUsage(
  redis: Redis,
  sandboxId: string,
  state: UsageState | 'ended',
  onlyIf: UsageState | '' = '',
  agoMs?: number,
): Promise<UsageReport> {
  const [previous, closedMs, at, now] = await metering(redis).spaceMeter(
    keys.usageOpen(sandboxId),
    keys.usageSandbox(sandboxId),
    keys.autoPause(),
    keys.sandbox(sandboxId),
    keys.usageOpenIndex(),
    KEY_PREFIX,
    sandboxId,
    state,
    String(USAGE_RETENTION_SEC),
    onlyIf,
    agoMs !== undefined && Number.isFinite(agoMs) && agoMs > 0 ? String(Math.round(agoMs)) : '0',
  );
  return {
    previous: (previous || null) as UsageState | null,
    closedMs: Number(closedMs),
    at: Number(at),
    state: (now || null) as UsageState | null,
  };
}
