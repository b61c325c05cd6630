/**
 * Session tokens and dispatch tokens (JWS, EdDSA/Ed25519 via `jose`).
 *
 * - A **session token** lets a client use the data plane of one sandbox session: claims
 *   `sub` = sandbox id, `sid` = session id, `scope` = space-separated scopes, `team` = the team
 *   owning the sandbox, `streams` = the team's open-streams quota when the token was minted, `exp`,
 *   `aud` = `space-data-plane`. The router refuses a token whose team is not the sandbox's (a token
 *   without `team`, minted before teams, counts as the default team's). The agent counts each
 *   command stream against `streams` (a token without it is not counted). Minted by the API
 *   (private key), verified offline by the node agent (public key) — no call back to the control
 *   plane.
 * - A **dispatch token** authenticates the API to a node agent's internal routes: `aud` =
 *   `space-agent`, `sub` = node id, 60 s lifetime.
 */
import { readFile, writeFile } from 'node:fs/promises';
import {
  exportPKCS8,
  exportSPKI,
  generateKeyPair,
  importPKCS8,
  importSPKI,
  errors as joseErrors,
  jwtVerify,
  SignJWT,
} from 'jose';
import { SpaceError } from './errors.ts';

const ALG = 'EdDSA';
const ISSUER = 'space-api';
/** Audience of session tokens. */
export const DATA_PLANE_AUDIENCE = 'space-data-plane';
/** Audience of dispatch tokens. */
export const AGENT_AUDIENCE = 'space-agent';
/** Lifetime of a dispatch token, seconds. */
export const DISPATCH_TOKEN_TTL_SEC = 60;

/**
 * Scopes a session token can carry. `ports`: the router's tunnels to servers listening in the
 * sandbox (its port token, kept in the sandbox's record; never handed to clients).
 */
export type SessionScope = 'commands' | 'files' | 'ports';
export const SESSION_SCOPES: readonly SessionScope[] = ['commands', 'files', 'ports'];

/** Claims of a verified session token. */
export interface SessionClaims {
  sandboxId: string;
  sessionId: string;
  scopes: SessionScope[];
  /** Team owning the sandbox; null for tokens minted before teams (the default team's). */
  team: string | null;
  /**
   * The team's open-streams quota when the token was minted (0 = unlimited); null for tokens
   * minted before the quota was enforced (their streams are not counted).
   */
  maxStreams: number | null;
  /** Epoch seconds. */
  expiresAt: number;
}

export type SigningKey = Awaited<ReturnType<typeof importPKCS8>>;
export type VerifyKey = Awaited<ReturnType<typeof importSPKI>>;

/** Generates an Ed25519 key pair and writes it as PEM (private key mode 0600). */
export async function writeNewKeyPair(privatePath: string, publicPath: string): Promise<void> {
  const { privateKey, publicKey } = await generateKeyPair(ALG, { crv: 'Ed25519', extractable: true });
  await writeFile(privatePath, await exportPKCS8(privateKey), { mode: 0o600, flag: 'wx' });
  await writeFile(publicPath, await exportSPKI(publicKey), { mode: 0o644 });
}

/** Loads the PKCS#8 PEM private key that signs tokens. */
export async function loadSigningKey(path: string): Promise<SigningKey> {
  return importPKCS8(await readFile(path, 'utf8'), ALG);
}

/** Loads the SPKI PEM public key that verifies tokens. */
export async function loadVerifyKey(path: string): Promise<VerifyKey> {
  return importSPKI(await readFile(path, 'utf8'), ALG);
}

/**
 * Signs a session token for `claims.sandboxId`/`sessionId` of team `team`, valid `ttlSec` seconds.
 * Returns the token and its expiry (epoch seconds).
 */
export async function mintSessionToken(
  key: SigningKey,
  c: {
    sandboxId: string;
    sessionId: string;
    team: string;
    scopes: readonly SessionScope[];
    ttlSec: number;
    /**
     * The team's open-streams quota in force now (0 = unlimited). Absent: the token's streams are
     * not counted (only tests mint such tokens; every API mint passes it).
     */
    maxStreams?: number;
  },
): Promise<{ token: string; expiresAt: number }> {
  const now = Math.floor(Date.now() / 1000);
  const expiresAt = now + c.ttlSec;
  const token = await new SignJWT({
    sid: c.sessionId,
    scope: c.scopes.join(' '),
    team: c.team,
    ...(c.maxStreams === undefined ? {} : { streams: c.maxStreams }),
  })
    .setProtectedHeader({ alg: ALG, typ: 'JWT' })
    .setIssuer(ISSUER)
    .setAudience(DATA_PLANE_AUDIENCE)
    .setSubject(c.sandboxId)
    .setIssuedAt(now)
    .setExpirationTime(expiresAt)
    .sign(key);
  return { token, expiresAt };
}

function rethrow(err: unknown): never {
  if (err instanceof joseErrors.JWTExpired) throw new SpaceError('TOKEN_EXPIRED', 'token has expired');
  if (err instanceof joseErrors.JWTClaimValidationFailed) {
    throw new SpaceError('TOKEN_SCOPE', `token claim "${err.claim}" does not match`);
  }
  throw new SpaceError('TOKEN_INVALID', 'token is malformed or its signature is invalid', undefined, {
    cause: err,
  });
}

