/**
 * API keys: `space_<random>` secrets given to clients as `Authorization: Bearer <key>` (E2B
 * clients: `X-API-KEY`). Redis stores only their SHA-256 (a leaked Redis dump can't be replayed as
 * keys), in a hash that names the key's id, team, scopes, expiry and last use.
 *
 * Every request reads the key's hash: nothing is cached in the process, so a revocation (the hash
 * deleted) or an expiry takes effect on the next request on every API replica.
 *
 * **Keys from before teams** (hashes with only `name` and `createdAt`) keep working: the first
 * time one is used — and at every API start, for all of them — it is migrated in place to the
 * default team with every scope and given an id (so it can be listed, rotated and revoked).
 */
import { createHash } from 'node:crypto';
import { existsSync } from 'node:fs';
import { mkdir, writeFile } from 'node:fs/promises';
import { dirname } from 'node:path';
import type { Redis } from 'ioredis';
import { SpaceError } from '../core/errors.ts';
import { newId } from '../core/ids.ts';
import { KEY_PREFIX, keys } from '../core/redis-keys.ts';
import { ALL_SCOPES, type ApiScope, DEFAULT_TEAM, isApiScope } from '../core/tenancy.ts';

const sha256 = (s: string) => createHash('sha256').update(s).digest('hex');

/** How long a key's record outlives its expiry (s), so listings show it as expired for a while. */
const EXPIRED_KEY_KEEP_SEC = 7 * 24 * 3600;
/** `lastUsedAt` is written at most this often per key (ms): a write per request would double the load. */
const LAST_USED_RESOLUTION_MS = 10_000;

/** An API key as the API shows it (never the secret). */
export interface ApiKeyView {
  id: string;
  name: string;
  team: string;
  scopes: ApiScope[];
  createdAt: string;
  /** null: never expires. */
  expiresAt: string | null;
  /** null: never used (to {@link LAST_USED_RESOLUTION_MS}). */
  lastUsedAt: string | null;
  /** Id of the key this one was rotated to (it then expires at the end of the overlap). */
  rotatedTo: string | null;
}

/** Who a request is: the key that authenticated it. */
export interface Principal {
  keyId: string;
  keyName: string;
  team: string;
  scopes: ReadonlySet<ApiScope>;
}

/** What a new key is made with. */
export interface NewApiKey {
  team: string;
  name: string;
  scopes: readonly ApiScope[];
  /** Lifetime from now, s (absent: never expires). */
  expiresInSec?: number;
}

// Legacy key → default team with every scope, once (HSETNX on `id` settles racing replicas).
// KEYS[1] apikey hash; ARGV[1] key prefix, ARGV[2] new id, ARGV[3] scopes, ARGV[4] sha, ARGV[5] now
const MIGRATE_LUA = `
if redis.call('EXISTS', KEYS[1]) == 0 then return '' end
if redis.call('HSETNX', KEYS[1], 'id', ARGV[2]) == 0 then return redis.call('HGET', KEYS[1], 'id') end
redis.call('HSET', KEYS[1], 'team', '${DEFAULT_TEAM}', 'scopes', ARGV[3])
redis.call('SET', ARGV[1] .. 'apikey-id:' .. ARGV[2], ARGV[4])
redis.call('SADD', ARGV[1] .. 'team:${DEFAULT_TEAM}:keys', ARGV[2])
if redis.call('HSETNX', ARGV[1] .. 'team:${DEFAULT_TEAM}', 'id', '${DEFAULT_TEAM}') == 1 then
  redis.call('HSET', ARGV[1] .. 'team:${DEFAULT_TEAM}', 'createdAt', ARGV[5], 'quotas', '{}')
end
redis.call('SADD', ARGV[1] .. 'teams', '${DEFAULT_TEAM}')
return ARGV[2]`;

// A deployment-provisioned key, once: made unless its import was recorded (a revoke then sticks).
// KEYS[1] import marker, KEYS[2] apikey hash, KEYS[3] apikey-id, KEYS[4] team key set
// ARGV[1] id, ARGV[2] name, ARGV[3] scopes, ARGV[4] now, ARGV[5] sha
const IMPORT_LUA = `
if redis.call('SET', KEYS[1], ARGV[1], 'NX') == false then return 0 end
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
redis.call('HSET', KEYS[2], 'id', ARGV[1], 'name', ARGV[2], 'team', '${DEFAULT_TEAM}', 'scopes', ARGV[3],
  'createdAt', ARGV[4], 'expiresAtMs', '')
redis.call('SET', KEYS[3], ARGV[5])
redis.call('SADD', KEYS[4], ARGV[1])
return 1`;

// Sets lastUsedAt only on a key that still exists (a revoke racing with a request must not leave a
// stub hash behind). KEYS[1] apikey hash; ARGV[1] now
const TOUCH_LUA = `if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('HSET', KEYS[1], 'lastUsedAt', ARGV[1]) end`;

