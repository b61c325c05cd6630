import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freePort } from '../../test/redis-server.ts';
import { redisConnection } from '../core/redis-connection.ts';
import { type RedisHa, startRedisHa } from './redis-ha.ts';

// real redis-server and redis-sentinel processes: a kill -9 of the primary is followed by the
// sentinels' promotion of the replica, and a client made from the returned URL follows it
describe('startRedisHa', () => {
  let ha: RedisHa;
  let dir: string;
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'space-redis-ha-'));
    const p = await Promise.all(Array.from({ length: 5 }, () => freePort()));
    ha = await startRedisHa({
      dir,
      password: 'test-pw',
      ports: { data: [p[0]!, p[1]!], sentinels: [p[2]!, p[3]!, p[4]!] },
      downAfterMs: 1000,
      failoverTimeoutMs: 5000,
    });
  }, 60_000);
  afterAll(async () => {
    await ha?.stop();
    await rm(dir, { recursive: true, force: true });
  });

  it('agrees on the first primary, fails over on kill -9 and takes the old primary back as a replica', async () => {
    expect(ha.url).toMatch(
      /^redis-sentinel:\/\/:test-pw@127\.0\.0\.1:\d+,127\.0\.0\.1:\d+,127\.0\.0\.1:\d+\/space$/,
    );
    expect(await ha.agreed()).toBe('redis-0');
    const client = redisConnection(ha.url, { maxRetriesPerRequest: 20 });
    client.on('error', () => {});
    try {
      await client.set('k', 'before');
      expect(await client.wait(1, 2000)).toBe(1);
      await ha.kill('redis-0');
      // the sentinels promote redis-1: every one of them names it and it answers as a primary
      // (bounded at 90 s for a loaded host, where a first failover attempt can time out and
      // Sentinel tries again after the failover timeout; one sentinel names the promoted replica
      // already while its failover is still under way)
      expect(await ha.agreed({ minReplicas: 0, timeoutMs: 90_000 })).toBe('redis-1');
      expect(await ha.primary()).toBe('redis-1');
      // the promoted replica has no replica of its own: min-replicas-to-write refuses writes
      // until the old primary is back (as its replica)
      await expect(client.set('k2', 'early')).rejects.toThrow(/NOREPLICAS/);
      await ha.start('redis-0');
      // it comes back as the new primary's replica at once, not as a second primary that the
      // sentinels would have to demote (or, mid-failover, could choose again)
      const old = ha.servers.find((x) => x.name === 'redis-0')!;
      const direct = redisConnection(`redis://:test-pw@${old.host}:${old.port}`, { maxRetriesPerRequest: 3 });
      try {
        expect(((await direct.call('ROLE')) as string[])[0]).toBe('slave');
      } finally {
        direct.disconnect();
      }
      expect(await ha.agreed()).toBe('redis-1');
      // the client follows the new primary by itself
      let after = '';
      for (let i = 0; i < 40 && after !== 'OK'; i++) {
        after = await client.set('k2', 'after').catch(() => '');
        if (after !== 'OK') await sleep(250);
      }
      expect(after).toBe('OK');
      expect(await client.get('k')).toBe('before');
    } finally {
      client.disconnect();
    }
  }, 180_000);

  it('a Sentinel client that ioredis ends in the middle of a reconnect connects again by itself', async () => {
    const client = redisConnection(ha.url, { maxRetriesPerRequest: 5 });
    client.on('error', () => {});
    let ended = false;
    client.on('end', () => {
      ended = true;
    });
    try {
      expect(await client.ping()).toBe('PONG');
      // the race ioredis's failover detector makes at a +switch-master: the connector is closed
      // while a reconnect is still asking the sentinels for the primary
      const connector = (client as unknown as { connector: { disconnect(): void } }).connector;
      client.once('connecting', () => setImmediate(() => connector.disconnect()));
      client.disconnect(true);
      let pong = '';
      for (let i = 0; i < 40 && pong !== 'PONG'; i++) {
        await sleep(250);
        pong = await client.ping().catch(() => '');
      }
      expect(ended).toBe(true);
      expect(pong).toBe('PONG');
    } finally {
      client.disconnect();
    }
  }, 30_000);
});
