/**
 * `space:kubernetes:Runtime` — the whole SPACE runtime on one Kubernetes cluster: namespace, Redis
 * (StatefulSet with a volume, or an external URL), the API (Deployment, Service, HPA, PDB), one
 * agent DaemonSet per node pool (privileged, host network and PID, `/dev/kvm` only for VMM
 * drivers), beside each agent pool a gateway DaemonSet on the same nodes (host network; the agent
 * reaches it through the shared host directory `/run/space`; the CA key in a Secret only it mounts;
 * an init container closes its ports to everything but sandbox interfaces), NetworkPolicies, and
 * the keys as Secret/ConfigMap. Used on LKE, CoreWeave CKS and kind.
 *
 * `renderRuntimeObjects` is pure: it returns every object as data (typed with the Kubernetes input
 * types, so a misspelt field fails to compile). The component only turns each into a resource.
 * Each service renders in its own module (api.ts, router.ts, agent.ts, gateway.ts, redis.ts); the
 * API and the router share one Deployment + Service + HPA + PDB builder (workload.ts); arguments,
 * defaults and the render context are in args.ts.
 */
import * as k8s from '@pulumi/kubernetes';
import * as pulumi from '@pulumi/pulumi';
import { dockerConfigJson, imageRegistry } from '../image-pull.ts';
import dashboard from '../observability/space-dashboard.json' with { type: 'json' };
import { API_PORT, ROUTER_PORT } from '../runtime-settings.ts';
import { addNodeServices } from './agent.ts';
import { addApi } from './api.ts';
import {
  IMAGE_PULL_SECRET,
  labels,
  ObjectList,
  type RenderedObject,
  type RuntimeArgs,
  renderContext,
  runtimeDefaults,
  TLS_SECRET,
} from './args.ts';
import { addBackup } from './backup.ts';
import { addGatewayConfig } from './gateway.ts';
import { addMonitoring } from './monitoring.ts';
import { addRedis, addRedisPolicy } from './redis.ts';
import { addRouter } from './router.ts';

export {
  IMAGE_PULL_SECRET,
  type ImagePullArgs,
  type PublicExposure,
  type PublicServiceArgs,
  pullSecretsOf,
  type RedisArgs,
  type RenderedObject,
  type RouterArgs,
  type RuntimeArgs,
  runtimeDefaults,
  TLS_SECRET,
  type TlsArgs,
} from './args.ts';
export { publicService } from './workload.ts';

/**
 * Every Kubernetes object of the runtime, in apply order: namespace, service accounts, keys, the
 * gateway's CA and guard, Redis, TLS, the API and the router (the shared scaled-service builder),
 * per pool the gateway then the agent, network policies, the dashboard, and with
 * {@link RuntimeArgs.prometheusOperator} the PodMonitors and the PrometheusRule. Pure. With
 * {@link RuntimeArgs.imagePull} credentials, a `kubernetes.io/dockerconfigjson` Secret too, named
 * by every pod that runs the SPACE image.
 */
