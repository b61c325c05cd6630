/**
 * Sandbox records in Redis: create, read, list with cursor pagination, atomic transitions,
 * placement, release, expiry and lifetime extension. All multi-key changes go through the Lua
 * scripts in `scripts/`; nothing here does read-modify-write from Node.
 */

import { acceptingDrivers } from '../core/drivers.ts';
import type { EgressPolicy } from '../core/egress.ts';
import { SpaceError } from '../core/errors.ts';
import { KEY_PREFIX, KILLED_SANDBOX_TTL_SEC, keys } from '../core/redis-keys.ts';
import type { StoreOutage } from '../core/store-outage.ts';
import { DEFAULT_TEAM, type TeamQuotas } from '../core/tenancy.ts';
import { inChildSpan } from '../core/tracing.ts';
import {
  describeKillReason,
  type EndReport,
  type KillReason,
  type OnTimeout,
  parseEndReport,
  type Sandbox,
  type SandboxState,
  statesLeadingTo,
} from '../core/types.ts';
import type { SandboxGrant } from './credential-store.ts';
import type { DraftOperation } from './operations.ts';
import { PLACEMENT_RULES, PLACEMENT_RULES_JSON, roomError } from './placement.ts';
import type { ScriptedRedis } from './redis-scripts.ts';

/**
 * How long after its deadline a sandbox with `onTimeout: 'pause'` is looked at again, ms: still
 * running with its timeout pause failed, it is killed; with the pause still under way, it waits on.
 */
export const TIMEOUT_PAUSE_RETRY_MS = 30_000;

/** A sandbox as stored (the public record plus what only the platform needs). */
export interface SandboxRecord extends Omit<Sandbox, 'credentials'> {
  /** Environment for every command (set by the client at create). */
  env: Record<string, string>;
  /** Deadline, epoch ms. */
  expiresAtMs: number;
  /** Normalised egress policy. */
  egress: EgressPolicy;
  /** Credentials granted (placeholders only). */
  grants: SandboxGrant[];
  /** Id of the API key that created it (its name for records made before teams; '' before keys were recorded). */
  apiKey: string;
  /** Team that owns it ({@link DEFAULT_TEAM} for records made before teams). */
  team: string;
  /** Where a hibernated sandbox's snapshot is (null unless hibernated). */
  hibernation: { store: string; path: string } | null;
}

/** Fields written at creation. */
export interface NewSandbox {
  id: string;
  template: string;
  vcpus: number;
  memoryMiB: number;
  timeoutSec: number;
  metadata: Record<string, string>;
  env: Record<string, string>;
  sessionId: string;
  egress: EgressPolicy;
  grants: SandboxGrant[];
  /** Idle seconds before auto-pause (0 or absent: never). */
  autoPauseSec?: number;
  /** Session token with scope `ports` the routers open port tunnels with (core/ports.ts). */
  portToken?: string;
  /** Set: servers in the sandbox are private, reached only with this traffic access token. */
  trafficToken?: string;
  /** What its deadline does: `kill` (absent: the default) or `pause` it. */
  onTimeout?: OnTimeout;
  /** Whether traffic through the router resumes it when paused (absent: true). */
  autoResume?: boolean;
  /** Id of the API key that asked for it. */
  apiKey?: string;
  /** Team that owns it. */
  team: string;
}

/** A refused admission: which quota, its limit and what the team holds now (admit.lua). */
export interface QuotaRefusal {
  quota: 'sandboxes' | 'vcpus' | 'memoryMiB' | 'createsPerMinute';
  limit: number;
  current: number;
}

const iso = (ms: string | number | undefined) =>
  ms === undefined || ms === '' ? null : new Date(Number(ms)).toISOString();

