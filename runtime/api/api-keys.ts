/**
 * API keys: `space_<random>` secrets given to clients as `Authorization: Bearer <key>`. Redis
 * stores only their SHA-256 (a leaked Redis dump can't be replayed as keys).
 */
import { createHash } from 'node:crypto';
import { existsSync } from 'node:fs';
import { mkdir, writeFile } from 'node:fs/promises';
import { dirname } from 'node:path';
import type { Redis } from 'ioredis';
import { SpaceError } from '../core/errors.ts';
import { newId } from '../core/ids.ts';
import { keys } from '../core/redis-keys.ts';

const sha256 = (s: string) => createHash('sha256').update(s).digest('hex');

/** Makes a new key named `name`; returns the secret (shown once, never stored). */
export async function createApiKey(redis: Redis, name: string): Promise<string> {
  const secret = newId('space', 40);
  await redis.hset(keys.apiKey(sha256(secret)), { name, createdAt: String(Date.now()) });
  return secret;
}

/**
 * Creates a key and writes it to `file` (mode 0600) unless the file exists already — the local
 * stack's first start. Returns whether a key was made.
 */
export async function bootstrapApiKeyFile(redis: Redis, file: string): Promise<boolean> {
  if (existsSync(file)) return false;
  await mkdir(dirname(file), { recursive: true, mode: 0o700 });
  const secret = await createApiKey(redis, 'local-bootstrap');
  await writeFile(file, `${secret}\n`, { mode: 0o600, flag: 'wx' });
  return true;
}

/** Checks an `Authorization` header; returns the key's name. Throws UNAUTHENTICATED. */
export async function authenticate(redis: Redis, header: string | undefined): Promise<string> {
  const m = /^Bearer\s+(\S+)$/i.exec(header ?? '');
  if (!m) throw new SpaceError('UNAUTHENTICATED', 'missing "Authorization: Bearer <api key>" header');
  const name = await redis.hget(keys.apiKey(sha256(m[1]!)), 'name');
  if (name === null) throw new SpaceError('UNAUTHENTICATED', 'unknown API key');
  return name;
}
