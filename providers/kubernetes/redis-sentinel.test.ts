/**
 * Redis with Sentinel failover on Kubernetes, as rendered: data servers and sentinels spread
 * across nodes with one-at-a-time budgets, the `redis-sentinel://` URL every service gets, the
 * scripts that choose the primary, and the API and router at two spread replicas. Single mode and
 * an external Redis stay as they were.
 */
import * as pulumi from '@pulumi/pulumi';
import { describe, expect, it } from 'vitest';
import { parseRedisUrl } from '../../runtime/core/redis-connection.ts';
import { schemaProblems } from '../testing/k8s-schema.ts';
import { resolved } from '../testing/mocks.ts';
import { sentinelScript, serverScript } from './redis-sentinel.ts';
import { renderRuntimeObjects } from './runtime.ts';
import { args, containers, type Obj, podSpec, REDIS_PASSWORD, rendered, spec } from './test-runtime.ts';

const sentinelArgs = (servers = 3, sentinels = 3) =>
  args({
    redis: { mode: 'in-cluster', password: pulumi.secret(REDIS_PASSWORD), sentinel: { servers, sentinels } },
  });
const nameOf = (o: Obj) => (o['metadata'] as Obj)['name'] as string;
const find = (objs: Obj[], kind: string, name: string) =>
  objs.find((o) => o['kind'] === kind && nameOf(o) === name);