/** The sandbox record a Redis hash holds (null when it holds none: no `id`). Pure. */
export function sandboxFromHash(h: Record<string, string>): SandboxRecord | null {
  if (!h.id) return null;
  const killReason = (h.killReason || null) as KillReason | null;
  return {
    id: h.id,
    template: h.template ?? '',
    state: h.state as SandboxState,
    vcpus: Number(h.vcpus),
    memoryMiB: Number(h.memoryMiB),
    timeoutSec: Number(h.timeoutSec),
    autoPauseSec: Number(h.autoPauseSec ?? 0),
    // records from before lifecycle options: killed at the deadline, resumed by traffic
    onTimeout: h.onTimeout === 'pause' ? 'pause' : 'kill',
    autoResume: h.autoResume !== '0',
    // only a sandbox that reached `paused` has a pause to describe: one deleted while it was
    // being paused holds the asked mode but no pausedAtMs (and answered 500 on GET: pausedAt '')
    pause:
      (h.pauseMode === 'frozen' || h.pauseMode === 'hibernated') && h.pausedAtMs
        ? {
            mode: h.pauseMode,
            reason: h.pauseReason === 'idle' || h.pauseReason === 'timeout' ? h.pauseReason : 'request',
            pausedAt: iso(h.pausedAtMs) ?? '',
            timeLeftSec: Math.max(0, Math.round(Number(h.timeLeftMs ?? 0) / 1000)),
          }
        : null,
    apiKey: h.apiKey ?? '',
    team: h.team || DEFAULT_TEAM,
    hibernation: h.hibernateStore ? { store: h.hibernateStore, path: h.hibernatePath ?? '' } : null,
    metadata: JSON.parse(h.metadata ?? '{}') as Record<string, string>,
    env: JSON.parse(h.env ?? '{}') as Record<string, string>,
    nodeId: h.nodeId || null,
    fromWarmPool: h.fromWarmPool === '1',
    createdFrom:
      h.createdFrom === 'warm' || h.createdFrom === 'snapshot' || h.createdFrom === 'boot'
        ? h.createdFrom
        : null,
    sessionId: h.sessionId ?? '',
    createdAt: iso(h.createdAt) ?? '',
    updatedAt: iso(h.updatedAt) ?? '',
    expiresAt: iso(h.expiresAtMs) ?? '',
    expiresAtMs: Number(h.expiresAtMs),
    egress: JSON.parse(h.egress ?? '{"mode":"allow-list","allow":[],"deny":[],"cidrs":[]}') as EgressPolicy,
    ports: { public: !h.trafficToken, trafficToken: h.trafficToken || null },
    grants: JSON.parse(h.grants ?? '[]') as SandboxGrant[],
    endedAt: iso(h.endedAt),
    killReason,
    endMessage: h.endMessage || (killReason ? describeKillReason(killReason) : null),
  };
}

/** The public JSON of a record (drops env and internal fields). */
export function toPublic(r: SandboxRecord): Sandbox {
  const { env: _env, expiresAtMs: _deadline, grants, apiKey: _key, team: _team, hibernation: _h, ...pub } = r;
  return { ...pub, credentials: grants.map((g) => ({ name: g.name, envVar: g.envVar })) };
}

/** Result of a transition attempt. */
export type TransitionResult = { ok: true } | { ok: false; current: SandboxState | null };

/** The error of a refused admission: creates per minute are a rate (429), the rest quotas (403). Pure. */
export function quotaError(team: string, r: QuotaRefusal): SpaceError {
  const vcpus = r.quota === 'vcpus';
  const details = {
    team,
    quota: r.quota,
    limit: vcpus ? r.limit / 1000 : r.limit,
    current: vcpus ? r.current / 1000 : r.current,
  };
  if (r.quota === 'createsPerMinute') {
    return new SpaceError(
      'RATE_LIMITED',
      `team ${team} created ${r.limit} sandboxes in the last minute (its limit)`,
      {
        ...details,
        retryAfterSec: 60,
      },
    );
  }
  return new SpaceError(
    'QUOTA_EXCEEDED',
    `team ${team} is at its ${r.quota} quota (${details.limit}; it holds ${details.current})`,
    details,
  );
}

export class SandboxStore {
  readonly redis: ScriptedRedis;
  constructor(redis: ScriptedRedis) {
    this.redis = redis;
  }

