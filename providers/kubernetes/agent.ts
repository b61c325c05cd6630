/**
 * The node agent on Kubernetes: one DaemonSet per node pool (`space-agent-<pool>`), privileged, on
 * the host network and PID namespace (sandboxes outlive the container and are re-adopted), with
 * `/dev/kvm` only for VMM drivers and, with the gateway, the shared host directory and the CA
 * certificate.
 */
import { readFileSync } from 'node:fs';
import type * as k8s from '@pulumi/kubernetes';
import { isVmmDriver, type NodePool, POOL_LABEL } from '../node-pool.ts';
import {
  AGENT_PORT,
  agentEnvironment,
  CACHE_DIR,
  GATEWAY_CA_DIR,
  GATEWAY_RUN_DIR,
  KEY_DIR,
  SERVICE_COMMANDS,
  scrapeAnnotations,
} from '../runtime-settings.ts';
import {
  env,
  labels,
  type ObjectList,
  pullSecretsOf,
  type RenderContext,
  type RuntimeArgs,
  redisUrlEnv,
  runtimeDefaults,
} from './args.ts';
import { gatewayDaemonSet, gatewayNodeRollSeconds } from './gateway.ts';

/** The cordon watcher's source (cordon-watch.ts), mounted into every agent pod from a ConfigMap. */
export const CORDON_WATCH_SCRIPT = readFileSync(new URL('./cordon-watch.ts', import.meta.url), 'utf8');
/** Where the agent and its cordon watcher share the drain file (an emptyDir of the pod). */
const DRAIN_DIR = '/run/space-drain';
/** The agent's `SPACE_DRAIN_FILE`: present while the node is cordoned. */
export const DRAIN_FILE = `${DRAIN_DIR}/draining`;
/** Where the cordon watcher finds its service-account token and the API server's CA. */
const API_TOKEN_DIR = '/var/run/secrets/space-api';

/** `minReadySeconds` of the agent DaemonSets: a new agent must stay ready this long before the next node. */
const AGENT_MIN_READY_SECONDS = 10;
/** Seconds a new agent pod may take to pull the image, start and re-adopt its sandboxes in a roll. */
const AGENT_START_SECONDS = 120;

/**
 * Seconds one node's agent may take in a rolling update: the old pod's grace period (drain budget
 * + 30 s), the new pod's start ({@link AGENT_START_SECONDS}) and `minReadySeconds`. Pure.
 */
export function agentNodeRollSeconds(a: RuntimeArgs): number {
  return runtimeDefaults(a).agentDrainSeconds + 30 + AGENT_START_SECONDS + AGENT_MIN_READY_SECONDS;
}

/**
 * How long Pulumi may wait for a DaemonSet rolling one node at a time over `nodes` nodes, s: the
 * provider's own 10 minutes plus `perNode` for each node. Pulumi's default (10 minutes in all) fails
 * `pulumi up` part-way through a large pool's roll while the roll goes on in the cluster. Pure.
 */
export function daemonSetTimeoutSeconds(nodes: number, perNode: number): number {
  return 600 + Math.max(nodes, 1) * perNode;
}

