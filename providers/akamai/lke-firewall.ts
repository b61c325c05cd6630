/**
 * LKE node firewall by reconciliation, not by instance id: a Cloud Firewall whose device list is
 * filled at `pulumi up` from the cluster's current node ids stops covering a node as soon as LKE
 * recycles, upgrades or autoscales it (new instances, new ids), and the stack does not notice.
 * Instead the `space-lke-firewall` DaemonSet runs on every node and attaches the node it runs on
 * (`firewall-attach.ts`), at start and every 10 minutes. LKE Enterprise node pools take a
 * `firewall_id` of their own (Linode API v4beta, linode/linode_api4-python PR #615, 2025-10), which
 * @pulumi/linode 5.1.1 (the newest 5.x installable here, docs/deployment.md "Prerequisites (operator machine)") does not expose.
 *
 * What remains: a new node is unprotected from its first boot until this pod runs on it (the
 * kubelet pulls the image and starts it; typically a minute). Pure render; the caller creates them.
 */
import { readFileSync } from 'node:fs';
import type * as k8s from '@pulumi/kubernetes';
import type * as pulumi from '@pulumi/pulumi';

/** The attacher's source, mounted into the pod and run by the image's Node. */
export const ATTACH_SCRIPT = readFileSync(new URL('./firewall-attach.ts', import.meta.url), 'utf8');

/** Arguments of {@link lkeFirewallObjects}. */
export interface LkeFirewallArgs {
  readonly namespace: string;
  /** The nodes' Cloud Firewall (its id, as Pulumi reports it: a string). */
  readonly firewallId: pulumi.Input<string>;
  /** Linode token (Firewalls read/write, Linodes read-only); a Pulumi secret. */
  readonly token: pulumi.Input<string>;
  /** The SPACE image (it carries Node 24). */
  readonly image: string;
  readonly version: string;
  /** The runtime's pull Secret reference (`{ imagePullSecrets }`), or `{}` for a public image. */
  readonly pullSecrets?: { imagePullSecrets?: k8s.types.input.core.v1.LocalObjectReference[] };
}

type Obj = { readonly role: string; readonly object: object };

/** Secret (token), ConfigMap (script) and the DaemonSet on every node. */
export function lkeFirewallObjects(a: LkeFirewallArgs): Obj[] {
  const labels = {
    'app.kubernetes.io/name': 'space',
    'app.kubernetes.io/part-of': 'space',
    'app.kubernetes.io/component': 'lke-firewall',
  };
  const secret: k8s.types.input.core.v1.Secret = {
    apiVersion: 'v1',
    kind: 'Secret',
    metadata: { name: 'space-lke-firewall', namespace: a.namespace, labels },
    type: 'Opaque',
    stringData: { token: a.token },
  };
  const script: k8s.types.input.core.v1.ConfigMap = {
    apiVersion: 'v1',
    kind: 'ConfigMap',
    metadata: { name: 'space-lke-firewall-script', namespace: a.namespace, labels },
    data: { 'firewall-attach.ts': ATTACH_SCRIPT },
  };
  const ds: k8s.types.input.apps.v1.DaemonSet = {
    apiVersion: 'apps/v1',
    kind: 'DaemonSet',
    metadata: {
      name: 'space-lke-firewall',
      namespace: a.namespace,
      labels: { ...labels, 'app.kubernetes.io/version': a.version },
    },
    spec: {
      selector: { matchLabels: labels },
      template: {
        metadata: { labels: { ...labels, 'app.kubernetes.io/version': a.version } },
        spec: {
          automountServiceAccountToken: false,
          ...a.pullSecrets,
          // every node, whatever its taints: an unattached node is an open node
          tolerations: [{ operator: 'Exists' }],
          priorityClassName: 'system-node-critical',
          securityContext: { runAsNonRoot: true, runAsUser: 65534, runAsGroup: 65534 },
          containers: [
            {
              name: 'attach',
              image: a.image,
              command: ['node', '/opt/space-lke/firewall-attach.ts'],
              env: [
                { name: 'NODE_NAME', valueFrom: { fieldRef: { fieldPath: 'spec.nodeName' } } },
                { name: 'SPACE_LKE_FIREWALL_ID', value: a.firewallId },
                {
                  name: 'LINODE_TOKEN',
                  valueFrom: { secretKeyRef: { name: 'space-lke-firewall', key: 'token' } },
                },
              ],
              resources: { requests: { cpu: '10m', memory: '48Mi' }, limits: { memory: '128Mi' } },
              securityContext: {
                allowPrivilegeEscalation: false,
                readOnlyRootFilesystem: true,
                capabilities: { drop: ['ALL'] },
              },
              volumeMounts: [{ name: 'script', mountPath: '/opt/space-lke', readOnly: true }],
            },
          ],
          volumes: [{ name: 'script', configMap: { name: 'space-lke-firewall-script' } }],
        },
      },
    },
  };
  return [
    { role: 'lke-firewall-token', object: secret },
    { role: 'lke-firewall-script', object: script },
    { role: 'lke-firewall', object: ds },
  ];
}