  /**
   * Admits a new sandbox against its team's `quotas` and writes it in state `creating`, indexed, in
   * one atomic step (admit.lua): a refusal writes nothing. With `create` (a drafted operation,
   * `OperationStore.draft`), the same step writes and queues that operation, so an admitted sandbox
   * always has the operation that makes it.
   * @throws SpaceError QUOTA_EXCEEDED (sandboxes, vCPUs, memory) or RATE_LIMITED (creates per
   *   minute), with `quota`, `limit` and `current` in details (vCPUs in vCPUs, memory in MiB).
   */
  async create(
    s: NewSandbox,
    quotas: TeamQuotas,
    now = Date.now(),
    create?: DraftOperation,
  ): Promise<SandboxRecord> {
    const res = await this.admit(s, quotas, now, create);
    if (!('admitted' in res)) throw new SpaceError('INTERNAL', 'admission without a key answered a replay');
    return res.admitted;
  }

  /**
   * {@link create} with an Idempotency-Key: `idempotency.key` (the Redis key,
   * `keys.idempotency`) is looked up and claimed in the admission's own step (admit.lua,
   * claim-or-return). Returns `{ admitted }` (this call wrote the sandbox) or `{ replay }` (the key
   * was used before with the same `bodyHash`: the first request's sandbox and operation ids;
   * nothing was written). With `placement`, the same step also places the sandbox on a node that
   * takes it now (the placement rules of place.lua, judged through `placement.outage`) and reserves
   * the node's share, or refuses: capacity is answered at admission, and concurrent admissions
   * cannot over-fill a node.
   * @throws SpaceError IDEMPOTENCY_CONFLICT when the key was used with another body; INTERNAL when
   *   an API from before claim-or-return holds the key without its operation yet; the quota errors
   *   of {@link create}; with `placement`, {@link roomError}'s NODE_CAPACITY_EXHAUSTED (no node has
   *   room now) or NODE_UNAVAILABLE (no node counts as alive), nothing written.
   */
  async admit(
    s: NewSandbox,
    quotas: TeamQuotas,
    now = Date.now(),
    create?: DraftOperation,
    idempotency?: { key: string; bodyHash: string; ttlSec: number },
    placement?: { outage: StoreOutage },
  ): Promise<{ admitted: SandboxRecord } | { replay: { sandboxId: string; operationId: string } }> {
    const fields: Record<string, string> = {
      id: s.id,
      template: s.template,
      state: 'creating',
      vcpus: String(s.vcpus),
      memoryMiB: String(s.memoryMiB),
      timeoutSec: String(s.timeoutSec),
      autoPauseSec: String(s.autoPauseSec ?? 0),
      onTimeout: s.onTimeout ?? 'kill',
      autoResume: s.autoResume === false ? '0' : '1',
      apiKey: s.apiKey ?? '',
      metadata: JSON.stringify(s.metadata),
      env: JSON.stringify(s.env),
      sessionId: s.sessionId,
      egress: JSON.stringify(s.egress),
      grants: JSON.stringify(s.grants),
      nodeId: '',
      fromWarmPool: '0',
      createdAt: String(now),
      updatedAt: String(now),
      expiresAtMs: String(now + s.timeoutSec * 1000),
      team: s.team,
      ...(s.portToken ? { portToken: s.portToken } : {}),
      ...(s.trafficToken ? { trafficToken: s.trafficToken } : {}),
    };
    const cpuMilli = Math.round(s.vcpus * 1000);
    const ask = placement
      ? JSON.stringify({
          prefix: KEY_PREFIX,
          template: s.template,
          drivers: acceptingDrivers(s).join(','),
          rules: PLACEMENT_RULES,
          outage: placement.outage.luaArgs(now),
        })
      : '';
    const res = await this.redis.spaceAdmit(
      keys.sandbox(s.id),
      keys.sandboxIndex(),
      keys.teamUsage(s.team),
      keys.teamCreates(s.team),
      keys.teamSandboxes(s.team),
      keys.operation(create?.record.id ?? ''),
      keys.operationQueue(),
      keys.teamLiveSandboxes(s.team),
      idempotency?.key ?? '',
      keys.nodeIndex(),
      String(now),
      s.id,
      String(quotas.sandboxes),
      String(quotas.vcpus * 1000),
      String(quotas.memoryMiB),
      String(quotas.createsPerMinute),
      String(cpuMilli),
      String(s.memoryMiB),
      create ? JSON.stringify(create.hash) : '',
      idempotency?.bodyHash ?? '',
      String(idempotency?.ttlSec ?? 0),
      ask,
      ...Object.entries(fields).flat(),
    );
    switch (res[0]) {
      case 0:
        throw quotaError(s.team, { quota: res[1], limit: res[2], current: res[3] } as QuotaRefusal);
      case 2:
        return { replay: { sandboxId: res[1], operationId: res[2] } };
      case 3:
        throw new SpaceError('IDEMPOTENCY_CONFLICT', 'Idempotency-Key was used with a different body');
      case 4:
        throw new SpaceError('INTERNAL', 'the first request with this Idempotency-Key did not finish');
      case 5:
        throw roomError(res[1], { template: s.template, vcpus: s.vcpus, memoryMiB: s.memoryMiB });
      default: {
        // what admit.lua wrote is exactly `fields` (plus quotaHeld, and the node when it placed it):
        // no read back
        const placed: Record<string, string> =
          res.length === 3 ? { nodeId: res[1], fromWarmPool: String(res[2]), released: '0' } : {};
        return { admitted: sandboxFromHash({ ...fields, ...placed, quotaHeld: '1' })! };
      }
    }
  }

