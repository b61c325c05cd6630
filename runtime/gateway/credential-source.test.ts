/** The Redis credential source against a real redis-server (from the global setup). */
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { keys } from '../core/redis-keys.ts';
import { redisCredentialSource } from './credential-source.ts';
import type { CredentialGrant } from './credentials.ts';

let redis: Redis;
const name = `src-test-${process.pid}`;
const grant: CredentialGrant = {
  name,
  placeholder: 'space_ph_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa',
  domains: ['api.x.test'],
  header: 'authorization',
  format: 'Bearer {value}',
  generation: 'gen-1',
};

beforeAll(async () => {
  redis = new Redis(inject('redisUrl'), { db: 5 });
  await redis.hset(keys.credential('default', name), {
    name,
    generation: 'gen-1',
    domains: '["api.x.test"]',
    header: 'authorization',
    format: 'Bearer {value}',
    value: 'first-value-123',
  });
});
afterAll(async () => {
  await redis.del(keys.credential('default', name));
  redis.disconnect();
});

describe('redisCredentialSource', () => {
  it('reads values when asked; rotation and revocation land once the cache time has passed', async () => {
    let t = 1_000;
    const src = redisCredentialSource(redis, { ttlMs: 2000, now: () => t });
    expect((await src.fetch([grant])).get(name)?.value).toBe('first-value-123');
    await redis.hset(keys.credential('default', name), 'value', 'rotated-value-456');
    t += 1999;
    expect((await src.fetch([grant])).get(name)?.value).toBe('first-value-123'); // within the bound
    t += 1;
    expect((await src.fetch([grant])).get(name)?.value).toBe('rotated-value-456');
    await redis.del(keys.credential('default', name));
    t += 2000;
    expect((await src.fetch([grant])).has(name)).toBe(false);
    // registered again under the same name: a new generation the old grant does not reach
    await redis.hset(keys.credential('default', name), {
      name,
      generation: 'gen-2',
      value: 'new-owner-value',
    });
    t += 2000;
    expect((await src.fetch([grant])).has(name)).toBe(false);
    expect((await src.fetch([{ ...grant, generation: 'gen-2' }])).get(name)?.value).toBe('new-owner-value');
  });

  it('throws when the store cannot be read (the caller refuses; nothing stale is used)', async () => {
    const down = new Redis('redis://127.0.0.1:1', {
      lazyConnect: true,
      enableOfflineQueue: false,
      maxRetriesPerRequest: 0,
      retryStrategy: () => null,
    });
    const src = redisCredentialSource(down, { ttlMs: 2000 });
    await expect(src.fetch([grant])).rejects.toThrow();
    down.disconnect();
  });
});
