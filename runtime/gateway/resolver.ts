/**
 * The gateway's own upstream resolution: names are resolved with a dedicated `node:dns` Resolver
 * pointed at `SPACE_GATEWAY_UPSTREAM_DNS` (never the sandbox's choice), answers are split against
 * the deny set, and a small TTL-bounded cache keeps the TLS/HTTP path from re-asking for every
 * connection. Only A records: the gateway dials IPv4 only.
 */
import { Resolver } from 'node:dns/promises';
import { type DenySet, deniedBy } from './addresses.ts';

/** What a name resolved to, split by the deny set. */
export interface Resolution {
  /** Addresses that may be dialled / handed to the sandbox, in upstream order. */
  allowed: string[];
  /** Addresses the upstream returned that fall in the deny set (never used). */
  denied: string[];
  /** Smallest TTL of the records, s (0 when there were none). */
  ttlSec: number;
}

/** Options of {@link createResolver}. */
export interface ResolverOptions {
  /** Upstream servers, `ip:port` each. */
  servers: string[];
  denySet: DenySet;
  /** Query timeout, ms (c-ares tries twice). */
  timeoutMs: number;
  /** Longest time a result is cached, s (further capped by its TTL; 0 disables the cache). */
  cacheMaxSec: number;
  /** Most cached names (oldest evicted first). Default 10 000. */
  maxEntries?: number;
  now?: () => number;
}

/** A resolver for canonical names. */
export interface UpstreamResolver {
  /**
   * Resolves canonical `name` (A records). An empty `allowed` list with no error means NXDOMAIN /
   * NODATA or everything was in the deny set. Throws on upstream failure (timeout, SERVFAIL, refused).
   */
  resolve(name: string): Promise<Resolution>;
  /** Forgets every cached answer. */
  clear(): void;
}

/** Negative answers are cached at most this long, s: short so a newly created record shows soon. */
const NEGATIVE_CACHE_SEC = 5;

/** Builds an {@link UpstreamResolver}. Throws when a server is not `ip:port` / `ip`. */
export function createResolver(opts: ResolverOptions): UpstreamResolver {
  const resolver = new Resolver({ timeout: opts.timeoutMs, tries: 2 });
  resolver.setServers(opts.servers);
  const now = opts.now ?? Date.now;
  const maxEntries = opts.maxEntries ?? 10_000;
  const cache = new Map<string, { expires: number; value: Resolution }>();
  const inflight = new Map<string, Promise<Resolution>>();

  async function query(name: string): Promise<Resolution> {
    let records: { address: string; ttl: number }[];
    try {
      // the trailing dot makes the name absolute: no search domains are appended
      records = await resolver.resolve4(`${name}.`, { ttl: true });
    } catch (err) {
      const code = (err as { code?: string }).code;
      if (code === 'ENOTFOUND' || code === 'ENODATA') records = [];
      else throw err;
    }
    const allowed: string[] = [];
    const denied: string[] = [];
    for (const r of records)
      (deniedBy(r.address, opts.denySet) === undefined ? allowed : denied).push(r.address);
    const ttlSec = records.length === 0 ? 0 : Math.min(...records.map((r) => r.ttl));
    return { allowed, denied, ttlSec };
  }

  return {
    resolve(name) {
      const hit = cache.get(name);
      if (hit && hit.expires > now()) return Promise.resolve(hit.value);
      const pending = inflight.get(name);
      if (pending) return pending;
      const p = query(name)
        .then((value) => {
          const sec =
            value.allowed.length + value.denied.length === 0
              ? Math.min(NEGATIVE_CACHE_SEC, opts.cacheMaxSec)
              : Math.min(value.ttlSec, opts.cacheMaxSec);
          if (sec > 0) {
            cache.delete(name);
            cache.set(name, { expires: now() + sec * 1000, value });
            if (cache.size > maxEntries) cache.delete(cache.keys().next().value as string);
          }
          return value;
        })
        .finally(() => inflight.delete(name));
      inflight.set(name, p);
      return p;
    },
    clear() {
      cache.clear();
    },
  };
}
