/**
 * The sandbox list's metadata filter (v1 `?metadata=` and E2B's): key/value pairs that must all
 * match. A key given twice with two values could never match one sandbox (a key has one value), so
 * it is refused rather than reduced to one of them (R26).
 */
import { SpaceError } from '../core/errors.ts';

/**
 * Folds `pairs` into the filter's `{ key: value }`; a pair repeated with the same value counts once.
 * @throws SpaceError BAD_REQUEST naming the key and both values when a key comes with two values.
 */
export function metadataFilter(pairs: Iterable<readonly [string, string]>): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, v] of pairs) {
    if (Object.hasOwn(out, k) && out[k] !== v) {
      throw new SpaceError(
        'BAD_REQUEST',
        `metadata filter gives key "${k}" twice (${JSON.stringify(out[k])} and ${JSON.stringify(v)}); a sandbox has one value per key`,
        { key: k },
      );
    }
    out[k] = v;
  }
  return out;
}

/**
 * The v1 list's `metadata` query value(s): each a URL-encoded query string of pairs (`team%3Da`),
 * the key itself repeatable (`?metadata=a%3D1&metadata=b%3D2`); all pairs must match.
 * @throws SpaceError BAD_REQUEST as {@link metadataFilter}.
 */
export function parseV1MetadataQuery(raw: string | readonly string[]): Record<string, string> {
  const values = typeof raw === 'string' ? [raw] : raw;
  return metadataFilter(values.flatMap((v) => [...new URLSearchParams(v)]));
}
