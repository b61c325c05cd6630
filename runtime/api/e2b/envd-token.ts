/**
 * The envd access token of a sandbox, for the E2B layer: a SPACE session token with both
 * data-plane scopes, for the sandbox's current session, valid as long as the longest lifetime a
 * client may set. One per sandbox, kept in Redis (`keys.e2bEnvdToken`): create, connect and get
 * answer the same token, and the router checks `/files` URLs the SDK signed with it.
 */
import { envdTokenTtlSec, keys } from '../../core/redis-keys.ts';
import { mintSessionToken } from '../../core/tokens.ts';
import type { ApiDeps } from '../app.ts';
import type { SandboxRecord } from '../sandbox-store.ts';

/**
 * The stored token of `rec`, or a new one minted and stored when there is none (first create, or
 * the stored one is within a minute of its end); `SET NX` makes racing mints agree on one.
 */
export async function envdToken(deps: ApiDeps, rec: SandboxRecord): Promise<string> {
  const key = keys.e2bEnvdToken(rec.id);
  const stored = await deps.redis.get(key);
  if (stored) return stored;
  const ttlSec = Math.max(deps.config.sessionTokenTtlSec, deps.config.maxTimeoutSec);
  const grant = await mintSessionToken(deps.signingKey, {
    sandboxId: rec.id,
    sessionId: rec.sessionId,
    team: rec.team,
    maxStreams: (await deps.teams.quotas(rec.team)).streams,
    scopes: ['commands', 'files'],
    ttlSec,
  });
  const set = await deps.redis.set(key, grant.token, 'EX', envdTokenTtlSec(ttlSec), 'NX');
  return set ? grant.token : ((await deps.redis.get(key)) ?? grant.token);
}
