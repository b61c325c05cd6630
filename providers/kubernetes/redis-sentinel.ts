/**
 * Redis with automatic failover on Kubernetes: data servers (one primary, the rest replicas) in
 * the `space-redis` StatefulSet and Redis Sentinel in `space-redis-sentinel`, written here rather
 * than taken from a chart. Why not a chart (Bitnami's `redis` with `sentinel.enabled`, the usual
 * one): nothing here can fetch one, Pulumi's mock runtime renders no Helm chart (a v4 `Chart` is
 * expanded by the provider plugin, a v3 one by the `helm` binary; neither runs in CI here), so
 * none of what it deploys could be checked by the tests; and it would bring its own images and
 * values for what is a few dozen lines of configuration. Both sets run the image of single mode
 * (`redis:7.4-alpine`: `redis-server`, `redis-sentinel`, `redis-cli`, busybox `sh`).
 *
 * Who is primary, decided at each container start by a script (`space-redis-scripts` ConfigMap):
 * the sentinels' answer when any sentinel knows (`SENTINEL get-master-addr-by-name`), else
 * `space-redis-0` (a new deployment, or one whose sentinels were all lost: then pod 0's volume
 * is the one kept). A server that is not the primary starts as its replica. Everyone is known by
 * its stable DNS name (`<pod>.<headless service>.<ns>.svc`; `replica-announce-ip`, sentinels'
 * `announce-hostnames` and `resolve-hostnames`, Redis 6.2+), so a pod rescheduled with a new
 * address is still the same member.
 *
 * Spread: at most one more server, and one more sentinel, on a node than on another
 * ({@link spreadAcrossNodes}); budgets of `maxUnavailable: 1` each, so a drain evicts one server
 * and one sentinel at a time and a majority of sentinels (the quorum) always remains.
 */
import type * as k8s from '@pulumi/kubernetes';
import * as pulumi from '@pulumi/pulumi';
import {
  REDIS_PERSISTENCE,
  REDIS_PORT,
  REDIS_PRIMARY_NAME,
  REDIS_REPLICATION,
  SENTINEL_PORT,
  SENTINEL_TIMING,
  sentinelQuorum,
} from '../runtime-settings.ts';
import { labels, type ObjectList, type RenderContext, spreadAcrossNodes } from './args.ts';

/** The sentinels' StatefulSet, their client Service (`SPACE_REDIS_URL` names it) and pod label. */
export const SENTINEL_NAME = 'space-redis-sentinel';
/** The sentinels' headless Service, which gives each sentinel pod its DNS name. */
export const SENTINEL_HEADLESS = 'space-redis-sentinel-headless';
/** The component label of the sentinel pods (the data servers keep `redis`). */
export const SENTINEL_COMPONENT = 'redis-sentinel';

/** `redis-sentinel://:<password>@space-redis-sentinel.<ns>.svc:26379/space`, what every service gets. */
export function sentinelUrl(ns: string, password: pulumi.Input<string>): pulumi.Output<string> {
  return pulumi.interpolate`redis-sentinel://:${password}@${SENTINEL_NAME}.${ns}.svc:${SENTINEL_PORT}/${REDIS_PRIMARY_NAME}`;
}

/**
 * The start script of a data server: find the primary, then `exec redis-server` as it or as its
 * replica, with the password (env `REDIS_PASSWORD`), persistence and the replication guard.
 * Pure.
 */
export function serverScript(ns: string): string {
  const opts = [...REDIS_PERSISTENCE, ...REDIS_REPLICATION].map(([k, v]) => `--${k} ${v}`).join(' ');
  return [
    '#!/bin/sh',
    '# rendered by providers/kubernetes/redis-sentinel.ts: one Redis data server (primary or replica)',
    'set -eu',
    `self="$HOSTNAME.space-redis.${ns}.svc"`,
    'export REDISCLI_AUTH="$REDIS_PASSWORD"',
    // the sentinels know the primary of a running deployment (this server itself, maybe)
    `primary=$(timeout 5 redis-cli -h ${SENTINEL_NAME} -p ${SENTINEL_PORT} --raw SENTINEL get-master-addr-by-name ${REDIS_PRIMARY_NAME} 2>/dev/null | head -n 1) || primary=""`,
    // none answers: a new deployment (or all sentinels lost): pod 0 is the primary
    `[ -n "$primary" ] || primary="space-redis-0.space-redis.${ns}.svc"`,
    `set -- --port ${REDIS_PORT} --requirepass "$REDIS_PASSWORD" --masterauth "$REDIS_PASSWORD" --replica-announce-ip "$self" ${opts}`,
    `[ "$primary" = "$self" ] || set -- "$@" --replicaof "$primary" ${REDIS_PORT}`,
    'echo "space-redis: $self starts; primary $primary"',
    'exec redis-server "$@"',
    '',
  ].join('\n');
}