export function renderRuntimeObjects(a: RuntimeArgs): RenderedObject[] {
  const ctx = renderContext(a);
  const { d, ns } = ctx;
  const list = new ObjectList();
  const add = list.add.bind(list);

  const namespace: k8s.types.input.core.v1.Namespace = {
    apiVersion: 'v1',
    kind: 'Namespace',
    metadata: {
      name: ns,
      labels: {
        ...labels('namespace'),
        // the agent is privileged (host network/PID, devices): Pod Security must allow it here
        'pod-security.kubernetes.io/enforce': 'privileged',
      },
    },
  };
  add('ns', namespace);

  for (const component of ['api', 'router', 'agent', 'redis', ...(d.gatewayEnabled ? ['gateway'] : [])]) {
    // no service talks to the Kubernetes API: no token in any pod
    const sa: k8s.types.input.core.v1.ServiceAccount = {
      apiVersion: 'v1',
      kind: 'ServiceAccount',
      metadata: { name: `space-${component}`, namespace: ns, labels: labels(component) },
      automountServiceAccountToken: false,
    };
    add(`${component}-sa`, sa);
  }

  // the registry login every pod running the SPACE image pulls with (space:imagePullUsername/Password)
  if (a.imagePull && 'username' in a.imagePull) {
    const { username, password } = a.imagePull;
    const pull: k8s.types.input.core.v1.Secret = {
      apiVersion: 'v1',
      kind: 'Secret',
      metadata: { name: IMAGE_PULL_SECRET, namespace: ns, labels: labels('image') },
      type: 'kubernetes.io/dockerconfigjson',
      stringData: {
        '.dockerconfigjson': pulumi
          .output(password)
          .apply((p) => dockerConfigJson(imageRegistry(d.imageRepository), username, p)),
      },
    };
    add('image-pull', pull);
  }

  const signing: k8s.types.input.core.v1.Secret = {
    apiVersion: 'v1',
    kind: 'Secret',
    metadata: { name: 'space-signing-key', namespace: ns, labels: labels('api') },
    type: 'Opaque',
    stringData: { 'signing.pem': a.signingKey },
  };
  add('signing-key', signing);
  const verify: k8s.types.input.core.v1.ConfigMap = {
    apiVersion: 'v1',
    kind: 'ConfigMap',
    metadata: { name: 'space-verify-key', namespace: ns, labels: labels('agent') },
    data: { 'verify.pem': a.verifyKey },
  };
  add('verify-key', verify);

  addGatewayConfig(list, ctx);
  addRedis(list, ctx);

  // ---- TLS: one cert-manager Certificate for both hostnames (and the sandboxes' wildcard); its
  // Secret is mounted by both services
  if (a.tls) {
    // cert-manager.io/v1 Certificate (cert-manager.io/docs/usage/certificate/): cert-manager keeps
    // the Secret renewed; the services read it at start, so a rollout picks up a renewal
    add('tls-cert', {
      apiVersion: 'cert-manager.io/v1',
      kind: 'Certificate',
      metadata: { name: TLS_SECRET, namespace: ns, labels: labels('tls') },
      spec: {
        secretName: TLS_SECRET,
        // `*.<sandboxDomain>`: the servers in sandboxes, served by the router (DNS-01 issuers only)
        dnsNames: [
          a.tls.apiHostname,
          a.tls.routerHostname,
          ...(a.tls.sandboxDomain ? [`*.${a.tls.sandboxDomain}`] : []),
        ],
        issuerRef: {
          name: a.tls.issuer.name,
          kind: a.tls.issuer.kind ?? 'ClusterIssuer',
          group: 'cert-manager.io',
        },
        privateKey: { algorithm: 'ECDSA', size: 256, rotationPolicy: 'Always' },
        usages: ['server auth', 'digital signature', 'key encipherment'],
      },
    });
  }
  addApi(list, ctx);
  addRouter(list, ctx);
  addNodeServices(list, ctx);

  // ---- network policies
  const deny: k8s.types.input.networking.v1.NetworkPolicy = {
    apiVersion: 'networking.k8s.io/v1',
    kind: 'NetworkPolicy',
    metadata: { name: 'space-default-deny-ingress', namespace: ns, labels: labels('policy') },
    spec: { podSelector: {}, policyTypes: ['Ingress'] },
  };
  add('netpol-deny', deny);
  const apiIngress: k8s.types.input.networking.v1.NetworkPolicy = {
    apiVersion: 'networking.k8s.io/v1',
    kind: 'NetworkPolicy',
    metadata: { name: 'space-api-ingress', namespace: ns, labels: labels('policy') },
    spec: {
      podSelector: { matchLabels: labels('api') },
      policyTypes: ['Ingress'],
      ingress: [{ ports: [{ protocol: 'TCP', port: API_PORT }] }],
    },
  };
  add('netpol-api', apiIngress);
  const routerIngress: k8s.types.input.networking.v1.NetworkPolicy = {
    apiVersion: 'networking.k8s.io/v1',
    kind: 'NetworkPolicy',
    metadata: { name: 'space-router-ingress', namespace: ns, labels: labels('policy') },
    spec: {
      podSelector: { matchLabels: labels('router') },
      policyTypes: ['Ingress'],
      ingress: [{ ports: [{ protocol: 'TCP', port: ROUTER_PORT }] }],
    },
  };
  add('netpol-router', routerIngress);
  addRedisPolicy(list, ctx);
  addBackup(list, ctx);

  // the Grafana dashboard, for Grafana's sidecar (it loads ConfigMaps labelled grafana_dashboard)
  const dash: k8s.types.input.core.v1.ConfigMap = {
    apiVersion: 'v1',
    kind: 'ConfigMap',
    metadata: {
      name: 'space-grafana-dashboard',
      namespace: ns,
      labels: { ...labels('observability'), grafana_dashboard: '1' },
    },
    data: { 'space.json': JSON.stringify(dashboard) },
  };
  add('grafana-dashboard', dash);
  addMonitoring(list, ctx);
  return list.out;
}