describe('Kubernetes Redis with Sentinel', () => {
  const r = rendered(sentinelArgs());
  const servers = find(r.objs, 'StatefulSet', 'space-redis')!;
  const sentinels = find(r.objs, 'StatefulSet', 'space-redis-sentinel')!;

  it('three data servers and three sentinels, each set spread across nodes by its own labels', () => {
    expect(spec(servers)['replicas']).toBe(3);
    expect(spec(sentinels)['replicas']).toBe(3);
    for (const sts of [servers, sentinels]) {
      const own = (spec(sts)['selector'] as Obj)['matchLabels'];
      const spread = podSpec(sts)['topologySpreadConstraints'] as Obj[];
      expect(spread).toContainEqual({
        maxSkew: 1,
        topologyKey: 'kubernetes.io/hostname',
        whenUnsatisfiable: 'DoNotSchedule',
        nodeTaintsPolicy: 'Honor',
        labelSelector: { matchLabels: own },
      });
    }
    // the two sets select different pods (a server is never counted as a sentinel)
    expect((spec(servers)['selector'] as Obj)['matchLabels']).not.toEqual(
      (spec(sentinels)['selector'] as Obj)['matchLabels'],
    );
    // the servers keep single mode's volume claim (data-space-redis-<i>) and governing Service name
    expect(spec(servers)['serviceName']).toBe('space-redis');
    expect(
      (spec(servers)['volumeClaimTemplates'] as Obj[]).map((v) => (v['metadata'] as Obj)['name']),
    ).toEqual(['data']);
  });

  it('disruption budgets let a node drain: one server and one sentinel at a time, never zero', () => {
    for (const [name, sts] of [
      ['space-redis', servers],
      ['space-redis-sentinel', sentinels],
    ] as const) {
      const pdb = find(r.objs, 'PodDisruptionBudget', name)!;
      expect(spec(pdb)['maxUnavailable']).toBe(1);
      expect((spec(pdb)['selector'] as Obj)['matchLabels']).toEqual(
        (spec(sts)['selector'] as Obj)['matchLabels'],
      );
    }
    // the API and the router too (a budget of minAvailable 1 would block a drain at one replica)
    for (const name of ['space-api', 'space-router'])
      expect(spec(find(r.objs, 'PodDisruptionBudget', name)!)).toMatchObject({ maxUnavailable: 1 });
  });

  it('every service gets SPACE_REDIS_URL=redis-sentinel://…@space-redis-sentinel.<ns>.svc:26379/space from the Secret', async () => {
    const objects = renderRuntimeObjects(sentinelArgs());
    const secret = objects.find((o) => o.role === 'redis-secret')!.object as Obj;
    const url = await resolved((secret['stringData'] as Obj)['url'] as pulumi.Output<string>);
    expect(url).toBe(`redis-sentinel://:${REDIS_PASSWORD}@space-redis-sentinel.space.svc:26379/space`);
    // the form the services parse (runtime/core/redis-connection.ts)
    expect(parseRedisUrl(url)).toMatchObject({
      kind: 'sentinel',
      sentinels: [{ host: 'space-redis-sentinel.space.svc', port: 26379 }],
      primaryName: 'space',
      password: REDIS_PASSWORD,
    });
    const clients = r.workloads.filter((w) =>
      ['api', 'router', 'agent', 'gateway'].includes(r.component(w)!),
    );
    expect(new Set(clients.map((w) => r.component(w)))).toEqual(
      new Set(['api', 'router', 'agent', 'gateway']),
    );
    for (const w of clients) {
      const envs = containers(w).flatMap((c) => (c['env'] as Obj[] | undefined) ?? []);
      expect(envs).toContainEqual({
        name: 'SPACE_REDIS_URL',
        valueFrom: { secretKeyRef: { name: 'space-redis', key: 'url' } },
      });
    }
    // the sentinels' client Service selects the sentinel pods on 26379
    const svc = find(r.objs, 'Service', 'space-redis-sentinel')!;
    expect(spec(svc)['selector']).toEqual((spec(sentinels)['selector'] as Obj)['matchLabels']);
    expect((spec(svc)['ports'] as Obj[])[0]).toMatchObject({ port: 26379, targetPort: 26379 });
    // and a NetworkPolicy opens that port (default deny otherwise)
    const pol = find(r.objs, 'NetworkPolicy', 'space-redis-sentinel-ingress')!;
    expect(spec(pol)['ingress']).toEqual([{ ports: [{ protocol: 'TCP', port: 26379 }] }]);
  });

  it('the sentinels monitor "space" with a majority quorum, the password on both sides, hostnames announced', () => {
    for (const [n, quorum] of [
      [3, 2],
      [5, 3],
      [7, 4],
    ] as const) {
      const s = sentinelScript('space', 3, n);
      expect(s).toContain(`sentinel monitor space $primary 6379 ${quorum}`);
    }
    const s = sentinelScript('ns1', 2, 3);
    for (const line of [
      'sentinel resolve-hostnames yes',
      'sentinel announce-hostnames yes',
      'requirepass $REDIS_PASSWORD',
      'sentinel auth-pass space $REDIS_PASSWORD',
      'sentinel down-after-milliseconds space 5000',
      'sentinel failover-timeout space 30000',
      'sentinel parallel-syncs space 1',
    ])
      expect(s).toContain(line);
    // each of the two data servers is asked, by its stable name in the namespace
    expect(s).toContain('for i in 0 1; do');
    expect(s).toContain('space-redis-$i.space-redis.ns1.svc');
    // the ConfigMap carries what the functions render
    const cm = find(r.objs, 'ConfigMap', 'space-redis-scripts')!;
    expect(cm['data']).toEqual({
      'server.sh': serverScript('space'),
      'sentinel.sh': sentinelScript('space', 3, 3),
    });
  });

  it('a data server asks the sentinels for the primary, else pod 0 leads; persistence and the write guard on each', () => {
    const s = serverScript('space');
    expect(s).toContain('SENTINEL get-master-addr-by-name space');
    expect(s).toContain('primary="space-redis-0.space-redis.space.svc"');
    expect(s).toContain('[ "$primary" = "$self" ] || set -- "$@" --replicaof "$primary" 6379');
    for (const opt of [
      '--appendonly yes',
      '--appendfsync everysec',
      '--min-replicas-to-write 1',
      '--min-replicas-max-lag 10',
      '--masterauth "$REDIS_PASSWORD"',
      '--replica-announce-ip "$self"',
    ])
      expect(s).toContain(opt);
    expect(containers(servers)[0]!['command']).toEqual(['sh', '/scripts/server.sh']);
    // the password only from the Secret, never in the rendered objects
    expect(JSON.stringify(r.objs.filter((o) => o['kind'] !== 'Secret'))).not.toContain(REDIS_PASSWORD);
  });

  it('the API and the router: two replicas (HPA minimum) spread across nodes', () => {
    for (const name of ['space-api', 'space-router']) {
      expect(spec(find(r.objs, 'HorizontalPodAutoscaler', name)!)['minReplicas']).toBe(2);
      const dep = find(r.objs, 'Deployment', name)!;
      expect(podSpec(dep)['topologySpreadConstraints']).toContainEqual(
        expect.objectContaining({
          topologyKey: 'kubernetes.io/hostname',
          whenUnsatisfiable: 'DoNotSchedule',
          labelSelector: { matchLabels: (spec(dep)['selector'] as Obj)['matchLabels'] },
        }),
      );
    }
  });

  it('every object is valid against the Kubernetes schemas (Secrets hold Outputs here: the stacks test checks them resolved)', () => {
    const objs = r.objs.filter((o) => o['kind'] !== 'Secret');
    expect(objs.map((o) => o['kind'])).toContain('StatefulSet');
    expect(objs.flatMap(schemaProblems)).toEqual([]);
  });

  it('single mode and an external Redis are unchanged: one server, no sentinel', () => {
    const single = rendered(args());
    expect(spec(find(single.objs, 'StatefulSet', 'space-redis')!)['replicas']).toBe(1);
    expect(find(single.objs, 'StatefulSet', 'space-redis-sentinel')).toBeUndefined();
    expect(spec(find(single.objs, 'PodDisruptionBudget', 'space-redis')!)['maxUnavailable']).toBe(0);
    const ext = rendered(args({ redis: { mode: 'external', url: 'redis-sentinel://:p@s1:26379,s2/space' } }));
    expect(ext.byKind('StatefulSet')).toEqual([]);
  });
});