/**
 * The start script of a sentinel: find the primary (another sentinel's answer, else the data
 * server whose `ROLE` says master, else `space-redis-0`), wait until it answers (up to a minute:
 * a sentinel must start even while the primary is down, or no failover could happen), write
 * `sentinel.conf` (in an `emptyDir`: Sentinel rewrites it) and `exec redis-sentinel`. Pure.
 */
export function sentinelScript(ns: string, servers: number, sentinels: number): string {
  const server = (i: number | string) => `space-redis-${i}.space-redis.${ns}.svc`;
  const t = SENTINEL_TIMING;
  const n = REDIS_PRIMARY_NAME;
  return [
    '#!/bin/sh',
    '# rendered by providers/kubernetes/redis-sentinel.ts: one Redis Sentinel',
    'set -eu',
    `self="$HOSTNAME.${SENTINEL_HEADLESS}.${ns}.svc"`,
    'export REDISCLI_AUTH="$REDIS_PASSWORD"',
    'find_primary() {',
    `  p=$(timeout 5 redis-cli -h ${SENTINEL_NAME} -p ${SENTINEL_PORT} --raw SENTINEL get-master-addr-by-name ${n} 2>/dev/null | head -n 1) || p=""`,
    '  if [ -z "$p" ]; then',
    `    for i in ${Array.from({ length: servers }, (_, i) => i).join(' ')}; do`,
    `      if timeout 5 redis-cli -h ${server('$i')} -p ${REDIS_PORT} --raw ROLE 2>/dev/null | head -n 1 | grep -qx master; then p=${server('$i')}; break; fi`,
    '    done',
    '  fi',
    `  echo "\${p:-${server(0)}}"`,
    '}',
    'tries=0',
    'while :; do',
    '  primary=$(find_primary)',
    `  if timeout 5 redis-cli -h "$primary" -p ${REDIS_PORT} PING 2>/dev/null | grep -q PONG; then break; fi`,
    '  tries=$((tries + 1))',
    '  [ "$tries" -lt 30 ] || break',
    '  sleep 2',
    'done',
    'umask 077',
    'cat > /data/sentinel.conf <<EOF',
    `port ${SENTINEL_PORT}`,
    'sentinel resolve-hostnames yes',
    'sentinel announce-hostnames yes',
    'sentinel announce-ip $self',
    'requirepass $REDIS_PASSWORD',
    `sentinel monitor ${n} $primary ${REDIS_PORT} ${sentinelQuorum(sentinels)}`,
    `sentinel auth-pass ${n} $REDIS_PASSWORD`,
    `sentinel down-after-milliseconds ${n} ${t.downAfterMs}`,
    `sentinel failover-timeout ${n} ${t.failoverTimeoutMs}`,
    `sentinel parallel-syncs ${n} ${t.parallelSyncs}`,
    'EOF',
    'echo "space-redis-sentinel: $self monitors $primary"',
    'exec redis-sentinel /data/sentinel.conf',
    '',
  ].join('\n');
}

/** The Redis password from the `space-redis` Secret, as `REDIS_PASSWORD` (every Redis container's). */
export const REDIS_PASSWORD_ENV: k8s.types.input.core.v1.EnvVar[] = [
  { name: 'REDIS_PASSWORD', valueFrom: { secretKeyRef: { name: 'space-redis', key: 'password' } } },
];

