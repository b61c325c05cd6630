import { generateKeyPairSync } from 'node:crypto';
import * as pulumi from '@pulumi/pulumi';
import { beforeAll, describe, expect, it } from 'vitest';
import type { NodePool } from '../node-pool.ts';
import { schemaProblems } from '../testing/k8s-schema.ts';
import {
  installMocks,
  isWireSecret,
  plaintextOccurrences,
  type RecordedResource,
  settle,
  unwrapSecrets,
} from '../testing/mocks.ts';
import { type RuntimeArgs, renderRuntimeObjects } from './runtime.ts';

const keys = generateKeyPairSync('ed25519');
const SIGNING = keys.privateKey.export({ type: 'pkcs8', format: 'pem' }).toString();
const VERIFY = keys.publicKey.export({ type: 'spki', format: 'pem' }).toString();
const REDIS_PASSWORD = 'redis-password-that-must-stay-secret';

const pools: NodePool[] = [
  {
    name: 'vmm',
    driver: 'firecracker',
    instanceType: 'cd-hp-a96-genoa',
    count: 2,
    labels: {},
    allowUnverifiedKvm: false,
  },
  {
    name: 'gv',
    driver: 'gvisor',
    instanceType: 'cd-hp-a96-genoa',
    count: 1,
    labels: {},
    allowUnverifiedKvm: false,
  },
];

const args = (over: Partial<RuntimeArgs> = {}): RuntimeArgs => ({
  version: '1.2.3',
  nodePools: pools,
  signingKey: pulumi.secret(SIGNING),
  verifyKey: VERIFY,
  redis: { mode: 'in-cluster', password: pulumi.secret(REDIS_PASSWORD) },
  nodeCidrs: ['10.0.0.0/16'],
  gatewayEnabled: true,
  ...over,
});

type Obj = Record<string, unknown>;
// small typed accessors over rendered data
const spec = (o: Obj) => o['spec'] as Obj;
const podSpec = (o: Obj) => (spec(o)['template'] as Obj)['spec'] as Obj;
const containers = (o: Obj) => podSpec(o)['containers'] as Obj[];
const names = (xs: Obj[] | undefined) => (xs ?? []).map((x) => x['name']);

describe('space:kubernetes:Runtime under the mock runtime', () => {
  let recorded: RecordedResource[];
  let k8sObjects: Obj[];

  beforeAll(async () => {
    recorded = await installMocks();
    const { Runtime } = await import('./runtime.ts');
    new Runtime('space', args());
    await settle(recorded);
    k8sObjects = recorded
      .filter((r) => r.type.startsWith('kubernetes:'))
      .map((r) => unwrapSecrets(r.inputs) as Obj);
  });

  it('registers the component and every rendered object as a child resource', () => {
    expect(recorded.some((r) => r.type === 'space:kubernetes:Runtime')).toBe(true);
    expect(k8sObjects.length).toBe(renderRuntimeObjects(args()).length);
    expect(
      recorded.filter((r) => r.type.startsWith('kubernetes:')).every((r) => r.name.startsWith('space-')),
    ).toBe(true);
  });

  it('every rendered object is valid against the Kubernetes schemas', () => {
    const problems = k8sObjects.flatMap(schemaProblems);
    expect(problems).toEqual([]);
  });

  it('the schema check catches a wrong type (control)', () => {
    const bad = structuredClone(k8sObjects.find((o) => o['kind'] === 'Deployment')!);
    (containers(bad)[0]!['ports'] as Obj[])[0]!['containerPort'] = 'eighty';
    expect(schemaProblems(bad).length).toBe(1);
  });

  it('no secret value appears outside a Pulumi secret in any resource input', () => {
    for (const needle of [REDIS_PASSWORD, SIGNING.split('\n')[1]!]) {
      const leaks = recorded.flatMap((r) =>
        plaintextOccurrences(r.inputs, needle).map((p) => `${r.name}: ${p}`),
      );
      expect(leaks).toEqual([]);
    }
    // control: the values did reach the Secrets, wrapped as secrets
    const redisSecret = recorded.find((r) => r.name === 'space-redis-secret')!;
    expect(isWireSecret(redisSecret.inputs['stringData'])).toBe(true);
    expect(JSON.stringify(unwrapSecrets(redisSecret.inputs))).toContain(REDIS_PASSWORD);
    expect(plaintextOccurrences({ a: [`x${REDIS_PASSWORD}`] }, REDIS_PASSWORD)).toEqual(['a[0]']);
  });
});