function viewOf(h: Record<string, string>): ApiKeyView {
  const iso = (ms: string | undefined) => (ms ? new Date(Number(ms)).toISOString() : null);
  return {
    id: h.id ?? '',
    name: h.name ?? '',
    team: h.team ?? DEFAULT_TEAM,
    scopes: (h.scopes ?? '').split(' ').filter(isApiScope),
    createdAt: iso(h.createdAt) ?? '',
    expiresAt: iso(h.expiresAtMs),
    lastUsedAt: iso(h.lastUsedAt),
    rotatedTo: h.rotatedTo || null,
  };
}

export class ApiKeyStore {
  readonly #redis: Redis;
  constructor(redis: Redis) {
    this.#redis = redis;
  }

  /** Makes a key; returns its view and its secret (shown once, never stored). */
  async create(k: NewApiKey, now = Date.now()): Promise<{ key: ApiKeyView; secret: string }> {
    const secret = newId('space', 40);
    const sha = sha256(secret);
    const id = newId('key');
    const expiresAtMs = k.expiresInSec === undefined ? null : now + k.expiresInSec * 1000;
    const m = this.#redis
      .multi()
      .hset(keys.apiKey(sha), {
        id,
        name: k.name,
        team: k.team,
        scopes: [...new Set(k.scopes)].join(' '),
        createdAt: String(now),
        expiresAtMs: expiresAtMs === null ? '' : String(expiresAtMs),
      })
      .set(keys.apiKeyById(id), sha)
      .sadd(keys.teamApiKeys(k.team), id);
    if (expiresAtMs !== null) {
      const gone = expiresAtMs + EXPIRED_KEY_KEEP_SEC * 1000;
      m.pexpireat(keys.apiKey(sha), gone).pexpireat(keys.apiKeyById(id), gone);
    }
    await m.exec();
    return { key: viewOf(await this.#redis.hgetall(keys.apiKey(sha))), secret };
  }

  /**
   * Checks an `Authorization: Bearer <key>` header and returns who it is. Reads Redis every time
   * (revocation is immediate on every replica); notes the use at most every 10 s.
   * @throws SpaceError UNAUTHENTICATED (no header, unknown or revoked key), API_KEY_EXPIRED.
   */
  async authenticate(header: string | undefined, now = Date.now()): Promise<Principal> {
    const m = /^Bearer\s+(\S+)$/i.exec(header ?? '');
    if (!m) throw new SpaceError('UNAUTHENTICATED', 'missing "Authorization: Bearer <api key>" header');
    const sha = sha256(m[1]!);
    let h = await this.#redis.hgetall(keys.apiKey(sha));
    if (!h.name) throw new SpaceError('UNAUTHENTICATED', 'unknown API key');
    if (!h.team) {
      await this.#migrate(sha);
      h = await this.#redis.hgetall(keys.apiKey(sha));
      if (!h.name) throw new SpaceError('UNAUTHENTICATED', 'unknown API key');
    }
    if (h.expiresAtMs && Number(h.expiresAtMs) <= now) {
      throw new SpaceError(
        'API_KEY_EXPIRED',
        `API key ${h.id} expired at ${new Date(Number(h.expiresAtMs)).toISOString()}`,
        {
          keyId: h.id,
          ...(h.rotatedTo ? { rotatedTo: h.rotatedTo } : {}),
        },
      );
    }
    if (!h.lastUsedAt || now - Number(h.lastUsedAt) >= LAST_USED_RESOLUTION_MS) {
      await this.#redis.eval(TOUCH_LUA, 1, keys.apiKey(sha), String(now));
    }
    const v = viewOf(h);
    return { keyId: v.id, keyName: v.name, team: v.team, scopes: new Set(v.scopes) };
  }

  /** Migrates a pre-team key (see the module doc); returns its id ('' when it vanished). */
  async #migrate(sha: string): Promise<string> {
    return (await this.#redis.eval(
      MIGRATE_LUA,
      1,
      keys.apiKey(sha),
      KEY_PREFIX,
      newId('key'),
      ALL_SCOPES.join(' '),
      sha,
      String(Date.now()),
    )) as string;
  }

  /** Migrates every pre-team key (at API start; safe on every replica at once). Returns how many. */
  async migrateLegacyKeys(): Promise<number> {
    let n = 0;
    let cursor = '0';
    do {
      const [next, found] = await this.#redis.scan(cursor, 'MATCH', `${KEY_PREFIX}apikey:*`, 'COUNT', 500);
      cursor = next;
      for (const key of found) {
        const [team, name] = await this.#redis.hmget(key, 'team', 'name');
        if (!team && name) {
          await this.#migrate(key.slice(`${KEY_PREFIX}apikey:`.length));
          n++;
        }
      }
    } while (cursor !== '0');
    return n;
  }

  /** Key `id` of team `team`, or API_KEY_NOT_FOUND (another team's key reads as absent). */
  async get(team: string, id: string): Promise<ApiKeyView & { sha: string }> {
    const sha = await this.#redis.get(keys.apiKeyById(id));
    const h = sha ? await this.#redis.hgetall(keys.apiKey(sha)) : {};
    if (!sha || !h.name || (h.team ?? DEFAULT_TEAM) !== team) {
      throw new SpaceError('API_KEY_NOT_FOUND', `no API key ${id}`, { keyId: id });
    }
    return { ...viewOf(h), sha };
  }

