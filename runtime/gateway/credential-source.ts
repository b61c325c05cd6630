/**
 * Where the gateway gets credential values: the state of record (Redis hash `credential:<name>`,
 * written by the API), read when an intercepted request needs it and cached for at most `ttlMs`.
 * Nothing is kept on disk and nothing comes from the agent, so a delete (revocation) or a PUT
 * (rotation) reaches every gateway within `ttlMs` plus one Redis round trip, whatever restarted.
 */
import type { Redis } from 'ioredis';
import { type CredentialGrant, type CredentialSecret, credentialFromHash } from '../core/credentials.ts';
import { keys } from '../core/redis-keys.ts';

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

function live(grants: readonly CredentialGrant[], get: (name: string) => CredentialSecret | null) {
  const out = new Map<string, CredentialSecret>();
  for (const g of grants) {
    const c = get(g.name);
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
      const stale = [...new Set(grants.map((g) => g.name))].filter((n) => (cache.get(n)?.expires ?? 0) <= t);
      if (stale.length > 0) {
        const pipe = redis.pipeline();
        for (const n of stale) pipe.hgetall(keys.credential(n));
        const results = (await pipe.exec()) ?? [];
        stale.forEach((n, i) => {
          const [err, h] = results[i] ?? [new Error('no reply'), null];
          if (err) throw err;
          cache.set(n, { expires: t + opts.ttlMs, secret: credentialFromHash(h as Record<string, string>) });
        });
        // bounded: names no longer asked for fall out once expired
        if (cache.size > 10_000) for (const [k, v] of cache) if (v.expires <= t) cache.delete(k);
      }
      return live(grants, (n) => cache.get(n)?.secret ?? null);
    },
  };
}

/** A fixed {@link CredentialSource} (tests; a gateway without a state of record). */
export function staticCredentialSource(secrets: readonly CredentialSecret[]): CredentialSource {
  const byName = new Map(secrets.map((s) => [s.name, s]));
  return { fetch: async (grants) => live(grants, (n) => byName.get(n) ?? null) };
}