/** The agent DaemonSet of `pool`. Pure. */
export function agentDaemonSet(
  a: RuntimeArgs,
  pool: NodePool,
  image: string,
  tolerations: k8s.types.input.core.v1.Toleration[],
): k8s.types.input.apps.v1.DaemonSet {
  const d = runtimeDefaults(a);
  const sel = labels('agent', { [POOL_LABEL]: pool.name });
  const vmm = isVmmDriver(pool.driver);
  const hostPath = (name: string, path: string, type: string): k8s.types.input.core.v1.Volume => ({
    name,
    hostPath: { path, type },
  });
  return {
    apiVersion: 'apps/v1',
    kind: 'DaemonSet',
    metadata: {
      name: `space-agent-${pool.name}`,
      namespace: d.namespace,
      labels: { ...sel, 'app.kubernetes.io/version': a.version },
    },
    spec: {
      selector: { matchLabels: sel },
      // one node at a time; no surge: two agents cannot share a node's sandboxes, taps and nft table
      updateStrategy: { type: 'RollingUpdate', rollingUpdate: { maxUnavailable: 1, maxSurge: 0 } },
      minReadySeconds: AGENT_MIN_READY_SECONDS,
      template: {
        metadata: {
          labels: { ...sel, 'app.kubernetes.io/version': a.version },
          // /metrics is on the data-plane port
          annotations: scrapeAnnotations(AGENT_PORT),
        },
        spec: {
          serviceAccountName: 'space-agent',
          automountServiceAccountToken: false,
          ...pullSecretsOf(a.imagePull),
          nodeSelector: { [POOL_LABEL]: pool.name },
          tolerations,
          priorityClassName: 'system-node-critical',
          // sandboxes' namespaces, veths and nft rules live in the node's network namespace
          hostNetwork: true,
          dnsPolicy: 'ClusterFirstWithHostNet',
          // sandbox processes must outlive the agent container to be re-adopted after a restart
          hostPID: true,
          // SIGTERM is the drain: the agent stops heartbeating (unschedulable), stops serving and
          // leaves sandboxes running (SPACE_AGENT_ON_SHUTDOWN=keep) for the next agent to re-adopt
          terminationGracePeriodSeconds: d.agentDrainSeconds + 30,
          containers: [
            {
              name: 'agent',
              image,
              command: [...SERVICE_COMMANDS.agent],
              env: [
                { name: 'SPACE_NODE_ID', valueFrom: { fieldRef: { fieldPath: 'spec.nodeName' } } },
                { name: 'NODE_IP', valueFrom: { fieldRef: { fieldPath: 'status.hostIP' } } },
                { name: 'SPACE_AGENT_URL', value: `http://$(NODE_IP):${AGENT_PORT}` },
                ...env({
                  ...agentEnvironment(pool, a.agentEnv, { enabled: d.gatewayEnabled }),
                  // a cordoned node drains: no new sandboxes; at SIGTERM its sandboxes get the drain
                  // budget to end (the grace period leaves 30 s for the rest of the shutdown)
                  SPACE_DRAIN_FILE: DRAIN_FILE,
                  SPACE_DRAIN_WAIT_MS: String(d.agentDrainSeconds * 1000),
                }),
                redisUrlEnv,
              ],
              ports: [{ name: 'data-plane', containerPort: AGENT_PORT, hostPort: AGENT_PORT }],
              readinessProbe: { httpGet: { path: '/readyz', port: AGENT_PORT }, periodSeconds: 5 },
              livenessProbe: {
                httpGet: { path: '/healthz', port: AGENT_PORT },
                periodSeconds: 10,
                failureThreshold: 6,
                initialDelaySeconds: 30,
              },
              startupProbe: {
                httpGet: { path: '/readyz', port: AGENT_PORT },
                periodSeconds: 5,
                // the first start may build templates (minutes)
                failureThreshold: 120,
              },
              resources: { requests: { cpu: '500m', memory: '512Mi' }, limits: { memory: '4Gi' } },
              // needs: netns/veth/nftables, runsc, cgroups, and (VMM drivers) /dev/kvm
              securityContext: { privileged: true, runAsUser: 0 },
              volumeMounts: [
                { name: 'verify-key', mountPath: KEY_DIR, readOnly: true },
                { name: 'state', mountPath: CACHE_DIR },
                { name: 'netns', mountPath: '/var/run/netns', mountPropagation: 'Bidirectional' },
                { name: 'cgroup', mountPath: '/sys/fs/cgroup' },
                { name: 'modules', mountPath: '/lib/modules', readOnly: true },
                { name: 'tun', mountPath: '/dev/net/tun' },
                { name: 'drain', mountPath: DRAIN_DIR, readOnly: true },
                ...(vmm ? [{ name: 'kvm', mountPath: '/dev/kvm' }] : []),
                ...(d.gatewayEnabled
                  ? [
                      { name: 'gateway-run', mountPath: GATEWAY_RUN_DIR },
                      { name: 'gateway-ca-cert', mountPath: GATEWAY_CA_DIR, readOnly: true },
                    ]
                  : []),
              ],
            },
            {
              // keeps SPACE_DRAIN_FILE in place while the node is cordoned (cordon-watch.ts)
              name: 'cordon-watch',
              image,
              command: ['node', '/opt/space-cordon/cordon-watch.ts'],
              env: [
                { name: 'NODE_NAME', valueFrom: { fieldRef: { fieldPath: 'spec.nodeName' } } },
                { name: 'SPACE_DRAIN_FILE', value: DRAIN_FILE },
                { name: 'SPACE_CORDON_TOKEN_FILE', value: `${API_TOKEN_DIR}/token` },
                { name: 'NODE_EXTRA_CA_CERTS', value: `${API_TOKEN_DIR}/ca.crt` },
              ],
              resources: { requests: { cpu: '5m', memory: '32Mi' }, limits: { memory: '96Mi' } },
              securityContext: {
                runAsUser: 65534,
                runAsGroup: 65534,
                runAsNonRoot: true,
                allowPrivilegeEscalation: false,
                readOnlyRootFilesystem: true,
                capabilities: { drop: ['ALL'] },
              },
              volumeMounts: [
                { name: 'drain', mountPath: DRAIN_DIR },
                { name: 'cordon-watch', mountPath: '/opt/space-cordon', readOnly: true },
                { name: 'api-token', mountPath: API_TOKEN_DIR, readOnly: true },
              ],
            },
          ],
          volumes: [
            { name: 'verify-key', configMap: { name: 'space-verify-key' } },
            hostPath('state', CACHE_DIR, 'DirectoryOrCreate'),
            hostPath('netns', '/var/run/netns', 'DirectoryOrCreate'),
            hostPath('cgroup', '/sys/fs/cgroup', 'Directory'),
            hostPath('modules', '/lib/modules', 'Directory'),
            hostPath('tun', '/dev/net/tun', 'CharDevice'),
            { name: 'drain', emptyDir: { medium: 'Memory', sizeLimit: '1Mi' } },
            { name: 'cordon-watch', configMap: { name: 'space-cordon-watch' } },
            // only the cordon watcher mounts a token: the agent's service account may get nodes
            {
              name: 'api-token',
              projected: {
                sources: [
                  { serviceAccountToken: { path: 'token', expirationSeconds: 3600 } },
                  { configMap: { name: 'kube-root-ca.crt', items: [{ key: 'ca.crt', path: 'ca.crt' }] } },
                ],
              },
            },
            ...(vmm ? [hostPath('kvm', '/dev/kvm', 'CharDevice')] : []),
            ...(d.gatewayEnabled
              ? [
                  hostPath('gateway-run', GATEWAY_RUN_DIR, 'DirectoryOrCreate'),
                  { name: 'gateway-ca-cert', configMap: { name: 'space-gateway-ca-cert' } },
                ]
              : []),
          ],
        },
      },
    },
  };
}