/**
 * Verifies a session token offline and checks it is for `sandboxId` and carries `scope`.
 * Throws TOKEN_INVALID, TOKEN_EXPIRED or TOKEN_SCOPE. The caller checks `sessionId` against the
 * sandbox's current session.
 */
export async function verifySessionToken(
  key: VerifyKey,
  token: string,
  expect: { sandboxId: string; scope: SessionScope },
): Promise<SessionClaims> {
  let payload: Awaited<ReturnType<typeof jwtVerify>>['payload'];
  try {
    ({ payload } = await jwtVerify(token, key, {
      issuer: ISSUER,
      audience: DATA_PLANE_AUDIENCE,
      algorithms: [ALG],
    }));
  } catch (err) {
    rethrow(err);
  }
  const scopes = typeof payload.scope === 'string' ? payload.scope.split(' ') : [];
  if (payload.sub !== expect.sandboxId) throw new SpaceError('TOKEN_SCOPE', 'token is for another sandbox');
  if (!scopes.includes(expect.scope))
    throw new SpaceError('TOKEN_SCOPE', `token lacks scope "${expect.scope}"`);
  if (typeof payload.sid !== 'string') throw new SpaceError('TOKEN_INVALID', 'token has no session');
  return {
    sandboxId: payload.sub,
    sessionId: payload.sid,
    scopes: scopes.filter((s): s is SessionScope => (SESSION_SCOPES as string[]).includes(s)),
    team: typeof payload.team === 'string' ? payload.team : null,
    maxStreams:
      typeof payload.streams === 'number' && Number.isInteger(payload.streams) && payload.streams >= 0
        ? payload.streams
        : null,
    expiresAt: payload.exp ?? 0,
  };
}

/**
 * Signs a short-lived token the API sends on calls to node `nodeId`'s internal routes: issued at
 * `nowMs` (whole seconds, floored), expiring {@link DISPATCH_TOKEN_TTL_SEC} later.
 */
export async function mintDispatchToken(
  key: SigningKey,
  nodeId: string,
  nowMs = Date.now(),
): Promise<string> {
  const iat = Math.floor(nowMs / 1000);
  return new SignJWT({})
    .setProtectedHeader({ alg: ALG, typ: 'JWT' })
    .setIssuer(ISSUER)
    .setAudience(AGENT_AUDIENCE)
    .setSubject(nodeId)
    .setIssuedAt(iat)
    .setExpirationTime(iat + DISPATCH_TOKEN_TTL_SEC)
    .sign(key);
}

/** Verifies a dispatch token for this node. Throws UNAUTHENTICATED / TOKEN_EXPIRED / TOKEN_SCOPE. */
export async function verifyDispatchToken(key: VerifyKey, token: string, nodeId: string): Promise<void> {
  await checkDispatchToken(key, token, nodeId, Date.now());
}

/** The dispatch token check at `nowMs`; returns the token's `exp` (seconds), if it has one. */
async function checkDispatchToken(
  key: VerifyKey,
  token: string,
  nodeId: string,
  nowMs: number,
): Promise<number | undefined> {
  try {
    const { payload } = await jwtVerify(token, key, {
      issuer: ISSUER,
      audience: AGENT_AUDIENCE,
      subject: nodeId,
      algorithms: [ALG],
      currentDate: new Date(nowMs),
    });
    return payload.exp;
  } catch (err) {
    rethrow(err);
  }
}

/**
 * Verifies dispatch tokens for node `nodeId` as {@link verifyDispatchToken} does, remembering the ones it
 * verified until they expire: the API reuses one token per node for half its lifetime
 * (DISPATCH_TOKEN_REUSE_MARGIN_MS in api/agent-client.ts), so most calls carry a token already
 * checked, and an EdDSA verify per dispatch was a measurable share of an agent's CPU under a burst
 * of creates. A token is a fixed string: what was true of it (signature, issuer, audience,
 * subject) stays true; only its expiry is checked again, on each use. Holds a bounded number of
 * tokens (forgets them all when full).
 */
export class DispatchTokenVerifier {
  static readonly MAX_REMEMBERED = 64;
  readonly #key: VerifyKey;
  readonly #nodeId: string;
  readonly #max: number;
  /** Verified token → its expiry, ms since the epoch. */
  readonly #verified = new Map<string, number>();

  /** `maxRemembered` (default {@link DispatchTokenVerifier.MAX_REMEMBERED}): tokens held at once. */
  constructor(key: VerifyKey, nodeId: string, maxRemembered = DispatchTokenVerifier.MAX_REMEMBERED) {
    this.#key = key;
    this.#nodeId = nodeId;
    this.#max = maxRemembered;
  }

  /** Throws TOKEN_INVALID / TOKEN_EXPIRED / TOKEN_SCOPE as {@link verifyDispatchToken}. */
  async verify(token: string, nowMs = Date.now()): Promise<void> {
    const expMs = this.#verified.get(token);
    if (expMs !== undefined) {
      if (nowMs < expMs) return;
      this.#verified.delete(token);
      throw new SpaceError('TOKEN_EXPIRED', 'token has expired');
    }
    const exp = await checkDispatchToken(this.#key, token, this.#nodeId, nowMs);
    if (exp === undefined) return; // mintDispatchToken always sets one; never remember a token without
    if (this.#verified.size >= this.#max) this.#verified.clear();
    this.#verified.set(token, exp * 1000);
  }
}
