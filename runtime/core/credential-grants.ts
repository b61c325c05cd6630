/**
 * A sandbox's credential grants as a node registers them with its gateway, resolved from the
 * control plane's records (Redis; values never): the API resolves them so for each dispatch
 * (api/credential-store.ts), a node agent to rebuild a torn sandbox record
 * (agent/sandboxes/recover-record.ts). One function, so both skip the same grants.
 */
import type { Redis } from 'ioredis';
import { type CredentialGrant, credentialFromHash } from './credentials.ts';
import { keys } from './redis-keys.ts';
import { DEFAULT_TEAM } from './tenancy.ts';

/** What resolving reads of a grant a sandbox's record keeps (the API's `SandboxGrant` has more). */
export interface RecordedGrant {
  name: string;
  placeholder: string;
  /** The credential's generation when granted (absent in records written before generations). */
  generation?: string;
  /** The credential's team (absent in records written before teams: the default team). */
  team?: string;
}

/**
 * The gateway grants for `grants`, each with its credential's current domains, header and format;
 * a credential deleted since, or rotated (a generation other than the granted one), is skipped.
 * @throws what Redis throws.
 */
export async function resolveGrants(
  redis: Redis,
  grants: readonly RecordedGrant[],
): Promise<CredentialGrant[]> {
  // read together (one connection sends them back to back): one round trip, not one per grant
  const hashes = await Promise.all(
    grants.map((g) => redis.hgetall(keys.credential(g.team ?? DEFAULT_TEAM, g.name))),
  );
  const out: CredentialGrant[] = [];
  for (const [i, g] of grants.entries()) {
    const c = credentialFromHash(hashes[i]!);
    if (!c || (g.generation !== undefined && c.generation !== g.generation)) continue;
    out.push({
      name: g.name,
      placeholder: g.placeholder,
      domains: c.domains,
      header: c.header,
      format: c.format,
      generation: c.generation,
      ...(g.team ? { team: g.team } : {}),
    });
  }
  return out;
}