/**
 * Adds, per node pool, the gateway DaemonSet (when enabled) and the agent DaemonSet. Both tolerate
 * the pool taint and {@link RuntimeArgs.agentTolerations}; both roll one node at a time, at the
 * same time (neither waits for the other's whole roll), and Pulumi waits for each as long as its
 * pool's size needs ({@link daemonSetTimeoutSeconds}).
 */
export function addNodeServices(list: ObjectList, ctx: RenderContext): void {
  const { a, d, image, ns } = ctx;
  const add = list.add.bind(list);
  // the cordon watcher of every agent pod: its script, and the one right it needs (get nodes)
  const script: k8s.types.input.core.v1.ConfigMap = {
    apiVersion: 'v1',
    kind: 'ConfigMap',
    metadata: { name: 'space-cordon-watch', namespace: ns, labels: labels('agent') },
    data: { 'cordon-watch.ts': CORDON_WATCH_SCRIPT },
  };
  add('cordon-watch', script);
  const role: k8s.types.input.rbac.v1.ClusterRole = {
    apiVersion: 'rbac.authorization.k8s.io/v1',
    kind: 'ClusterRole',
    metadata: { name: `space-node-reader-${ns}`, labels: labels('agent') },
    rules: [{ apiGroups: [''], resources: ['nodes'], verbs: ['get'] }],
  };
  add('node-reader', role);
  const binding: k8s.types.input.rbac.v1.ClusterRoleBinding = {
    apiVersion: 'rbac.authorization.k8s.io/v1',
    kind: 'ClusterRoleBinding',
    metadata: { name: `space-node-reader-${ns}`, labels: labels('agent') },
    roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'ClusterRole', name: `space-node-reader-${ns}` },
    subjects: [{ kind: 'ServiceAccount', name: 'space-agent', namespace: ns }],
  };
  add('node-reader-binding', binding, ['node-reader']);
  const tolerations = [
    // pools may be tainted so that nothing else lands there; the agent goes everywhere it is asked to
    { key: POOL_LABEL, operator: 'Exists', effect: 'NoSchedule' },
    ...(a.agentTolerations ?? []),
  ];
  // No ordering between a pool's gateway and agent DaemonSets: a restarted gateway holds no
  // registration, and its node's agent registers its sandboxes again within one watchdog pass
  // (SPACE_WATCHDOG_INTERVAL_MS; it sees the gateway's new registry id) whether or not the agent
  // restarts too, so making the agents wait for the whole pool's gateway roll protected nothing
  // and doubled the roll. Both roll at once, one node at a time each. (One pod with both
  // containers would roll them on the same node together, but the gateway would then share the
  // agent's host PID namespace, and the first roll would deadlock: the new pods' gateways cannot
  // bind the ports the old gateway pods hold until Pulumi deletes that DaemonSet, after the roll.)
  for (const pool of a.nodePools) {
    if (d.gatewayEnabled)
      add(
        `gateway-${pool.name}`,
        gatewayDaemonSet(a, pool, image, tolerations),
        undefined,
        daemonSetTimeoutSeconds(pool.count, gatewayNodeRollSeconds()),
      );
    add(
      `agent-${pool.name}`,
      agentDaemonSet(a, pool, image, tolerations),
      undefined,
      daemonSetTimeoutSeconds(pool.count, agentNodeRollSeconds(a)),
    );
  }
}
