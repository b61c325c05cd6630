/**
 * Crusoe API request signing, version 1.0 (crusoecloud/terraform-provider-crusoe
 * `internal/common/auth.go`, identical to crusoecloud/client-go `auth/v1/auth.go`; docs/deployment.md "Crusoe"):
 * message = path (with the `/v1` prefix) + "\n" + canonical query + "\n" + METHOD + "\n" +
 * timestamp + "\n"; HMAC-SHA256 keyed with the base64url-decoded secret; header
 * `Authorization: Bearer 1.0:<access key id>:<base64url(signature), no padding>` and
 * `X-Crusoe-Timestamp: <RFC 3339, seconds>`. The body is not signed.
 */
import { createHmac } from 'node:crypto';

/** Signature version this module implements. */
export const SIGNATURE_VERSION = '1.0';

/** Go's `url.QueryEscape` (form encoding: space as `+`). */
function formEscape(s: string): string {
  return encodeURIComponent(s)
    .replace(/[!'()*]/g, (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`)
    .replace(/%20/g, '+');
}

/** The canonical form of a raw query string (without `?`); empty for none. A `;` is an error. */
export function canonicalQuery(raw: string): string {
  if (raw === '') return '';
  if (raw.includes(';')) throw new Error('crusoe signing: ";" is not allowed in a query string');
  const pairs = raw
    .split('&')
    .filter(Boolean)
    .map((p) => {
      const i = p.indexOf('=');
      const [k, v] = i < 0 ? [p, ''] : [p.slice(0, i), p.slice(i + 1)];
      const dec = (s: string) => decodeURIComponent(s.replace(/\+/g, ' '));
      return [dec(k), dec(v)] as const;
    });
  // Array.prototype.sort is stable: values of one key keep their order
  pairs.sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  return pairs.map(([k, v]) => `${formEscape(k)}=${formEscape(v)}`).join('&');
}

/** RFC 3339 UTC timestamp with seconds precision, e.g. `2026-11-29T17:00:00Z`. */
export function crusoeTimestamp(d: Date): string {
  return `${d.toISOString().slice(0, 19)}Z`;
}

/** What to sign. `path` is the URL path including the version prefix (`/v1/projects/…`). */
export interface SignInput {
  readonly method: string;
  readonly path: string;
  readonly query: string;
  readonly timestamp: string;
  readonly accessKeyId: string;
  /** The secret key as Crusoe issues it: base64url without padding. */
  readonly secretKey: string;
}

/** The signed message (four lines, each ending in `\n`). */
export function signingMessage(i: Pick<SignInput, 'method' | 'path' | 'query' | 'timestamp'>): string {
  return `${i.path}\n${canonicalQuery(i.query)}\n${i.method.toUpperCase()}\n${i.timestamp}\n`;
}

/** The two headers that authenticate one request. */
export function signRequest(i: SignInput): { authorization: string; 'x-crusoe-timestamp': string } {
  const sig = createHmac('sha256', Buffer.from(i.secretKey, 'base64url'))
    .update(signingMessage(i))
    .digest('base64url');
  return {
    authorization: `Bearer ${SIGNATURE_VERSION}:${i.accessKeyId}:${sig}`,
    'x-crusoe-timestamp': i.timestamp,
  };
}
