/**
 * Fixtures of the Kubernetes renderer's tests: keys, a CA, two pools (one VMM, one gVisor), the
 * runtime arguments, and accessors over the rendered objects.
 */
import { generateKeyPairSync } from 'node:crypto';
import * as pulumi from '@pulumi/pulumi';
import { generateCaPem } from '../../runtime/gateway/ca.ts';
import type { NodePool } from '../node-pool.ts';
import { type RuntimeArgs, renderRuntimeObjects } from './runtime.ts';

const keys = generateKeyPairSync('ed25519');
export const SIGNING = keys.privateKey.export({ type: 'pkcs8', format: 'pem' }).toString();
export const VERIFY = keys.publicKey.export({ type: 'spki', format: 'pem' }).toString();
export const REDIS_PASSWORD = 'redis-password-that-must-stay-secret';
export const CA = await generateCaPem();

export const pools: NodePool[] = [
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

export const args = (over: Partial<RuntimeArgs> = {}): RuntimeArgs => ({
  version: '1.2.3',
  nodePools: pools,
  signingKey: pulumi.secret(SIGNING),
  verifyKey: VERIFY,
  redis: { mode: 'in-cluster', password: pulumi.secret(REDIS_PASSWORD) },
  nodeCidrs: ['10.0.0.0/16'],
  gatewayEnabled: true,
  gatewayCa: { certificate: CA.certPem, key: pulumi.secret(CA.keyPem) },
  ...over,
});

export type Obj = Record<string, unknown>;
// small typed accessors over rendered data
export const spec = (o: Obj) => o['spec'] as Obj;
export const podSpec = (o: Obj) => (spec(o)['template'] as Obj)['spec'] as Obj;
export const containers = (o: Obj) => podSpec(o)['containers'] as Obj[];
export const runtimeArgs = (over: Partial<RuntimeArgs> = {}) => args(over);
export const names = (xs: Obj[] | undefined) => (xs ?? []).map((x) => x['name']);

/**
 * The rendered objects of `a` with the accessors the policy tests read them through: by kind, the
 * workloads, the agents and gateways, a container's env and mounts, a workload's volumes, and the
 * gateway on an agent's nodes.
 */
export function rendered(a: RuntimeArgs = args()) {
  const objs = renderRuntimeObjects(a).map((r) => r.object as Obj);
  const byKind = (kind: string) => objs.filter((o) => o['kind'] === kind);
  const workloads = objs.filter((o) =>
    ['Deployment', 'DaemonSet', 'StatefulSet'].includes(o['kind'] as string),
  );
  const component = (o: Obj) =>
    ((o['metadata'] as Obj)['labels'] as Record<string, string>)['app.kubernetes.io/component'];
  const agents = byKind('DaemonSet').filter((o) => component(o) === 'agent');
  const gateways = byKind('DaemonSet').filter((o) => component(o) === 'gateway');
  const envOf = (c: Obj) => Object.fromEntries((c['env'] as Obj[]).map((e) => [e['name'], e['value']]));
  const mounts = (c: Obj) => (c['volumeMounts'] as Obj[] | undefined) ?? [];
  const volumes = (w: Obj) => (podSpec(w)['volumes'] as Obj[] | undefined) ?? [];
  const container = (w: Obj, name: string) => containers(w).find((c) => c['name'] === name)!;
  const gatewayOf = (agent: Obj) =>
    gateways.find(
      (g) => JSON.stringify(podSpec(g)['nodeSelector']) === JSON.stringify(podSpec(agent)['nodeSelector']),
    );
  return {
    objs,
    byKind,
    workloads,
    component,
    agents,
    gateways,
    envOf,
    mounts,
    volumes,
    container,
    gatewayOf,
  };
}