  /** Team `team`'s keys, oldest first (ids whose record is gone are pruned). */
  async list(team: string): Promise<ApiKeyView[]> {
    const ids = await this.#redis.smembers(keys.teamApiKeys(team));
    const out: ApiKeyView[] = [];
    for (const id of ids) {
      const sha = await this.#redis.get(keys.apiKeyById(id));
      const h = sha ? await this.#redis.hgetall(keys.apiKey(sha)) : {};
      if (!h.name) {
        await this.#redis.srem(keys.teamApiKeys(team), id);
        continue;
      }
      out.push(viewOf(h));
    }
    return out.sort((a, b) => a.createdAt.localeCompare(b.createdAt) || a.id.localeCompare(b.id));
  }

  /** Revokes key `id` of team `team` at once (its record is deleted). @throws API_KEY_NOT_FOUND. */
  async revoke(team: string, id: string): Promise<ApiKeyView> {
    const k = await this.get(team, id);
    await this.#redis
      .multi()
      .del(keys.apiKey(k.sha))
      .del(keys.apiKeyById(id))
      .srem(keys.teamApiKeys(team), id)
      .exec();
    const { sha: _sha, ...view } = k;
    return view;
  }

  /**
   * Rotates key `id`: a new key with the same name, team and scopes (and the same lifetime length,
   * when the old one had one, unless `expiresInSec` says otherwise); the old key keeps working for
   * `overlapSec` more (never longer than it would have anyway), then expires.
   * @throws SpaceError API_KEY_NOT_FOUND.
   */
  async rotate(
    team: string,
    id: string,
    opts: { overlapSec: number; expiresInSec?: number },
    now = Date.now(),
  ): Promise<{ key: ApiKeyView; secret: string; previous: ApiKeyView }> {
    const old = await this.get(team, id);
    const lifetimeSec =
      opts.expiresInSec ??
      (old.expiresAt
        ? Math.max(1, Math.round((Date.parse(old.expiresAt) - Date.parse(old.createdAt)) / 1000))
        : undefined);
    const made = await this.create(
      {
        team,
        name: old.name,
        scopes: old.scopes,
        ...(lifetimeSec === undefined ? {} : { expiresInSec: lifetimeSec }),
      },
      now,
    );
    const endMs = Math.min(
      now + opts.overlapSec * 1000,
      old.expiresAt ? Date.parse(old.expiresAt) : Infinity,
    );
    const gone = endMs + EXPIRED_KEY_KEEP_SEC * 1000;
    await this.#redis
      .multi()
      .hset(keys.apiKey(old.sha), { expiresAtMs: String(endMs), rotatedTo: made.key.id })
      .pexpireat(keys.apiKey(old.sha), gone)
      .pexpireat(keys.apiKeyById(id), gone)
      .exec();
    const { sha: _sha, ...previous } = await this.get(team, id);
    return { ...made, previous };
  }
}

/** What `SPACE_BOOTSTRAP_API_KEY_SHA256` holds: the SHA-256 of a key, 64 lower-case hex digits. */
export const KEY_SHA256 = /^[0-9a-f]{64}$/;

/**
 * Imports a key the deployment made (Pulumi holds it as a secret and hands the API only its
 * SHA-256, `SPACE_BOOTSTRAP_API_KEY_SHA256`): an admin of the default team with every scope, named
 * `deployment`. Once per hash, atomically (replicas may start together): a key revoked later is
 * not imported again. Returns whether it was made now. @throws Error when `sha256Hex` is not
 * {@link KEY_SHA256}.
 */
export async function importBootstrapKey(
  redis: Redis,
  sha256Hex: string,
  now = Date.now(),
): Promise<boolean> {
  if (!KEY_SHA256.test(sha256Hex)) throw new Error('bootstrap key: not a SHA-256 hex digest');
  const id = newId('key');
  const made = await redis.eval(
    IMPORT_LUA,
    4,
    keys.bootstrapKeyImported(sha256Hex),
    keys.apiKey(sha256Hex),
    keys.apiKeyById(id),
    keys.teamApiKeys(DEFAULT_TEAM),
    id,
    'deployment',
    ALL_SCOPES.join(' '),
    String(now),
    sha256Hex,
  );
  return made === 1;
}

/**
 * Creates an admin key of the default team (every scope) and writes it to `file` (mode 0600)
 * unless the file exists already — the local stack's first start. Returns whether a key was made.
 */
export async function bootstrapApiKeyFile(store: ApiKeyStore, file: string): Promise<boolean> {
  if (existsSync(file)) return false;
  await mkdir(dirname(file), { recursive: true, mode: 0o700 });
  const { secret } = await store.create({ team: DEFAULT_TEAM, name: 'local-bootstrap', scopes: ALL_SCOPES });
  await writeFile(file, `${secret}\n`, { mode: 0o600, flag: 'wx' });
  return true;
}
