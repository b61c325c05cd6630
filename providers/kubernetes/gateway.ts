/**
 * The egress gateway on Kubernetes: beside each agent pool a DaemonSet on the same nodes, and the
 * per-deployment CA (its key in a Secret only the gateway mounts, its certificate in a ConfigMap
 * for the agents) and the host-firewall ruleset its init container applies.
 */
import type * as k8s from '@pulumi/kubernetes';
import type { NodePool } from '../node-pool.ts';
import { POOL_LABEL } from '../node-pool.ts';
import {
  GATEWAY_CA_DIR,
  GATEWAY_CONTROL_SOCKET,
  GATEWAY_METRICS_PORT,
  GATEWAY_RUN_DIR,
  gatewayEnvironment,
  gatewayGuardRuleset,
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

/**
 * Adds the gateway's configuration: the CA Secret (certificate and key; only gateway pods mount it),
 * the CA certificate ConfigMap (the agents add it to every sandbox's trust store) and the guard
 * ruleset. Throws when the gateway is enabled without {@link RuntimeArgs.gatewayCa}.
 */
export function addGatewayConfig(list: ObjectList, ctx: RenderContext): void {
  const { a, d, ns } = ctx;
  const add = list.add.bind(list);
  if (d.gatewayEnabled) {
    if (!a.gatewayCa) throw new Error('gatewayCa is required when the gateway is enabled');
    // the CA key: only the gateway pods mount this Secret
    const caSecret: k8s.types.input.core.v1.Secret = {
      apiVersion: 'v1',
      kind: 'Secret',
      metadata: { name: 'space-gateway-ca', namespace: ns, labels: labels('gateway') },
      type: 'Opaque',
      stringData: { 'ca.crt': a.gatewayCa.certificate, 'ca.key': a.gatewayCa.key },
    };
    add('gateway-ca', caSecret);
    // the CA certificate (public): the agents add it to every sandbox's trust store
    const caCert: k8s.types.input.core.v1.ConfigMap = {
      apiVersion: 'v1',
      kind: 'ConfigMap',
      metadata: { name: 'space-gateway-ca-cert', namespace: ns, labels: labels('agent') },
      data: { 'ca.crt': a.gatewayCa.certificate },
    };
    add('gateway-ca-cert', caCert);
    const guard: k8s.types.input.core.v1.ConfigMap = {
      apiVersion: 'v1',
      kind: 'ConfigMap',
      metadata: { name: 'space-gateway-guard', namespace: ns, labels: labels('gateway') },
      data: { 'guard.nft': gatewayGuardRuleset() },
    };
    add('gateway-guard', guard);
  }
}

/** `minReadySeconds` and grace period of the gateway DaemonSets. */
const GATEWAY_MIN_READY_SECONDS = 5;
const GATEWAY_GRACE_SECONDS = 30;

/**
 * Seconds one node's gateway may take in a rolling update: its grace period, 60 s for the new pod
 * to pull the image, apply the host firewall and open its socket, and `minReadySeconds`. Pure.
 */
export function gatewayNodeRollSeconds(): number {
  return GATEWAY_GRACE_SECONDS + 60 + GATEWAY_MIN_READY_SECONDS;
}

/**
 * The gateway of `pool`: on exactly the agent's nodes (same selector and tolerations), host network,
 * root (its 0600 control socket in the host directory it shares with the agent), no capabilities.
 * An init container (NET_ADMIN) first installs the host firewall that closes its ports to anything
 * but sandbox interfaces: NetworkPolicies do not apply to host-network pods.
 */
export function gatewayDaemonSet(
  a: RuntimeArgs,
  pool: NodePool,
  image: string,
  tolerations: k8s.types.input.core.v1.Toleration[],
): k8s.types.input.apps.v1.DaemonSet {
  const d = runtimeDefaults(a);
  const sel = labels('gateway', { [POOL_LABEL]: pool.name });
  const version = { 'app.kubernetes.io/version': a.version };
  return {
    apiVersion: 'apps/v1',
    kind: 'DaemonSet',
    metadata: { name: `space-gateway-${pool.name}`, namespace: d.namespace, labels: { ...sel, ...version } },
    spec: {
      selector: { matchLabels: sel },
      updateStrategy: { type: 'RollingUpdate', rollingUpdate: { maxUnavailable: 1, maxSurge: 0 } },
      minReadySeconds: GATEWAY_MIN_READY_SECONDS,
      template: {
        metadata: { labels: { ...sel, ...version }, annotations: scrapeAnnotations(GATEWAY_METRICS_PORT) },
        spec: {
          serviceAccountName: 'space-gateway',
          automountServiceAccountToken: false,
          ...pullSecretsOf(a.imagePull),
          nodeSelector: { [POOL_LABEL]: pool.name },
          tolerations,
          priorityClassName: 'system-node-critical',
          // sandbox traffic reaches it through the node's nftables redirect
          hostNetwork: true,
          dnsPolicy: 'ClusterFirstWithHostNet',
          terminationGracePeriodSeconds: GATEWAY_GRACE_SECONDS,
          initContainers: [
            {
              name: 'host-firewall',
              image,
              command: ['nft', '-f', '/etc/space/nft/guard.nft'],
              resources: { requests: { cpu: '10m', memory: '16Mi' }, limits: { memory: '64Mi' } },
              securityContext: {
                runAsUser: 0,
                allowPrivilegeEscalation: false,
                readOnlyRootFilesystem: true,
                capabilities: { drop: ['ALL'], add: ['NET_ADMIN'] },
              },
              volumeMounts: [{ name: 'guard', mountPath: '/etc/space/nft', readOnly: true }],
            },
          ],
          containers: [
            {
              name: 'gateway',
              image,
              command: [...SERVICE_COMMANDS.gateway],
              // Redis: the gateway reads credential values itself; the node CIDRs join its deny set (E7)
              env: [
                // the metrics listener binds the node's address (host network), not every interface
                { name: 'POD_IP', valueFrom: { fieldRef: { fieldPath: 'status.podIP' } } },
                { name: 'SPACE_GATEWAY_METRICS_HOST', value: '$(POD_IP)' },
                ...env({
                  ...(d.nodeCidrs.length > 0 ? { SPACE_GATEWAY_NODE_CIDRS: d.nodeCidrs.join(',') } : {}),
                  ...gatewayEnvironment({
                    enabled: true,
                    ...(a.gatewayUpstreamDns ? { upstreamDns: a.gatewayUpstreamDns } : {}),
                    ...(a.gatewayDenyCidrs ? { denyCidrs: a.gatewayDenyCidrs } : {}),
                    ...(a.gatewayEnv ? { env: a.gatewayEnv } : {}),
                  }),
                }),
                redisUrlEnv,
              ],
              // no ports declared: nothing outside the node may reach them (see the init container)
              readinessProbe: { exec: { command: ['test', '-S', GATEWAY_CONTROL_SOCKET] }, periodSeconds: 5 },
              resources: { requests: { cpu: '250m', memory: '256Mi' }, limits: { memory: '1Gi' } },
              // root for the 0600 control socket the (root) agent uses; needs no capability
              securityContext: {
                runAsUser: 0,
                allowPrivilegeEscalation: false,
                readOnlyRootFilesystem: true,
                capabilities: { drop: ['ALL'] },
              },
              volumeMounts: [
                { name: 'gateway-run', mountPath: GATEWAY_RUN_DIR },
                { name: 'gateway-ca', mountPath: GATEWAY_CA_DIR, readOnly: true },
              ],
            },
          ],
          volumes: [
            { name: 'gateway-run', hostPath: { path: GATEWAY_RUN_DIR, type: 'DirectoryOrCreate' } },
            // the CA key: mode 0400 (the gateway refuses a key readable by group or others)
            { name: 'gateway-ca', secret: { secretName: 'space-gateway-ca', defaultMode: 0o400 } },
            { name: 'guard', configMap: { name: 'space-gateway-guard' } },
          ],
        },
      },
    },
  };
}
