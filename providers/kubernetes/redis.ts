/**
 * Redis on Kubernetes, the state of record: the `space-redis` Secret every service reads its URL
 * from, and in-cluster either Redis with Sentinel failover (redis-sentinel.ts) or one Redis: a
 * StatefulSet with a volume (AOF persistence), its ClusterIP Service and a disruption budget no
 * eviction passes. NetworkPolicies open only the Redis (and Sentinel) ports, which answer nothing
 * before AUTH with the password. With an external Redis only the Secret.
 */
import type * as k8s from '@pulumi/kubernetes';
import * as pulumi from '@pulumi/pulumi';
import { REDIS_PERSISTENCE, REDIS_PORT, SENTINEL_PORT } from '../runtime-settings.ts';
import { labels, type ObjectList, type RenderContext } from './args.ts';
import {
  addSentinelRedis,
  REDIS_PASSWORD_ENV,
  redisDataClaim,
  SENTINEL_COMPONENT,
  sentinelUrl,
} from './redis-sentinel.ts';

/**
 * Adds the Redis Secret and, in-cluster, the Sentinel deployment (with `sentinel`) or the one
 * Redis's StatefulSet, its Service and its PDB.
 */
export function addRedis(list: ObjectList, ctx: RenderContext): void {
  const { a, ns } = ctx;
  const add = list.add.bind(list);
  const redisUrl =
    a.redis.mode === 'external'
      ? a.redis.url
      : a.redis.sentinel
        ? sentinelUrl(ns, a.redis.password)
        : pulumi.interpolate`redis://:${a.redis.password}@space-redis.${ns}.svc:${REDIS_PORT}`;
  const redisSecret: k8s.types.input.core.v1.Secret = {
    apiVersion: 'v1',
    kind: 'Secret',
    metadata: { name: 'space-redis', namespace: ns, labels: labels('redis') },
    type: 'Opaque',
    stringData: {
      url: redisUrl,
      ...(a.redis.mode === 'in-cluster' ? { password: a.redis.password } : {}),
    },
  };
  add('redis-secret', redisSecret);

  if (a.redis.mode === 'in-cluster' && a.redis.sentinel) {
    addSentinelRedis(list, ctx, { ...a.redis, ...a.redis.sentinel });
  } else if (a.redis.mode === 'in-cluster') {
    const sel = labels('redis');
    const sts: k8s.types.input.apps.v1.StatefulSet = {
      apiVersion: 'apps/v1',
      kind: 'StatefulSet',
      metadata: { name: 'space-redis', namespace: ns, labels: sel },
      spec: {
        serviceName: 'space-redis',
        replicas: 1,
        selector: { matchLabels: sel },
        template: {
          metadata: { labels: sel },
          spec: {
            serviceAccountName: 'space-redis',
            automountServiceAccountToken: false,
            securityContext: { runAsNonRoot: true, runAsUser: 999, fsGroup: 999 },
            containers: [
              {
                name: 'redis',
                image: a.redis.image ?? 'redis:7.4-alpine',
                args: [
                  ...REDIS_PERSISTENCE.flatMap(([k, v]) => [`--${k}`, v]),
                  '--requirepass',
                  '$(REDIS_PASSWORD)',
                  '--port',
                  String(REDIS_PORT),
                ],
                env: REDIS_PASSWORD_ENV,
                ports: [{ name: 'redis', containerPort: REDIS_PORT }],
                readinessProbe: { tcpSocket: { port: REDIS_PORT }, periodSeconds: 5 },
                livenessProbe: { tcpSocket: { port: REDIS_PORT }, periodSeconds: 10, failureThreshold: 6 },
                resources: { requests: { cpu: '250m', memory: '512Mi' }, limits: { memory: '2Gi' } },
                securityContext: { allowPrivilegeEscalation: false, capabilities: { drop: ['ALL'] } },
                volumeMounts: [{ name: 'data', mountPath: '/data' }],
              },
            ],
          },
        },
        volumeClaimTemplates: [redisDataClaim(a.redis)],
      },
    };
    add('redis', sts);
    const svc: k8s.types.input.core.v1.Service = {
      apiVersion: 'v1',
      kind: 'Service',
      metadata: { name: 'space-redis', namespace: ns, labels: sel },
      spec: {
        type: 'ClusterIP',
        selector: sel,
        ports: [{ name: 'redis', port: REDIS_PORT, targetPort: REDIS_PORT }],
      },
    };
    add('redis-svc', svc);
    // one Redis (no replica to fail over to; docs/deployment.md "Redis"): a voluntary eviction
    // (node drain, cluster upgrade) must not take it down behind the operator's back. A drain then
    // waits until the operator moves it deliberately (backup, then delete the pod).
    const redisPdb: k8s.types.input.policy.v1.PodDisruptionBudget = {
      apiVersion: 'policy/v1',
      kind: 'PodDisruptionBudget',
      metadata: { name: 'space-redis', namespace: ns, labels: sel },
      spec: { maxUnavailable: 0, selector: { matchLabels: sel } },
    };
    add('redis-pdb', redisPdb);
  }
}