/** The resource class for each kind the render produces. */
const RESOURCE_CLASSES = {
  Namespace: k8s.core.v1.Namespace,
  ServiceAccount: k8s.core.v1.ServiceAccount,
  Secret: k8s.core.v1.Secret,
  ConfigMap: k8s.core.v1.ConfigMap,
  Service: k8s.core.v1.Service,
  StatefulSet: k8s.apps.v1.StatefulSet,
  Deployment: k8s.apps.v1.Deployment,
  DaemonSet: k8s.apps.v1.DaemonSet,
  CronJob: k8s.batch.v1.CronJob,
  HorizontalPodAutoscaler: k8s.autoscaling.v2.HorizontalPodAutoscaler,
  PodDisruptionBudget: k8s.policy.v1.PodDisruptionBudget,
  NetworkPolicy: k8s.networking.v1.NetworkPolicy,
  ClusterRole: k8s.rbac.v1.ClusterRole,
  ClusterRoleBinding: k8s.rbac.v1.ClusterRoleBinding,
} as const;

/**
 * An object of a custom resource kind (cert-manager's Certificate, the Prometheus Operator's
 * PodMonitor and PrometheusRule: no typed class in @pulumi/kubernetes): a CustomResource of the
 * `apiVersion` and `kind` it is made with.
 */
function customResourceClass(apiVersion: string, kind: string): ResourceCtor {
  return class extends k8s.apiextensions.CustomResource {
    constructor(name: string, args: Record<string, unknown>, opts?: pulumi.CustomResourceOptions) {
      super(name, { apiVersion, kind, ...args } as never, opts);
    }
  };
}

/** The kinds made as custom resources, by kind. */
const CUSTOM_KINDS: Readonly<Record<string, string>> = {
  Certificate: 'cert-manager.io/v1',
  PodMonitor: 'monitoring.coreos.com/v1',
  PrometheusRule: 'monitoring.coreos.com/v1',
};

type ResourceCtor = new (
  name: string,
  args: Record<string, unknown>,
  opts?: pulumi.CustomResourceOptions,
) => pulumi.CustomResource;

/**
 * The SPACE runtime on a Kubernetes cluster. Pass the cluster's provider in `opts.providers`
 * (or `opts.provider`); every child inherits it.
 */
export class Runtime extends pulumi.ComponentResource {
  /** The namespace name. */
  readonly namespace: pulumi.Output<string>;
  /** The API Service (its load balancer address is in `status.loadBalancer`). */
  readonly apiService: k8s.core.v1.Service;
  /** The router Service (clients' data plane; its load balancer address is in `status.loadBalancer`). */
  readonly routerService: k8s.core.v1.Service;
  /** Every child resource, by role (`api`, `agent-default`, …). */
  readonly children: Readonly<Record<string, pulumi.CustomResource>>;

  constructor(name: string, args: RuntimeArgs, opts: pulumi.ComponentResourceOptions = {}) {
    super('space:kubernetes:Runtime', name, {}, opts);
    const created = createRuntime(this, name, args);
    this.children = created;
    this.apiService = created['api-svc'] as k8s.core.v1.Service;
    this.routerService = created['router-svc'] as k8s.core.v1.Service;
    this.namespace = pulumi.output(runtimeDefaults(args).namespace);
    this.registerOutputs({ namespace: this.namespace });
  }
}

/** Pulumi `customTimeouts` for creates and updates of `seconds` (whole minutes, rounded up). */
export function pulumiTimeouts(seconds: number): pulumi.CustomTimeouts {
  const t = `${Math.ceil(seconds / 60)}m`;
  return { create: t, update: t };
}

/** Creates every object of {@link renderRuntimeObjects} as a child of `parent`, in order. */
export function createRuntime(
  parent: pulumi.ComponentResource,
  name: string,
  args: RuntimeArgs,
): Record<string, pulumi.CustomResource> {
  const created: Record<string, pulumi.CustomResource> = {};
  let namespace: pulumi.CustomResource | undefined;
  for (const { role, object, after, timeoutSeconds } of renderRuntimeObjects(args)) {
    const Ctor = (
      CUSTOM_KINDS[object.kind] === object.apiVersion
        ? customResourceClass(object.apiVersion, object.kind)
        : RESOURCE_CLASSES[object.kind as keyof typeof RESOURCE_CLASSES]
    ) as ResourceCtor | undefined;
    if (!Ctor) throw new pulumi.ResourceError(`no resource class for kind ${object.kind}`, parent);
    const { apiVersion: _v, kind: _k, ...body } = object;
    const r = new Ctor(`${name}-${role}`, body, {
      parent,
      dependsOn: [...(namespace ? [namespace] : []), ...(after ?? []).map((r) => created[r]!)],
      // the Secret's data must not show in plain text in the state or the CLI
      ...(object.kind === 'Secret' ? { additionalSecretOutputs: ['data', 'stringData'] } : {}),
      ...(timeoutSeconds ? { customTimeouts: pulumiTimeouts(timeoutSeconds) } : {}),
    });
    if (object.kind === 'Namespace') namespace = r;
    created[role] = r;
  }
  return created;
}
