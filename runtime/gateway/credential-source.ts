/**
 * Where the gateway gets credential values: the state of record (Redis hash
 * `keys.credential(team, name)`, written by the API), read when an intercepted request needs it and
 * cached for at most `ttlMs`. Reads and the cache are per team and name: a grant of team B never
 * reaches team A's credential of the same name (and the generation check stands behind that).
 * Nothing is kept on disk and nothing comes from the agent, so a delete (revocation) or a PUT
 * (rotation) reaches every gateway within `ttlMs` plus one Redis round trip, whatever restarted.
 */
import type { Redis } from 'ioredis';
import { type CredentialGrant, type CredentialSecret, credentialFromHash } from '../core/credentials.ts';
import { keys } from '../core/redis-keys.ts';
import { DEFAULT_TEAM } from '../core/tenancy.ts';

/** Live credentials for a sandbox's grants. */
export interface CredentialSource {
  /**
   * The current secret of each grant, keyed by grant name; a grant whose credential was deleted, or
   * deleted and registered again (another generation), is absent (revoked). Throws when the store
   * cannot be read (the caller refuses the request: no value is ever guessed or kept from before).
   */
  fetch(grants: readonly CredentialGrant[]): Promise<Map<string, CredentialSecret>>;
}

/** Options of {@link redisCredentialSource}. */
export interface CredentialSourceOptions {
  /** Longest time a read (also "absent") is reused, ms: the bound on how late a revocation lands. */
  ttlMs: number;
  now?: () => number;
}

/** Cache and lookup key of a grant's credential: its team and name. */
const refOf = (g: Pick<CredentialGrant, 'name' | 'team'>) => `${g.team ?? DEFAULT_TEAM}\u0000${g.name}`;

function live(grants: readonly CredentialGrant[], get: (g: CredentialGrant) => CredentialSecret | null) {
  const out = new Map<string, CredentialSecret>();
  for (const g of grants) {
    const c = get(g);
    if (c && (g.generation === undefined || g.generation === c.generation)) out.set(g.name, c);
  }
  return out;
}

/** A {@link CredentialSource} over the API's Redis hashes, with a TTL-bounded cache per name. */
export function redisCredentialSource(redis: Redis, opts: CredentialSourceOptions): CredentialSource {
  const now = opts.now ?? Date.now;
  const cache = new Map<string, { expires: number; secret: CredentialSecret | null }>();
  return {
    async fetch(grants) {
      const t = now();
      const wanted = new Map(grants.map((g) => [refOf(g), g]));
      const stale = [...wanted.keys()].filter((r) => (cache.get(r)?.expires ?? 0) <= t);
      if (stale.length > 0) {
        const pipe = redis.pipeline();
        for (const r of stale) {
          const g = wanted.get(r)!;
          pipe.hgetall(keys.credential(g.team ?? DEFAULT_TEAM, g.name));
        }
        const results = (await pipe.exec()) ?? [];
        stale.forEach((r, i) => {
          const [err, h] = results[i] ?? [new Error('no reply'), null];
          if (err) throw err;
          cache.set(r, { expires: t + opts.ttlMs, secret: credentialFromHash(h as Record<string, string>) });
        });
        // bounded: names no longer asked for fall out once expired
        if (cache.size > 10_000) for (const [k, v] of cache) if (v.expires <= t) cache.delete(k);
      }
      return live(grants, (g) => cache.get(refOf(g))?.secret ?? null);
    },
  };
}

/** A fixed {@link CredentialSource} (tests; a gateway without a state of record). */
export function staticCredentialSource(secrets: readonly CredentialSecret[]): CredentialSource {
  const byName = new Map(secrets.map((s) => [s.name, s]));
  return { fetch: async (grants) => live(grants, (g) => byName.get(g.name) ?? null) };
}