/** The `data` volume claim of a Redis data server: size GiB (default 10), access mode, storage class. */
export function redisDataClaim(r: {
  readonly storageGiB?: number;
  readonly storageClassName?: string;
  readonly accessMode?: 'ReadWriteOnce' | 'ReadWriteMany';
}): k8s.types.input.core.v1.PersistentVolumeClaim {
  return {
    metadata: { name: 'data' },
    spec: {
      accessModes: [r.accessMode ?? 'ReadWriteOnce'],
      ...(r.storageClassName ? { storageClassName: r.storageClassName } : {}),
      resources: { requests: { storage: `${r.storageGiB ?? 10}Gi` } },
    },
  };
}

/** An exec probe: `redis-cli -p <port> PING` answers PONG (with the password). */
const pingProbe = (
  port: number,
  period: number,
  failureThreshold?: number,
): k8s.types.input.core.v1.Probe => ({
  exec: {
    command: ['sh', '-c', `REDISCLI_AUTH="$REDIS_PASSWORD" redis-cli -p ${port} PING | grep -q PONG`],
  },
  periodSeconds: period,
  timeoutSeconds: 3,
  ...(failureThreshold ? { failureThreshold } : {}),
});

/**
 * Adds the Sentinel deployment (for {@link RedisArgs} `in-cluster` with `sentinel`): the scripts'
 * ConfigMap, the data servers' StatefulSet behind the headless `space-redis`, the sentinels'
 * StatefulSet behind `space-redis-sentinel` (clients) and its headless twin, and a budget of one
 * pod at a time for each set. The `space-redis` Secret (url, password) is the caller's.
 */
