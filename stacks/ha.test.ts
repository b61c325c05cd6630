/**
 * No single point of failure (issue 44), what each stack renders under the mock runtime: Redis
 * with Sentinel in `kubernetes` mode by default (LKE, CKS), `space:redis` single mode and an
 * external Redis kept, and the settings preview refuses because they cannot fail over.
 */
import { describe, expect, it } from 'vitest';
import { type RecordedResource, unwrapSecrets } from '../providers/testing/mocks.ts';
import { parseRedisUrl } from '../runtime/core/redis-connection.ts';
import { fails, render, SECRETS, VARIANTS, withSecrets } from './test-stacks.ts';

type Obj = Record<string, unknown>;
const k8sNamed = (recorded: RecordedResource[], type: string, name: string) =>
  recorded
    .filter((r) => r.type === type)
    .map((r) => unwrapSecrets(r.inputs) as Obj)
    .find((o) => (o['metadata'] as Obj)['name'] === name);
const redisUrlOf = (recorded: RecordedResource[]) =>
  (k8sNamed(recorded, 'kubernetes:core/v1:Secret', 'space-redis')!['stringData'] as Obj)['url'] as string;
const replicasOf = (recorded: RecordedResource[], name: string) =>
  (k8sNamed(recorded, 'kubernetes:apps/v1:StatefulSet', name)?.['spec'] as Obj | undefined)?.['replicas'];

/** The API container's env (name → value) of the `space-api` Deployment. */
const apiEnvOf = (recorded: RecordedResource[]): Record<string, string | undefined> => {
  const spec = (k8sNamed(recorded, 'kubernetes:apps/v1:Deployment', 'space-api')!['spec'] as Obj)[
    'template'
  ] as { spec: { containers: { env: { name: string; value?: string }[] }[] } };
  return Object.fromEntries(spec.spec.containers[0]!.env.map((e) => [e.name, e.value]));
};

// renders take seconds each on a loaded host: not a speed goal, so no 5 s limit
describe.each(['akamai-lke', 'coreweave'])(
  'stack %s: Redis with Sentinel by default',
  { timeout: 60_000 },
  (name) => {
    it('three servers, three sentinels, and the sentinel URL in the Secret every service reads', async () => {
      const recorded = await render(withSecrets(VARIANTS[name]!));
      expect(replicasOf(recorded, 'space-redis')).toBe(3);
      expect(replicasOf(recorded, 'space-redis-sentinel')).toBe(3);
      const url = redisUrlOf(recorded);
      expect(url).toBe(
        `redis-sentinel://:${SECRETS.redisPassword}@space-redis-sentinel.space.svc:26379/space`,
      );
      expect(parseRedisUrl(url)).toMatchObject({ kind: 'sentinel', primaryName: 'space' });
      // with replicas, the API waits for one before a client is told of a write
      expect(apiEnvOf(recorded)['SPACE_REDIS_WAIT_REPLICAS']).toBe('1');
    });

    it('space:redis chooses: 5 servers and 5 sentinels, or one Redis (single mode)', async () => {
      const five = await render(
        withSecrets({
          ...VARIANTS[name]!,
          redis: JSON.stringify({ mode: 'sentinel', servers: 5, sentinels: 5 }),
        }),
      );
      expect(replicasOf(five, 'space-redis')).toBe(5);
      expect(replicasOf(five, 'space-redis-sentinel')).toBe(5);
      const single = await render(
        withSecrets({ ...VARIANTS[name]!, redis: JSON.stringify({ mode: 'single' }) }),
      );
      expect(replicasOf(single, 'space-redis')).toBe(1);
      expect(replicasOf(single, 'space-redis-sentinel')).toBeUndefined();
      expect(redisUrlOf(single)).toBe(`redis://:${SECRETS.redisPassword}@space-redis.space.svc:6379`);
      expect(apiEnvOf(single)['SPACE_REDIS_WAIT_REPLICAS']).toBeUndefined();
    });

    it('an external Redis (a sentinel URL of your own too) deploys none', async () => {
      const url =
        'redis-sentinel://:operator-pw-0123456789@10.1.0.5:26379,10.1.0.6:26379,10.1.0.7:26379/prod';
      const raw = { ...withSecrets(VARIANTS[name]!), redisPassword: undefined, redisUrl: url };
      const recorded = await render(raw);
      expect(replicasOf(recorded, 'space-redis')).toBeUndefined();
      expect(replicasOf(recorded, 'space-redis-sentinel')).toBeUndefined();
      expect(redisUrlOf(recorded)).toBe(url);
    });
  },
);

