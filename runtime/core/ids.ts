import { randomBytes } from 'node:crypto';

/** Lower-case alphabet without look-alikes; ids are safe in URLs, file names and interface names. */
const ALPHABET = 'abcdefghijkmnopqrstuvwxyz23456789';

function randomChars(length: number): string {
  const bytes = randomBytes(length);
  let out = '';
  for (const b of bytes) out += ALPHABET[b % ALPHABET.length];
  return out;
}

/**
 * A new random id `<prefix>_<20 chars>` (≈ 100 bits of entropy), e.g. `op_k3…`.
 * Prefixes in use: `op` operation, `cmd` command, `ses` session, `i` instance, `key` API key
 * (sandboxes: {@link newSandboxId}).
 */
export function newId(prefix: string, length = 20): string {
  return `${prefix}_${randomChars(length)}`;
}

/**
 * A new sandbox id `sbx<20 chars>`, e.g. `sbxk3m…` (≈ 100 bits of entropy). No separator: a
 * sandbox id is a DNS label part, since E2B clients address a sandbox's port as
 * `<port>-<sandboxId>.<domain>` (split on `-`; E2B's own ids are `^[a-z0-9]+$`, as its control
 * plane returns them to the SDK: https://github.com/e2b-dev/e2b). Ids made before this (`sbx_…`) stay valid.
 */
export function newSandboxId(): string {
  return `sbx${randomChars(20)}`;
}

/**
 * Pattern every platform id matches (used in route schemas): `<prefix>_<chars>` from
 * {@link newId}, or the DNS-safe `<prefix><chars>` from {@link newSandboxId}.
 */
export const ID_PATTERN = '^(?:[a-z]{1,8}_[a-z0-9]{8,40}|[a-z]{1,8}[a-z0-9]{8,40})$';

/** Pattern of a DNS-safe sandbox id (a valid DNS label part without `-` or `_`). */
export const DNS_SAFE_ID_PATTERN = '^[a-z][a-z0-9]{8,47}$';