export function addSentinelRedis(
  list: ObjectList,
  ctx: RenderContext,
  r: { readonly servers: number; readonly sentinels: number; readonly image?: string } & {
    readonly storageGiB?: number;
    readonly storageClassName?: string;
    readonly accessMode?: 'ReadWriteOnce' | 'ReadWriteMany';
  },
): void {
  const { ns } = ctx;
  const add = list.add.bind(list);
  const image = r.image ?? 'redis:7.4-alpine';
  const passwordEnv = REDIS_PASSWORD_ENV;
  const scripts: k8s.types.input.core.v1.ConfigMap = {
    apiVersion: 'v1',
    kind: 'ConfigMap',
    metadata: { name: 'space-redis-scripts', namespace: ns, labels: labels('redis') },
    data: { 'server.sh': serverScript(ns), 'sentinel.sh': sentinelScript(ns, r.servers, r.sentinels) },
  };
  add('redis-scripts', scripts);
  const podSecurity = { runAsNonRoot: true, runAsUser: 999, runAsGroup: 999, fsGroup: 999 };
  const containerSecurity = { allowPrivilegeEscalation: false, capabilities: { drop: ['ALL'] } };
  const scriptsVolume = { name: 'scripts', configMap: { name: 'space-redis-scripts', defaultMode: 0o555 } };
  /**
   * The pod template both sets share: the image runs `/scripts/<script>` as `container` with the
   * password, serves `port` (probed with PING), and keeps its state in volume `dataVolume` at
   * `/data`; spread across nodes.
   */
  const pod = (o: {
    sel: Record<string, string>;
    container: string;
    script: string;
    port: number;
    resources: k8s.types.input.core.v1.ResourceRequirements;
    dataVolume: string;
    volumes: k8s.types.input.core.v1.Volume[];
  }): k8s.types.input.core.v1.PodTemplateSpec => ({
    metadata: { labels: o.sel },
    spec: {
      serviceAccountName: 'space-redis',
      automountServiceAccountToken: false,
      securityContext: podSecurity,
      topologySpreadConstraints: spreadAcrossNodes(o.sel),
      containers: [
        {
          name: o.container,
          image,
          command: ['sh', `/scripts/${o.script}`],
          env: passwordEnv,
          ports: [{ name: o.container, containerPort: o.port }],
          readinessProbe: pingProbe(o.port, 5),
          livenessProbe: pingProbe(o.port, 10, 6),
          resources: o.resources,
          securityContext: containerSecurity,
          volumeMounts: [
            { name: o.dataVolume, mountPath: '/data' },
            { name: 'scripts', mountPath: '/scripts', readOnly: true },
          ],
        },
      ],
      volumes: o.volumes,
    },
  });

  const sel = labels('redis');
  const servers: k8s.types.input.apps.v1.StatefulSet = {
    apiVersion: 'apps/v1',
    kind: 'StatefulSet',
    metadata: { name: 'space-redis', namespace: ns, labels: sel },
    spec: {
      // the name single mode used: its volume (data-space-redis-0) becomes the first primary's
      serviceName: 'space-redis',
      replicas: r.servers,
      // all at once: a replica need not wait for the pods before it (each finds the primary itself)
      podManagementPolicy: 'Parallel',
      selector: { matchLabels: sel },
      template: pod({
        sel,
        container: 'redis',
        script: 'server.sh',
        port: REDIS_PORT,
        resources: { requests: { cpu: '250m', memory: '512Mi' }, limits: { memory: '2Gi' } },
        dataVolume: 'data',
        volumes: [scriptsVolume],
      }),
      volumeClaimTemplates: [redisDataClaim(r)],
    },
  };
  add('redis', servers, ['redis-scripts']);
  // headless: a DNS name per server (space-redis-<i>.space-redis.<ns>.svc), also before it is
  // ready, since a replica must reach a primary that is still loading
  const headless = (
    name: string,
    selector: Record<string, string>,
    port: number,
  ): k8s.types.input.core.v1.Service => ({
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { name, namespace: ns, labels: selector },
    spec: {
      type: 'ClusterIP',
      clusterIP: 'None',
      publishNotReadyAddresses: true,
      selector,
      ports: [{ name: 'redis', port, targetPort: port }],
    },
  });
  add('redis-svc', headless('space-redis', sel, REDIS_PORT));
  add('redis-pdb', {
    apiVersion: 'policy/v1',
    kind: 'PodDisruptionBudget',
    metadata: { name: 'space-redis', namespace: ns, labels: sel },
    // one server at a time: a drain moves the primary's pod only after the sentinels have a
    // replica to promote
    spec: { maxUnavailable: 1, selector: { matchLabels: sel } },
  } satisfies k8s.types.input.policy.v1.PodDisruptionBudget);

  const ssel = labels(SENTINEL_COMPONENT);
  const sentinels: k8s.types.input.apps.v1.StatefulSet = {
    apiVersion: 'apps/v1',
    kind: 'StatefulSet',
    metadata: { name: SENTINEL_NAME, namespace: ns, labels: ssel },
    spec: {
      serviceName: SENTINEL_HEADLESS,
      replicas: r.sentinels,
      podManagementPolicy: 'Parallel',
      selector: { matchLabels: ssel },
      // Sentinel rewrites its configuration (what it learnt); a new pod rebuilds it from the others
      template: pod({
        sel: ssel,
        container: 'sentinel',
        script: 'sentinel.sh',
        port: SENTINEL_PORT,
        resources: { requests: { cpu: '50m', memory: '64Mi' }, limits: { memory: '256Mi' } },
        dataVolume: 'config',
        volumes: [{ name: 'config', emptyDir: {} }, scriptsVolume],
      }),
    },
  };
  add('redis-sentinel', sentinels, ['redis-scripts']);
  add('redis-sentinel-headless', headless(SENTINEL_HEADLESS, ssel, SENTINEL_PORT));
  const clientSvc: k8s.types.input.core.v1.Service = {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { name: SENTINEL_NAME, namespace: ns, labels: ssel },
    spec: {
      type: 'ClusterIP',
      selector: ssel,
      ports: [{ name: 'sentinel', port: SENTINEL_PORT, targetPort: SENTINEL_PORT }],
    },
  };
  add('redis-sentinel-svc', clientSvc);
  add('redis-sentinel-pdb', {
    apiVersion: 'policy/v1',
    kind: 'PodDisruptionBudget',
    metadata: { name: SENTINEL_NAME, namespace: ns, labels: ssel },
    // one sentinel at a time: the others keep a majority (3 → 2, 5 → 4), so a failover can still
    // be authorised during a drain
    spec: { maxUnavailable: 1, selector: { matchLabels: ssel } },
  } satisfies k8s.types.input.policy.v1.PodDisruptionBudget);
}
