/**
 * Signed `/files` URLs as envd checks them (the SDK's `getSignature`:
 * https://github.com/e2b-dev/e2b): the SDK's `uploadUrl()`/`downloadUrl()` sign
 * `path:operation:user:token[:expiration]` with the sandbox's envd access token, so a URL can be
 * handed to a client that holds no token. Pure.
 */
import { createHash, timingSafeEqual } from 'node:crypto';

/** `read` for a download (GET), `write` for an upload (POST). */
export type EnvdFileOperation = 'read' | 'write';

/** What a signed URL names. */
export interface SignedFileRequest {
  /** The `path` query parameter exactly as sent ('' when absent): the SDK signs it unresolved. */
  path: string;
  operation: EnvdFileOperation;
  /** The `username` query parameter ('' when absent). */
  user: string;
  /** The `signature` query parameter (`v1_` + unpadded base64). */
  signature: string;
  /** The `signature_expiration` query parameter (unix seconds), or undefined when the URL never expires. */
  expiration?: string | undefined;
}

/** Why a signed request was refused: envd answers each with 401 and this message. */
export type SignatureRefusal = 'signature is already expired' | 'invalid signature';

/**
 * The signature of `path`/`operation`/`user` under `token`, valid until `expiration` (unix
 * seconds) or forever: `v1_` + standard base64 without padding of SHA-256 over
 * `path:operation:user:token[:expiration]`.
 */
export function envdSignature(o: {
  path: string;
  operation: EnvdFileOperation;
  user: string;
  token: string;
  expiration?: number | undefined;
}): string {
  const raw = `${o.path}:${o.operation}:${o.user}:${o.token}${o.expiration === undefined ? '' : `:${o.expiration}`}`;
  return `v1_${createHash('sha256').update(raw, 'utf8').digest('base64').replace(/=+$/, '')}`;
}

/**
 * Checks a signed request against the sandbox's envd access `token` at `nowSec` (unix seconds).
 * The expiration is checked first, as envd does, so a URL past its time is "expired" whatever
 * else is wrong with it; a malformed expiration counts as an invalid signature.
 * @returns null when the signature holds, else the refusal (answered with 401).
 */
export function checkEnvdSignature(
  req: SignedFileRequest,
  token: string,
  nowSec = Math.floor(Date.now() / 1000),
): SignatureRefusal | null {
  let expiration: number | undefined;
  if (req.expiration !== undefined && req.expiration !== '') {
    if (!/^\d{1,12}$/.test(req.expiration)) return 'invalid signature';
    expiration = Number(req.expiration);
    if (expiration < nowSec) return 'signature is already expired';
  }
  const want = Buffer.from(envdSignature({ ...req, token, expiration }));
  const got = Buffer.from(req.signature);
  return got.length === want.length && timingSafeEqual(got, want) ? null : 'invalid signature';
}
