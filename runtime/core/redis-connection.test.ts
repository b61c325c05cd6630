import { describe, expect, it } from 'vitest';
import { apiSettings } from '../api/config.ts';
import { loadConfig } from './config.ts';
import { parseRedisUrl, redactRedisUrl, redisConnection } from './redis-connection.ts';

describe('parseRedisUrl', () => {
  it('keeps one-server URLs and socket paths as they are', () => {
    expect(parseRedisUrl('redis://10.0.0.5:6379/2')).toEqual({
      kind: 'direct',
      url: 'redis://10.0.0.5:6379/2',
    });
    expect(parseRedisUrl('rediss://:pw@h:6380')).toEqual({ kind: 'direct', url: 'rediss://:pw@h:6380' });
    expect(parseRedisUrl('/run/space/redis.sock')).toEqual({ kind: 'socket', path: '/run/space/redis.sock' });
  });

  it('reads sentinels, the primary name, credentials and the database', () => {
    expect(
      parseRedisUrl('redis-sentinel://:s%40cret@10.0.0.2:26379,10.0.0.3,[fd00::4]:26380/space/3'),
    ).toEqual({
      kind: 'sentinel',
      sentinels: [
        { host: '10.0.0.2', port: 26379 },
        { host: '10.0.0.3', port: 26379 },
        { host: 'fd00::4', port: 26380 },
      ],
      primaryName: 'space',
      password: 's@cret',
      db: 3,
    });
    const e = parseRedisUrl('redis-sentinel://app:pw@h1:1,h2:2/p?sentinelPassword=');
    expect(e).toMatchObject({ username: 'app', password: 'pw', sentinelPassword: null, db: 0 });
    expect(parseRedisUrl('redis-sentinel://h1/p?sentinelPassword=x')).toMatchObject({
      sentinelPassword: 'x',
    });
  });

  it.each([
    ['redis-sentinel://h1:26379', /primary name/],
    ['redis-sentinel://h1:26379/', /primary name/],
    ['redis-sentinel://h1:99999/p', /port out of range/],
    ['redis-sentinel://h1:x/p', /bad sentinel address/],
    ['redis-sentinel:///p', /bad sentinel address|names no sentinel/],
    ['redis-sentinel://h1/p/notadb', /path must be/],
    ['http://h1:6379', /must start with/],
    ['not a url', /not a Redis URL/],
  ])('refuses %s', (url, message) => {
    expect(() => parseRedisUrl(url)).toThrow(message);
  });

  it('redacts passwords for logs', () => {
    expect(redactRedisUrl('redis-sentinel://:pw@h1,h2/p?sentinelPassword=sp')).toBe(
      'redis-sentinel://:***@h1,h2/p?sentinelPassword=***',
    );
    expect(redactRedisUrl('redis://user:pw@h:1')).toBe('redis://user:***@h:1');
  });
});

describe('redisConnection', () => {
  it('gives a sentinel client the primary name, the sentinels and failover detection', () => {
    const r = redisConnection('redis-sentinel://:pw@h1:1,h2:2/space/1', { lazyConnect: true });
    expect(r.options).toMatchObject({
      name: 'space',
      role: 'master',
      db: 1,
      password: 'pw',
      sentinelPassword: 'pw',
      failoverDetector: true,
      sentinels: [
        { host: 'h1', port: 1 },
        { host: 'h2', port: 2 },
      ],
    });
    // a demoted primary answers READONLY: reconnect (to the new one) and resend
    const onError = r.options.reconnectOnError as (e: Error) => number | boolean;
    expect(onError(new Error("READONLY You can't write against a read only replica."))).toBe(2);
    expect(onError(new Error('ERR unknown command'))).toBe(false);
    r.disconnect();
  });

  it('a socket path connects by path', () => {
    const r = redisConnection('/tmp/x.sock', { lazyConnect: true });
    expect(r.options.path).toBe('/tmp/x.sock');
    r.disconnect();
  });
});

describe('SPACE_REDIS_URL setting', () => {
  const env = { SPACE_SIGNING_KEY_FILE: '/k' };
  it('accepts each form and refuses other schemes at load', () => {
    for (const url of ['redis://h:1', 'rediss://h:1', '/s.sock', 'redis-sentinel://h/p'])
      expect(loadConfig('api', apiSettings, { ...env, SPACE_REDIS_URL: url }).redisUrl).toBe(url);
    expect(() => loadConfig('api', apiSettings, { ...env, SPACE_REDIS_URL: 'http://h:1' })).toThrow(
      /SPACE_REDIS_URL/,
    );
  });
});
