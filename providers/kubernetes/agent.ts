/**
 * The node agent on Kubernetes: one DaemonSet per node pool (`space-agent-<pool>`), privileged, on
 * the host network and PID namespace (sandboxes outlive the container and are re-adopted), with
 * `/dev/kvm` only for VMM drivers and, with the gateway, the shared host directory and the CA
 * certificate.
 */
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
                ...env(agentEnvironment(pool, a.agentEnv, { enabled: d.gatewayEnabled })),
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
                ...(vmm ? [{ name: 'kvm', mountPath: '/dev/kvm' }] : []),
                ...(d.gatewayEnabled
                  ? [
                      { name: 'gateway-run', mountPath: GATEWAY_RUN_DIR },
                      { name: 'gateway-ca-cert', mountPath: GATEWAY_CA_DIR, readOnly: true },
                    ]
                  : []),
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
  const { a, d, image } = ctx;
  const add = list.add.bind(list);
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