describe('renderRuntimeObjects policies', () => {
  const objs = renderRuntimeObjects(args()).map((r) => r.object as Obj);
  const byKind = (kind: string) => objs.filter((o) => o['kind'] === kind);
  const workloads = objs.filter((o) =>
    ['Deployment', 'DaemonSet', 'StatefulSet'].includes(o['kind'] as string),
  );
  const agents = byKind('DaemonSet').filter((o) => (o['metadata'] as Obj)['name'] !== 'space-gateway');

  it('/dev/kvm is mounted only into agents of VMM-driver pools', () => {
    const withKvm = workloads.filter((w) =>
      ((podSpec(w)['volumes'] as Obj[] | undefined) ?? []).some(
        (v) => (v['hostPath'] as Obj | undefined)?.['path'] === '/dev/kvm',
      ),
    );
    expect(withKvm.map((w) => (w['metadata'] as Obj)['name'])).toEqual(['space-agent-vmm']);
  });

  it('only agents are privileged, and every agent gets /dev/net/tun and host state paths', () => {
    const privileged = workloads.filter((w) =>
      containers(w).some((c) => (c['securityContext'] as Obj | undefined)?.['privileged'] === true),
    );
    expect(privileged).toEqual(agents);
    for (const a of agents) {
      const paths = (podSpec(a)['volumes'] as Obj[]).map((v) => (v['hostPath'] as Obj | undefined)?.['path']);
      expect(paths).toEqual(expect.arrayContaining(['/dev/net/tun', '/var/lib/space', '/var/run/netns']));
    }
  });

  it('every container has cpu/memory requests and a memory limit', () => {
    for (const w of workloads)
      for (const c of containers(w)) {
        const r = c['resources'] as { requests: Obj; limits: Obj };
        expect(r.requests['cpu'], `${c['name']}`).toBeDefined();
        expect(r.requests['memory'], `${c['name']}`).toBeDefined();
        expect(r.limits['memory'], `${c['name']}`).toBeDefined();
      }
  });

  it('no pod mounts a service-account token', () => {
    for (const w of workloads) expect(podSpec(w)['automountServiceAccountToken']).toBe(false);
  });

  it('the signing key is mounted only into the API; agents get only the public key', () => {
    const mountsSigning = workloads.filter((w) =>
      ((podSpec(w)['volumes'] as Obj[] | undefined) ?? []).some(
        (v) => (v['secret'] as Obj | undefined)?.['secretName'] === 'space-signing-key',
      ),
    );
    expect(mountsSigning.map((w) => (w['metadata'] as Obj)['name'])).toEqual(['space-api']);
  });

  it('Redis is not exposed outside the cluster and admits only the API and agent nodes', () => {
    const redisSvc = byKind('Service').find((s) => (s['metadata'] as Obj)['name'] === 'space-redis')!;
    expect(spec(redisSvc)['type']).toBe('ClusterIP');
    for (const w of workloads)
      for (const c of containers(w))
        for (const p of (c['ports'] as Obj[] | undefined) ?? [])
          if (p['containerPort'] === 6379) expect(p['hostPort']).toBeUndefined();
    const pol = byKind('NetworkPolicy').find(
      (p) => (p['metadata'] as Obj)['name'] === 'space-redis-ingress',
    )!;
    const from = ((spec(pol)['ingress'] as Obj[])[0]!['from'] as Obj[]).map(
      (f) => f['podSelector'] ?? f['ipBlock'],
    );
    expect(from).toEqual([
      { matchLabels: expect.objectContaining({ 'app.kubernetes.io/component': 'api' }) },
      { cidr: '10.0.0.0/16' },
    ]);
    const deny = byKind('NetworkPolicy').find(
      (p) => (p['metadata'] as Obj)['name'] === 'space-default-deny-ingress',
    )!;
    expect(spec(deny)).toEqual({ podSelector: {}, policyTypes: ['Ingress'] });
  });

  it('agents roll one node at a time with a grace period covering the drain budget', () => {
    for (const a of agents) {
      expect(spec(a)['updateStrategy']).toEqual({
        type: 'RollingUpdate',
        rollingUpdate: { maxUnavailable: 1, maxSurge: 0 },
      });
      expect(podSpec(a)['terminationGracePeriodSeconds']).toBeGreaterThanOrEqual(120);
      const envs = Object.fromEntries(
        (containers(a)[0]!['env'] as Obj[]).map((e) => [e['name'], e['value']]),
      );
      expect(envs['SPACE_AGENT_ON_SHUTDOWN']).toBe('keep');
    }
    expect(podSpec(agents[0]!)['terminationGracePeriodSeconds']).toBe(150);
  });

  it('each agent DaemonSet selects its pool and sets its driver', () => {
    for (const pool of pools) {
      const a = agents.find((x) => (x['metadata'] as Obj)['name'] === `space-agent-${pool.name}`)!;
      expect(podSpec(a)['nodeSelector']).toEqual({ 'space.dev/pool': pool.name });
      const envs = Object.fromEntries(
        (containers(a)[0]!['env'] as Obj[]).map((e) => [e['name'], e['value']]),
      );
      expect(envs['SPACE_DRIVER']).toBe(pool.driver);
    }
  });

  it('the API has probes on /readyz and /healthz, an HPA and a PDB', () => {
    const api = byKind('Deployment')[0]!;
    const c = containers(api)[0]!;
    expect(((c['readinessProbe'] as Obj)['httpGet'] as Obj)['path']).toBe('/readyz');
    expect(((c['livenessProbe'] as Obj)['httpGet'] as Obj)['path']).toBe('/healthz');
    expect(byKind('HorizontalPodAutoscaler')).toHaveLength(1);
    expect(spec(byKind('PodDisruptionBudget')[0]!)['minAvailable']).toBe(1);
  });

  it('the gateway DaemonSet exists only when enabled', () => {
    const off = renderRuntimeObjects(args({ gatewayEnabled: false })).map((r) => r.object as Obj);
    expect(off.some((o) => (o['metadata'] as Obj)['name'] === 'space-gateway')).toBe(false);
    expect(objs.some((o) => (o['metadata'] as Obj)['name'] === 'space-gateway')).toBe(true);
  });

  it('with an external Redis no Redis workload, Service or password is rendered', () => {
    const ext = renderRuntimeObjects(
      args({ redis: { mode: 'external', url: pulumi.secret('redis://x:6379') } }),
    );
    expect(ext.map((r) => r.role)).not.toContain('redis');
    expect(ext.map((r) => r.role)).not.toContain('redis-svc');
  });

  it('every image is the one repository at the one version', () => {
    const images = workloads
      .filter((w) => (w['metadata'] as Obj)['name'] !== 'space-redis')
      .flatMap((w) => containers(w).map((c) => c['image']));
    expect(new Set(images)).toEqual(new Set(['ghcr.io/space-sandbox/space:1.2.3']));
    expect(names(containers(byKind('Deployment')[0]!))).toEqual(['api']);
  });
});