/**
 * Adds the in-cluster Redis's NetworkPolicy (none with an external Redis): TCP 6379 from any
 * source, nothing else. Access is the password's (`--requirepass`, from a Pulumi secret through the
 * `space-redis` Secret; every client's URL carries it), not the source address, because the
 * clients that matter most cannot be matched by address: agents and gateways run on the host
 * network, and what address a host-network pod's packets carry to a pod on another node is the
 * CNI's choice. Under Calico with IP-in-IP (LKE), host-to-remote-pod traffic leaves through the
 * tunnel device and carries its address, one from the pod pool, not the node's (Calico, "Overlay
 * networking", docs.tigera.io/calico/latest/networking/configuring/vxlan-ipip). Cilium, which
 * CoreWeave names as CKS's CNI (docs.coreweave.com/security/tutorials/ebpf-observability), lets an
 * `ipBlock` select nodes only with `policy-cidr-match-mode: nodes` (cilium/cilium PR #28421); by
 * default only its `host`/`remote-node` entities do. Kubernetes leaves NetworkPolicy for
 * host-network pods undefined (kubernetes.io/docs/concepts/services-networking/network-policies/,
 * "NetworkPolicy and hostNetwork pods"). A node-CIDR `ipBlock` thus refused agents on other nodes, while admitting
 * everything else on the nodes (the gateways' own dials included) where it did match.
 */
export function addRedisPolicy(list: ObjectList, ctx: RenderContext): void {
  const { a, ns } = ctx;
  const add = list.add.bind(list);
  if (a.redis.mode === 'in-cluster') {
    const redisIngress: k8s.types.input.networking.v1.NetworkPolicy = {
      apiVersion: 'networking.k8s.io/v1',
      kind: 'NetworkPolicy',
      metadata: { name: 'space-redis-ingress', namespace: ns, labels: labels('policy') },
      spec: {
        podSelector: { matchLabels: labels('redis') },
        policyTypes: ['Ingress'],
        // no `from`: every source, on the Redis port only (see above: the password is the gate)
        ingress: [{ ports: [{ protocol: 'TCP', port: REDIS_PORT }] }],
      },
    };
    add('netpol-redis', redisIngress);
    if (a.redis.sentinel) {
      // the sentinels: their port from any source, for the same reason (every client asks them)
      const sentinelIngress: k8s.types.input.networking.v1.NetworkPolicy = {
        apiVersion: 'networking.k8s.io/v1',
        kind: 'NetworkPolicy',
        metadata: { name: 'space-redis-sentinel-ingress', namespace: ns, labels: labels('policy') },
        spec: {
          podSelector: { matchLabels: labels(SENTINEL_COMPONENT) },
          policyTypes: ['Ingress'],
          ingress: [{ ports: [{ protocol: 'TCP', port: SENTINEL_PORT }] }],
        },
      };
      add('netpol-redis-sentinel', sentinelIngress);
    }
  }
}