describe('kind: one Redis by default (one machine: a failover would gain nothing)', {
  timeout: 60_000,
}, () => {
  it('renders the single Redis', async () => {
    const recorded = await render(withSecrets(VARIANTS['kind']!));
    expect(replicasOf(recorded, 'space-redis')).toBe(1);
    expect(replicasOf(recorded, 'space-redis-sentinel')).toBeUndefined();
  });
});

describe('refused at preview: settings that cannot fail over', () => {
  const lke = withSecrets(VARIANTS['akamai-lke']!);
  const redis = (v: unknown) => ({ ...lke, redis: JSON.stringify(v) });

  it.each([1, 2, 4, 6, 9])('%i sentinels', (n) => {
    expect(fails(redis({ mode: 'sentinel', sentinels: n }))).toEqual([
      expect.stringMatching(
        new RegExp(`^space:redis\\.sentinels: 3, 5 or 7 \\(got ${n}\\): a failover needs a majority`),
      ),
    ]);
  });

  it.each([1, 8, 2.5])('%s data servers', (n) => {
    expect(fails(redis({ mode: 'sentinel', servers: n }))).toEqual([
      expect.stringMatching(/^space:redis\.servers: an integer from 2 to 7/),
    ]);
  });

  it('an unknown mode or field, counts in single mode, the key beside space:redisUrl', () => {
    expect(fails(redis({ mode: 'cluster' }))).toEqual([
      'space:redis.mode: "sentinel" or "single" (got "cluster")',
    ]);
    expect(fails(redis({ mode: 'sentinel', replicas: 3 }))).toEqual([
      'space:redis: unknown field "replicas" (mode, servers, sentinels)',
    ]);
    expect(fails(redis({ mode: 'single', sentinels: 3 }))).toEqual([
      'space:redis.sentinels: only with mode "sentinel"',
    ]);
    expect(
      fails({
        ...lke,
        redisPassword: undefined,
        redisUrl: 'redis://r:6379',
        redis: JSON.stringify({ mode: 'single' }),
      }),
    ).toEqual(['space:redis: not with space:redisUrl (an external Redis: nothing is deployed)']);
  });

  it('a Sentinel password that would not survive sentinel.conf and the URL (single mode keeps the old rule)', () => {
    const pw = 'has spaces and @ signs 123';
    expect(fails({ ...lke, redisPassword: pw })).toEqual([
      expect.stringMatching(
        /^space:redisPassword: with Redis Sentinel \(space:redis, the default here\) 16-128 characters/,
      ),
    ]);
    expect(fails({ ...lke, redisPassword: pw, redis: JSON.stringify({ mode: 'single' }) })).toEqual([]);
  });

  it('a space:redisUrl no service could parse', () => {
    expect(fails({ ...lke, redisPassword: undefined, redisUrl: 'redis-sentinel://:pw@h1:26379' })).toEqual([
      expect.stringMatching(
        /^space:redisUrl: Sentinel URL needs the primary name.*\(redis-sentinel:\/\/:\*\*\*@h1:26379\)$/,
      ),
    ]);
    expect(fails({ ...lke, redisPassword: undefined, redisUrl: 'http://r:6379' })).toEqual([
      expect.stringMatching(/^space:redisUrl: Redis URL must start with redis:\/\//),
    ]);
  });

  it('space:redis in vm mode (space:controlPlane decides there)', () => {
    expect(fails({ ...VARIANTS['akamai']!, redis: JSON.stringify({ mode: 'single' }) })).toEqual([
      expect.stringMatching(/^space:redis: kubernetes mode only/),
    ]);
  });
});