  /** The id of the delete operation last asked for sandbox `id` (null when none was). */
  async deleteOperationId(id: string): Promise<string | null> {
    return this.redis.hget(keys.sandbox(id), 'deleteOperationId');
  }

  /** Notes `operationId` as sandbox `id`'s delete operation (a repeated DELETE answers with it). */
  async setDeleteOperationId(id: string, operationId: string): Promise<void> {
    await this.redis.hset(keys.sandbox(id), 'deleteOperationId', operationId);
  }

  /** What team `team`'s live sandboxes reserve now (counted by admit.lua and transition.lua). */
  async reserved(team: string): Promise<{ sandboxes: number; vcpus: number; memoryMiB: number }> {
    const [n, cpu, mem] = await this.redis.hmget(
      keys.teamUsage(team),
      'sandboxes',
      'vcpusMilli',
      'memoryMiB',
    );
    return { sandboxes: Number(n ?? 0), vcpus: Number(cpu ?? 0) / 1000, memoryMiB: Number(mem ?? 0) };
  }

  /** The record, or null when unknown (or expired from Redis after being killed). */
  async get(id: string): Promise<SandboxRecord | null> {
    return sandboxFromHash(await this.redis.hgetall(keys.sandbox(id)));
  }

  /** The records of `ids` (null where one is gone), read in one pipeline. */
  async #getMany(ids: string[]): Promise<Array<SandboxRecord | null>> {
    if (ids.length === 0) return [];
    const pipe = this.redis.pipeline();
    for (const id of ids) pipe.hgetall(keys.sandbox(id));
    const replies = (await pipe.exec()) ?? [];
    return replies.map(([err, h]) => {
      if (err) throw err;
      return sandboxFromHash(h as Record<string, string>);
    });
  }

  /**
   * Lazy pruning: drops `gone` (expired records) from every index, and `killed` (records of killed
   * sandboxes still in the live index: killed by an API from before that index) from the live one.
   */
  async #prune(team: string, gone: string[], killed: string[]): Promise<void> {
    if (gone.length === 0 && killed.length === 0) return;
    const m = this.redis.multi();
    if (gone.length > 0) {
      m.zrem(keys.teamSandboxes(team), ...gone).zrem(keys.sandboxIndex(), ...gone);
    }
    const live = [...gone, ...killed];
    if (live.length > 0) m.zrem(keys.teamLiveSandboxes(team), ...live);
    await m.exec();
  }

  /**
   * Lists sandboxes newest first (`order: 'asc'`: oldest first). `cursor` is opaque (from a
   * previous page's `nextCursor`, of the same order). Filters (`state`, `metadata`, `match`) apply
   * before the limit, so a page is full unless the listing ended, and `nextCursor` is set only when
   * another matching sandbox follows the page (a full last page has none). A state filter without
   * `killed` reads the team's index of sandboxes not yet killed ({@link keys.teamLiveSandboxes});
   * any other listing reads the whole team index, which also holds the records of sandboxes killed
   * in the last {@link KILLED_SANDBOX_TTL_SEC} seconds. Members with one creation time are ordered
   * by id (Redis's order for equal scores), so the cursor (time, id) is a strict position.
   * @throws SpaceError BAD_REQUEST for a cursor this store did not hand out.
   */
  async list(opts: {
    limit: number;
    cursor?: string;
    state?: SandboxState[];
    metadata?: Record<string, string>;
    /** Any other filter (e.g. E2B's template and start time), applied before the limit. */
    match?: (rec: SandboxRecord) => boolean;
    /** `desc` (default): newest first; `asc`: oldest first. */
    order?: 'asc' | 'desc';
    /** Only this team's sandboxes. */
    team: string;
  }): Promise<{ sandboxes: SandboxRecord[]; nextCursor: string | null }> {
    const asc = opts.order === 'asc';
    const out: { rec: SandboxRecord; score: string }[] = [];
    let from = asc ? '-inf' : '+inf';
    let after: { score: string; id: string } | null = null;
    if (opts.cursor) {
      const [score, id] = Buffer.from(opts.cursor, 'base64url').toString('utf8').split(':');
      if (!score || !/^\d{1,16}$/.test(score) || !id) {
        throw new SpaceError('BAD_REQUEST', 'cursor is not one this API returned');
      }
      from = score;
      after = { score, id };
    }
    // one more than a page: a cursor is handed out only when something follows
    const want = opts.limit + 1;
    const batch = Math.max(want * 2, 50);
    // `running` sandboxes of a team that made thousands this week: read the live ones only
    const liveOnly = opts.state !== undefined && !opts.state.includes('killed');
    const index = liveOnly ? keys.teamLiveSandboxes(opts.team) : keys.teamSandboxes(opts.team);
    /** True for a member at or before the cursor's position in this order (already handed out). */
    const handedOut = (id: string, score: string) => {
      if (!after || score !== after.score) return false;
      return asc ? id <= after.id : id >= after.id;
    };
    let offset = 0;
    for (;;) {
      const page = asc
        ? await this.redis.zrangebyscore(index, from, '+inf', 'WITHSCORES', 'LIMIT', offset, batch)
        : await this.redis.zrevrangebyscore(index, from, '-inf', 'WITHSCORES', 'LIMIT', offset, batch);
      if (page.length === 0) break;
      offset += page.length / 2;
      const entries: Array<{ id: string; score: string }> = [];
      for (let i = 0; i < page.length; i += 2) {
        const id = page[i]!;
        const score = page[i + 1]!;
        if (!handedOut(id, score)) entries.push({ id, score });
      }
      // the page's records in one round trip: a team's index also holds its killed sandboxes
      // (kept KILLED_SANDBOX_TTL_SEC), so a filtered listing may read many records to fill a page
      const records = await this.#getMany(entries.map((e) => e.id));
      const gone: string[] = [];
      const killed: string[] = [];
      for (const [i, { id, score }] of entries.entries()) {
        const rec = records[i] ?? null;
        if (!rec) {
          gone.push(id); // record expired: pruned from the indexes below
          continue;
        }
        if (liveOnly && rec.state === 'killed') {
          killed.push(id); // not live: pruned from the live index below
          continue;
        }
        if (rec.team !== opts.team) continue; // never, unless someone wrote the index by hand
        if (opts.state && !opts.state.includes(rec.state)) continue;
        if (opts.metadata && !Object.entries(opts.metadata).every(([k, v]) => rec.metadata[k] === v))
          continue;
        if (opts.match && !opts.match(rec)) continue;
        out.push({ rec, score });
        if (out.length === want) break;
      }
      await this.#prune(opts.team, gone, killed);
      if (out.length === want) break;
      // the pruned members no longer take places before the next page
      offset -= gone.length + (liveOnly ? killed.length : 0);
    }
    const more = out.length === want;
    const shown = out.slice(0, opts.limit);
    const last = shown.at(-1);
    return {
      sandboxes: shown.map((o) => o.rec),
      nextCursor: more && last ? Buffer.from(`${last.score}:${last.rec.id}`).toString('base64url') : null,
    };
  }

  /**
   * Adds every indexed sandbox to its team's index (records from before teams: the default team's)
   * unless it is there already, and every one not killed to its team's live index (records from
   * before that index); takes killed ones out of the live index. Run at API start, so sandboxes made
   * by an earlier version are listed. Idempotent; reads the records 500 at a time, one round trip
   * per batch. Returns how many entries it added to each kind of index.
   */
  async indexTeams(): Promise<{ teamIndex: number; liveIndex: number }> {
    const added = { teamIndex: 0, liveIndex: 0 };
    let cursor = '0';
    do {
      const [next, flat] = await this.redis.zscan(keys.sandboxIndex(), cursor, 'COUNT', 500);
      cursor = next;
      const read = this.redis.pipeline();
      for (let i = 0; i < flat.length; i += 2) read.hmget(keys.sandbox(flat[i]!), 'team', 'state');
      const fields = (await read.exec()) ?? [];
      const write = this.redis.pipeline();
      const kinds: Array<keyof typeof added | null> = [];
      for (let i = 0; i < flat.length; i += 2) {
        const [err, value] = fields[i / 2] ?? [null, null];
        if (err) throw err;
        const [team, state] = (value ?? []) as Array<string | null>;
        if (!state) continue; // expired: a listing prunes it
        const id = flat[i]!;
        const score = flat[i + 1]!;
        const t = team || DEFAULT_TEAM;
        write.zadd(keys.teamSandboxes(t), 'NX', score, id);
        kinds.push('teamIndex');
        if (state === 'killed') write.zrem(keys.teamLiveSandboxes(t), id);
        else write.zadd(keys.teamLiveSandboxes(t), 'NX', score, id);
        kinds.push(state === 'killed' ? null : 'liveIndex');
      }
      const results = (await write.exec()) ?? [];
      for (const [j, [err, n]] of results.entries()) {
        if (err) throw err;
        const kind = kinds[j];
        if (kind) added[kind] += Number(n);
      }
    } while (cursor !== '0');
    return added;
  }

  /** Moves the sandbox to `to` if its current state may lead there; sets `fields` in the same step. */
  async transition(id: string, to: SandboxState, fields: Record<string, string> = {}, now = Date.now()) {
    const from = statesLeadingTo(to);
    const argv = [to, from.join(','), String(now), ...Object.entries(fields).flat()];
    const [ok, current] = await inChildSpan('redis.sandbox.transition', { 'space.state': to }, () =>
      this.redis.spaceTransition(keys.sandbox(id), keys.deadlines(), ...argv),
    );
    if (to === 'killed' && ok === 1) await this.redis.expire(keys.sandbox(id), KILLED_SANDBOX_TTL_SEC);
    return ok === 1
      ? ({ ok: true } as const)
      : ({ ok: false, current: (current || null) as SandboxState | null } as const);
  }

  /**
   * Takes (reads and removes) the report a node filed for sandbox `id` that ended on its own
   * (`node:<nodeId>:ended`), if any: a delete that raced the end records the report's reason.
   */
  async takeEndReport(nodeId: string, id: string): Promise<EndReport | undefined> {
    const [[, value]] = (await this.redis
      .multi()
      .hget(keys.nodeEnded(nodeId), id)
      .hdel(keys.nodeEnded(nodeId), id)
      .exec()) as [[Error | null, string | null], [Error | null, number]];
    return value ? parseEndReport(value) : undefined;
  }

  /** Marks a sandbox killing for `reason` (no-op result when already ending). */
  async markKilling(id: string, reason: KillReason): Promise<TransitionResult> {
    return this.transition(id, 'killing', { killReason: reason });
  }

  /** Final state: killed, with its reason and end time. */
  async markKilled(
    id: string,
    reason: KillReason,
    message?: string,
    now = Date.now(),
  ): Promise<TransitionResult> {
    return this.transition(
      id,
      'killed',
      { killReason: reason, endedAt: String(now), endMessage: message ?? describeKillReason(reason) },
      now,
    );
  }

  /**
   * Reserves room on a node that takes the sandbox under the placement rules (placement.ts, judged
   * by place.lua); with `store`, only on a node reading that hibernation store (resuming a
   * hibernated sandbox). Liveness follows `outage`'s rule (store-outage.ts) when given. Returns the node with its agent URL and whether it
   * heartbeats now (a new placement always does; a sandbox placed before keeps its node), or why
   * none was found (`no_nodes`, `full`).
   */
  async place(
    rec: SandboxRecord,
    store = '',
    outage?: StoreOutage,
  ): Promise<
    { nodeId: string; fromWarm: boolean; url: string; alive: boolean } | { nodeId: null; reason: string }
  > {
    const [node, extra, url, alive] = await inChildSpan('redis.sandbox.place', {}, () =>
      this.redis.spacePlace(
        keys.nodeIndex(),
        keys.sandbox(rec.id),
        KEY_PREFIX,
        rec.id,
        rec.template,
        String(Math.round(rec.vcpus * 1000)),
        String(rec.memoryMiB),
        acceptingDrivers(rec).join(','),
        store,
        PLACEMENT_RULES_JSON,
        ...(outage?.luaArgs() ?? []),
      ),
    );
    if (!node) return { nodeId: null, reason: String(extra) };
    return { nodeId: node, fromWarm: Number(extra) === 1, url: url ?? '', alive: alive === 1 };
  }

  /**
   * After a hibernation: returns the reservation and forgets the node, so a resume places the
   * sandbox afresh. Idempotent.
   */
  async unplace(id: string): Promise<void> {
    await this.release(id);
    await this.redis.hset(keys.sandbox(id), { nodeId: '', released: '0', fromWarmPool: '0' });
  }

  /** Returns the sandbox's reservation to its node (once). */
  async release(id: string): Promise<boolean> {
    return (await this.redis.spaceRelease(keys.sandbox(id), KEY_PREFIX)) === 1;
  }

  /**
   * Claims up to `limit` sandboxes past their deadline, each in one atomic step (expire.lua): one
   * whose `onTimeout` is `pause` and that runs gets a queued `sandbox.pause` operation (reason
   * `timeout`; looked at again {@link TIMEOUT_PAUSE_RETRY_MS} later: still running because that
   * pause failed, it is killed); any other moves to killing (reason timeout, or retention when
   * paused) with a queued `sandbox.delete`.
   * Returns the ids of each kind.
   */
  async claimExpired(now = Date.now(), limit = 100): Promise<{ killed: string[]; paused: string[] }> {
    const [killed, paused] = await this.redis.spaceExpire(
      keys.deadlines(),
      keys.operationQueue(),
      KEY_PREFIX,
      String(now),
      String(limit),
      String(TIMEOUT_PAUSE_RETRY_MS),
    );
    return { killed, paused };
  }

  /** Stores a new egress policy (the caller pushes it to the node). */
  async setEgress(id: string, egress: EgressPolicy): Promise<void> {
    await this.redis.hset(keys.sandbox(id), {
      egress: JSON.stringify(egress),
      updatedAt: String(Date.now()),
    });
  }

  /** Sets a live sandbox's lifetime to `timeoutSec` from now. */
  async extend(id: string, timeoutSec: number, now = Date.now()): Promise<TransitionResult> {
    const [ok, current] = await this.redis.spaceExtend(
      keys.sandbox(id),
      keys.deadlines(),
      String(now + timeoutSec * 1000),
      String(timeoutSec),
      String(now),
    );
    return ok === 1 ? { ok: true } : { ok: false, current: (current || null) as SandboxState | null };
  }
}
