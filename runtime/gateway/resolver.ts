/**
 * The gateway's own upstream resolution: names are resolved with a dedicated `node:dns` Resolver
 * pointed at `SPACE_GATEWAY_UPSTREAM_DNS` (never the sandbox's choice), answers are split against
 * the deny set, and a small TTL-bounded cache keeps the TLS/HTTP path from re-asking for every
 * connection. Only A records: the gateway dials IPv4 only.
 */
import { Resolver } from 'node:dns/promises';
import type { DenyCheck } from './deny-set.ts';

/** What a name resolved to, split by the deny set. */
export interface Resolution {
  /** Addresses that may be dialled / handed to the sandbox, in upstream order. */
  allowed: string[];
  /** Addresses the upstream returned that fall in the deny set (never used). */
  denied: string[];
  /** Smallest TTL of the records, s (0 when there were none). */
  ttlSec: number;
  /** The CNAME targets between the name and its addresses, in order (empty when none). */
  chain: string[];
}

/** Options of {@link createResolver}. */
export interface ResolverOptions {
  /** Upstream servers, `ip:port` each. */
  servers: string[];
  /** Consulted at every `resolve()` (not when caching): a deny set that changes applies at once. */
  denySet: DenyCheck;
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
  const cache = new Map<string, { expires: number; value: Raw }>();
  const inflight = new Map<string, Promise<Raw>>();
  type Raw = { addresses: string[]; ttlSec: number; chain: string[] };

  /** The CNAME chain below `name` (at most 8 links; a failed lookup ends it). */
  async function cnames(name: string): Promise<string[]> {
    const chain: string[] = [];
    let cur = name;
    for (let i = 0; i < 8; i++) {
      const next = await resolver.resolveCname(`${cur}.`).then(
        (r) => r[0]?.toLowerCase().replace(/\.$/, ''),
        () => undefined,
      );
      if (!next || chain.includes(next)) break;
      chain.push(next);
      cur = next;
    }
    return chain;
  }

  async function query(name: string): Promise<Raw> {
    let records: { address: string; ttl: number }[];
    // the chain is asked for beside the addresses: a name whose chain passes through a denied name
    // is refused by the caller (E8)
    const chain = cnames(name);
    try {
      // the trailing dot makes the name absolute: no search domains are appended
      records = await resolver.resolve4(`${name}.`, { ttl: true });
    } catch (err) {
      const code = (err as { code?: string }).code;
      if (code === 'ENOTFOUND' || code === 'ENODATA') records = [];
      else throw err;
    }
    const ttlSec = records.length === 0 ? 0 : Math.min(...records.map((r) => r.ttl));
    return { addresses: records.map((r) => r.address), ttlSec, chain: await chain };
  }

  function split(raw: Raw): Resolution {
    const allowed: string[] = [];
    const denied: string[] = [];
    for (const a of raw.addresses) (opts.denySet.deniedBy(a) === undefined ? allowed : denied).push(a);
    return { allowed, denied, ttlSec: raw.ttlSec, chain: raw.chain };
  }

  return {
    resolve(name) {
      const hit = cache.get(name);
      if (hit && hit.expires > now()) return Promise.resolve(split(hit.value));
      const pending = inflight.get(name);
      if (pending) return pending.then(split);
      const p = query(name)
        .then((value) => {
          const sec =
            value.addresses.length === 0
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
      return p.then(split);
    },
    clear() {
      cache.clear();
    },
  };
}
