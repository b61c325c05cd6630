/** resolveGrants against a real Redis: current fields, and the grants a dispatch or a recovery skips. */
import { Redis } from 'ioredis';
import { afterAll, beforeEach, describe, expect, inject, it } from 'vitest';
import { resolveGrants } from './credential-grants.ts';
import { keys } from './redis-keys.ts';
import { DEFAULT_TEAM } from './tenancy.ts';

const redis = new Redis(inject('redisUrl'), { db: 10 });
afterAll(() => redis.disconnect());
beforeEach(async () => {
  await redis.flushdb();
});

const credential = (team: string, name: string, generation: string) =>
  redis.hset(keys.credential(team, name), {
    name,
    generation,
    domains: JSON.stringify([`${name}.example.com`]),
    header: 'X-Key',
    format: '{value}',
    value: 'secret-value',
  });

describe('resolveGrants', () => {
  it("gives each grant its credential's current fields; skips deleted and rotated ones; never a value", async () => {
    await credential(DEFAULT_TEAM, 'kept', 'g1');
    await credential(DEFAULT_TEAM, 'rotated', 'g2');
    await credential('tb', 'other', 'g1');
    const got = await resolveGrants(redis, [
      { name: 'kept', placeholder: 'ph1', generation: 'g1' },
      { name: 'rotated', placeholder: 'ph2', generation: 'g1' },
      { name: 'deleted', placeholder: 'ph3' },
      { name: 'other', placeholder: 'ph4', team: 'tb' },
    ]);
    expect(got).toEqual([
      {
        name: 'kept',
        placeholder: 'ph1',
        domains: ['kept.example.com'],
        header: 'x-key',
        format: '{value}',
        generation: 'g1',
      },
      {
        name: 'other',
        placeholder: 'ph4',
        domains: ['other.example.com'],
        header: 'x-key',
        format: '{value}',
        generation: 'g1',
        team: 'tb',
      },
    ]);
    expect(JSON.stringify(got)).not.toContain('secret-value');
  });
});
