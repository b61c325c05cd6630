import { randomBytes } from 'node:crypto';

/** Lower-case alphabet without look-alikes; ids are safe in URLs, file names and interface names. */
const ALPHABET = 'abcdefghijkmnopqrstuvwxyz23456789';

/**
 * A new random id `<prefix>_<20 chars>` (≈ 100 bits of entropy), e.g. `sbx_k3…`.
 * Prefixes in use: `sbx` sandbox, `op` operation, `cmd` command, `ses` session, `i` instance, `key` API key.
 */
export function newId(prefix: string, length = 20): string {
  const bytes = randomBytes(length);
  let out = '';
  for (const b of bytes) out += ALPHABET[b % ALPHABET.length];
  return `${prefix}_${out}`;
}

/** Pattern every id made by {@link newId} matches (used in route schemas). */
export const ID_PATTERN = '^[a-z]{1,8}_[a-z0-9]{8,40}$';
