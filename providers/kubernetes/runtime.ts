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
 */
import * as k8s from '@pulumi/kubernetes';
import * as pulumi from '@pulumi/pulumi';
import { isVmmDriver, type NodePool, POOL_LABEL } from '../node-pool.ts';
import dashboard from '../observability/space-dashboard.json' with { type: 'json' };
import {
  AGENT_PORT,
  API_PORT,
  agentEnvironment,
  apiEnvironment,
  CACHE_DIR,
  DEFAULT_IMAGE_REPOSITORY,
  GATEWAY_CA_DIR,
  GATEWAY_CONTROL_SOCKET,
  GATEWAY_METRICS_PORT,
  GATEWAY_RUN_DIR,
  gatewayEnvironment,
  gatewayGuardRuleset,
  imageRef,
  KEY_DIR,
  REDIS_PERSISTENCE,
  REDIS_PORT,
  ROUTER_PORT,
  routerEnvironment,
  SERVICE_COMMANDS,
  scrapeAnnotations,
  TLS_DIR,
} from '../runtime-settings.ts';

type Input<T> = pulumi.Input<T>;

/** Redis: a StatefulSet in the namespace, or a URL the operator provides. */
export type RedisArgs =
  | {
      readonly mode: 'in-cluster';
      /** Password Redis requires (`--requirepass`); a Pulumi secret. */
      readonly password: Input<string>;
      /** Volume size, GiB. Default 10. */
      readonly storageGiB?: number;
      /** StorageClass of the volume. Default: the cluster's default class. */
      readonly storageClassName?: string;
      /** Redis image. Default `redis:7.4-alpine` (Docker Hub). */
      readonly image?: string;
    }
  | {
      readonly mode: 'external';
      /** `redis://[:password@]host:port[/db]`; a Pulumi secret. */
      readonly url: Input<string>;
    };

/**
 * How client-facing Services are exposed: the API's `space-api`, and the router's `space-router`
 * when `router` is set. Each cloud applies client source ranges its own way, so the cloud module
 * fills this (see `providers/<cloud>`): CoreWeave honours `loadBalancerSourceRanges` on a Service
 * annotated public; Linode's cloud controller ignores that field and reads a firewall ACL
 * annotation instead.
 */
export interface PublicExposure {
  /** Service type. Default `LoadBalancer` (the cloud makes a load balancer). */
  readonly serviceType?: 'LoadBalancer' | 'NodePort' | 'ClusterIP';
  /** Annotations the cloud's load-balancer controller reads (public address, access list). Default none. */
  readonly annotations?: Readonly<Record<string, string>>;
  /** `spec.loadBalancerSourceRanges`, only for controllers documented to honour it. Default none. */
  readonly loadBalancerSourceRanges?: readonly string[];
}

/** A client-facing Service (the API's, the router's). */
export interface PublicServiceArgs {
  /** TCP port of the Service. */
  readonly port: number;
  /** TCP port of the pods. Default: `port`. */
  readonly targetPort?: number;
  /** Fixed node port when the exposure is `NodePort`. Default: any. */
  readonly nodePort?: number;
}

/** The router of {@link RuntimeArgs.router}: replicas like the API's, and the URL clients use. */
export interface RouterArgs {
  /** Router replicas (HPA minimum). Default: the API's (`apiReplicas`). */
  readonly replicas?: number;
  /** HPA maximum. Default: the API's (`apiMaxReplicas`). */
  readonly maxReplicas?: number;
  /** Fixed node port when the exposure is `NodePort` (kind maps it to the host). Default: any. */
  readonly nodePort?: number;
  /**
   * The router's public base URL, given to the API as `SPACE_ROUTER_URL` (data-plane URLs handed to
   * clients point there). Default with {@link TlsArgs}: `https://<routerHostname>`; else none, and
   * the API hands out the agents' own (private) URLs, which clients cannot reach.
   */
  readonly publicUrl?: string;
}

/** cert-manager TLS of the client-facing services (cert-manager.io/v1 `Certificate`). */
export interface TlsArgs {
  /** The issuer cert-manager signs with (installed by the operator, e.g. an ACME ClusterIssuer). */
  readonly issuer: { readonly name: string; readonly kind?: 'Issuer' | 'ClusterIssuer' };
  /** DNS name of the API (points at the `space-api` load balancer). */
  readonly apiHostname: string;
  /** DNS name of the router (points at the `space-router` load balancer). */
  readonly routerHostname: string;
}

/** Name of the cert-manager Certificate and of the `kubernetes.io/tls` Secret it writes. */
export const TLS_SECRET = 'space-tls';

/** Arguments of {@link Runtime}. */
export interface RuntimeArgs {
  /** SPACE version: the tag of the one image (`space:version`). Required. */
  readonly version: string;
  /** Image repository; the image runs all three services. Default `ghcr.io/space-sandbox/space`. */
  readonly imageRepository?: string;
  /** Namespace created for SPACE. Default `space`. */
  readonly namespace?: string;
  /** Node pools; one agent DaemonSet each, on nodes labelled `space.dev/pool=<name>`. Required. */
  readonly nodePools: readonly NodePool[];
  /** Ed25519 private key, PKCS#8 PEM; a Pulumi secret. Mounted only into the API. */
  readonly signingKey: Input<string>;
  /** Ed25519 public key, SPKI PEM, matching `signingKey`. Mounted into the agents. */
  readonly verifyKey: Input<string>;
  /** Where Redis is. */
  readonly redis: RedisArgs;
  /** API replicas (HPA minimum). Default 2. */
  readonly apiReplicas?: number;
  /** HPA maximum. Default 10. */
  readonly apiMaxReplicas?: number;
  /** Service type in front of the API. Default `LoadBalancer` (LKE/CKS make a cloud load balancer). */
  readonly apiServiceType?: 'LoadBalancer' | 'NodePort' | 'ClusterIP';
  /** Fixed node port of the API when `apiServiceType` is `NodePort` (kind maps it to the host). Default: any. */
  readonly apiNodePort?: number;
  /** Cloud annotations and source ranges of every client-facing Service. Default none. */
  readonly exposure?: Omit<PublicExposure, 'serviceType'>;
  /** The data-plane router (`space-router` Deployment, Service, HPA, PDB). Default: see {@link RouterArgs}. */
  readonly router?: RouterArgs;
  /**
   * TLS of both client-facing services through cert-manager: one Certificate (`space-tls`) for the
   * API and router hostnames, issued by an Issuer/ClusterIssuer the operator installed; the API and
   * the router serve HTTPS themselves from its Secret, so the load balancers stay plain TCP (the
   * same on every cloud). Default none: plain HTTP.
   */
  readonly tls?: TlsArgs;
  /** Seconds an agent may take to stop (its drain budget). Grace period = this + 30 s. Default 120. */
  readonly agentDrainSeconds?: number;
  /**
   * Deploy the egress gateway (`space-gateway-<pool>` DaemonSets) beside the agents. Default true.
   * False: agents get no `SPACE_GATEWAY_CONTROL_SOCKET`, so sandboxes have no egress at all.
   */
  readonly gatewayEnabled?: boolean;
  /**
   * The per-deployment CA (ECDSA P-256, `cA=true`) the gateway signs intercepted leaves with:
   * PEM certificate (public; given to the agents as `SPACE_TRUSTED_CA_FILE`) and PEM private key
   * (a Pulumi secret; only in the Secret the gateway mounts). Required when the gateway is enabled.
   */
  readonly gatewayCa?: { readonly certificate: Input<string>; readonly key: Input<string> };
  /** The gateway's upstream resolvers, `ip:port` each. Default: the gateway's own (`1.1.1.1:53`). */
  readonly gatewayUpstreamDns?: readonly string[];
  /** CIDRs the gateway never dials nor answers. Default: the gateway's own (private ranges…). */
  readonly gatewayDenyCidrs?: readonly string[];
  /** Extra gateway settings (`SPACE_GATEWAY_*`, checked by the stack config). Default none. */
  readonly gatewayEnv?: Readonly<Record<string, string>>;
  /**
   * CIDRs agent traffic comes from. Agents use the host network, so NetworkPolicy pod selectors do
   * not match them: Redis admits these address blocks besides the API pods. Default none.
   */
  readonly nodeCidrs?: readonly string[];
  /** Tolerations added to agent (and gateway) pods, e.g. a cloud's taints on CPU nodes. Default none. */
  readonly agentTolerations?: readonly k8s.types.input.core.v1.Toleration[];
  /** Extra API settings (`SPACE_*`, checked by the stack config). Default none. */
  readonly apiEnv?: Readonly<Record<string, string>>;
  /** Extra agent settings (`SPACE_*`). Default none. */
  readonly agentEnv?: Readonly<Record<string, string>>;
}

/** One rendered object with the Pulumi logical-name suffix it gets (`${name}-${role}`). */
export interface RenderedObject {
  readonly role: string;
  readonly object: { readonly apiVersion: string; readonly kind: string } & Record<string, unknown>;
  /** Roles this object is applied after (Pulumi `dependsOn`; e.g. an agent after its node's gateway). */
  readonly after?: readonly string[];
}

const COMPONENT_LABEL = 'app.kubernetes.io/component';
const labels = (component: string, extra: Record<string, string> = {}) => ({
  'app.kubernetes.io/name': 'space',
  'app.kubernetes.io/part-of': 'space',
  [COMPONENT_LABEL]: component,
  ...extra,
});

/** Fills the defaults of {@link RuntimeArgs}. */
export function runtimeDefaults(a: RuntimeArgs) {
  return {
    imageRepository: a.imageRepository ?? DEFAULT_IMAGE_REPOSITORY,
    namespace: a.namespace ?? 'space',
    apiReplicas: a.apiReplicas ?? 2,
    apiMaxReplicas: Math.max(a.apiMaxReplicas ?? 10, a.apiReplicas ?? 2),
    apiServiceType: a.apiServiceType ?? 'LoadBalancer',
    agentDrainSeconds: a.agentDrainSeconds ?? 120,
    gatewayEnabled: a.gatewayEnabled ?? true,
    nodeCidrs: a.nodeCidrs ?? [],
  };
}

const env = (vars: Record<string, string>): k8s.types.input.core.v1.EnvVar[] =>
  Object.entries(vars)
    .sort(([x], [y]) => x.localeCompare(y))
    .map(([name, value]) => ({ name, value }));

const redisUrlEnv: k8s.types.input.core.v1.EnvVar = {
  name: 'SPACE_REDIS_URL',
  valueFrom: { secretKeyRef: { name: 'space-redis', key: 'url' } },
};

/** Every Kubernetes object of the runtime, in apply order. Pure. */
export function renderRuntimeObjects(a: RuntimeArgs): RenderedObject[] {
  const d = runtimeDefaults(a);
  const ns = d.namespace;
  const image = imageRef(d.imageRepository, a.version);
  const version = { 'app.kubernetes.io/version': a.version };
  const out: RenderedObject[] = [];
  // typed objects go in (excess properties fail to compile); plain data comes out
  const add = (role: string, object: object, after?: string[]) =>
    out.push({ role, object: object as unknown as RenderedObject['object'], ...(after ? { after } : {}) });

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

  const redisUrl =
    a.redis.mode === 'external'
      ? a.redis.url
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

  if (a.redis.mode === 'in-cluster') {
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
                env: [
                  {
                    name: 'REDIS_PASSWORD',
                    valueFrom: { secretKeyRef: { name: 'space-redis', key: 'password' } },
                  },
                ],
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
        volumeClaimTemplates: [
          {
            metadata: { name: 'data' },
            spec: {
              accessModes: ['ReadWriteOnce'],
              ...(a.redis.storageClassName ? { storageClassName: a.redis.storageClassName } : {}),
              resources: { requests: { storage: `${a.redis.storageGiB ?? 10}Gi` } },
            },
          },
        ],
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

  // ---- TLS: one cert-manager Certificate for both hostnames; its Secret is mounted by both services
  const scheme = a.tls ? 'HTTPS' : 'HTTP';
  const tlsMount = a.tls ? [{ name: 'tls', mountPath: TLS_DIR, readOnly: true }] : [];
  const tlsVolume = a.tls ? [{ name: 'tls', secret: { secretName: TLS_SECRET, defaultMode: 0o440 } }] : [];
  if (a.tls) {
    // cert-manager.io/v1 Certificate (cert-manager.io/docs/usage/certificate/): cert-manager keeps
    // the Secret renewed; the services read it at start, so a rollout picks up a renewal
    add('tls-cert', {
      apiVersion: 'cert-manager.io/v1',
      kind: 'Certificate',
      metadata: { name: TLS_SECRET, namespace: ns, labels: labels('tls') },
      spec: {
        secretName: TLS_SECRET,
        dnsNames: [a.tls.apiHostname, a.tls.routerHostname],
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
  const routerUrl = a.router?.publicUrl ?? (a.tls ? `https://${a.tls.routerHostname}` : undefined);
  const publicPort = (port: number) => (a.tls ? { port: 443, targetPort: port } : { port });

  // ---- API
  const apiSel = labels('api');
  const apiDeployment: k8s.types.input.apps.v1.Deployment = {
    apiVersion: 'apps/v1',
    kind: 'Deployment',
    metadata: { name: 'space-api', namespace: ns, labels: { ...apiSel, ...version } },
    spec: {
      // no `replicas`: the HPA owns the count (minReplicas = apiReplicas). A replicas field here
      // would reset the Deployment to it on every `pulumi up`, fighting the autoscaler
      // (kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale/#migrating-deployments-and-statefulsets-to-horizontal-autoscaling)
      selector: { matchLabels: apiSel },
      // a new pod is ready before an old one goes: the API never drops below its replica count
      strategy: { type: 'RollingUpdate', rollingUpdate: { maxUnavailable: 0, maxSurge: 1 } },
      template: {
        metadata: { labels: { ...apiSel, ...version }, annotations: scrapeAnnotations(API_PORT) },
        spec: {
          serviceAccountName: 'space-api',
          automountServiceAccountToken: false,
          terminationGracePeriodSeconds: 30,
          securityContext: { runAsNonRoot: true, runAsUser: 1000, runAsGroup: 1000, fsGroup: 1000 },
          containers: [
            {
              name: 'api',
              image,
              command: [...SERVICE_COMMANDS.api],
              env: [
                ...env(apiEnvironment(a.apiEnv, { tls: !!a.tls, ...(routerUrl ? { routerUrl } : {}) })),
                redisUrlEnv,
              ],
              ports: [{ name: 'http', containerPort: API_PORT }],
              readinessProbe: { httpGet: { path: '/readyz', port: API_PORT, scheme }, periodSeconds: 5 },
              livenessProbe: {
                httpGet: { path: '/healthz', port: API_PORT, scheme },
                periodSeconds: 10,
                failureThreshold: 6,
              },
              resources: { requests: { cpu: '250m', memory: '256Mi' }, limits: { memory: '1Gi' } },
              securityContext: {
                allowPrivilegeEscalation: false,
                readOnlyRootFilesystem: true,
                capabilities: { drop: ['ALL'] },
              },
              volumeMounts: [
                { name: 'signing-key', mountPath: KEY_DIR, readOnly: true },
                { name: 'api-state', mountPath: '/var/lib/space/api' },
                { name: 'tmp', mountPath: '/tmp' },
                ...tlsMount,
              ],
            },
          ],
          volumes: [
            {
              name: 'signing-key',
              secret: { secretName: 'space-signing-key', defaultMode: 0o440 },
            },
            // the bootstrap API key file (see docs/deployment.md "first API key")
            { name: 'api-state', emptyDir: {} },
            { name: 'tmp', emptyDir: {} },
            ...tlsVolume,
          ],
        },
      },
    },
  };
  add('api', apiDeployment);
  const exposure: PublicExposure = { serviceType: d.apiServiceType, ...a.exposure };
  add(
    'api-svc',
    publicService(
      ns,
      'space-api',
      apiSel,
      { ...publicPort(API_PORT), ...(a.apiNodePort ? { nodePort: a.apiNodePort } : {}) },
      exposure,
    ),
  );
  const hpa: k8s.types.input.autoscaling.v2.HorizontalPodAutoscaler = {
    apiVersion: 'autoscaling/v2',
    kind: 'HorizontalPodAutoscaler',
    metadata: { name: 'space-api', namespace: ns, labels: apiSel },
    spec: {
      scaleTargetRef: { apiVersion: 'apps/v1', kind: 'Deployment', name: 'space-api' },
      minReplicas: d.apiReplicas,
      maxReplicas: d.apiMaxReplicas,
      metrics: [
        {
          type: 'Resource',
          resource: { name: 'cpu', target: { type: 'Utilization', averageUtilization: 70 } },
        },
      ],
    },
  };
  add('api-hpa', hpa);
  const pdb: k8s.types.input.policy.v1.PodDisruptionBudget = {
    apiVersion: 'policy/v1',
    kind: 'PodDisruptionBudget',
    metadata: { name: 'space-api', namespace: ns, labels: apiSel },
    spec: { minAvailable: 1, selector: { matchLabels: apiSel } },
  };
  add('api-pdb', pdb);

  // ---- router: the clients' only way to sandboxes; needs Redis and the verify key, nothing else
  const routerSel = labels('router');
  const routerDeployment: k8s.types.input.apps.v1.Deployment = {
    apiVersion: 'apps/v1',
    kind: 'Deployment',
    metadata: { name: 'space-router', namespace: ns, labels: { ...routerSel, ...version } },
    spec: {
      // no `replicas`: the HPA owns the count, as for the API
      selector: { matchLabels: routerSel },
      strategy: { type: 'RollingUpdate', rollingUpdate: { maxUnavailable: 0, maxSurge: 1 } },
      template: {
        metadata: { labels: { ...routerSel, ...version }, annotations: scrapeAnnotations(ROUTER_PORT) },
        spec: {
          serviceAccountName: 'space-router',
          automountServiceAccountToken: false,
          // streams in flight get the grace period to finish before the pod goes
          terminationGracePeriodSeconds: 60,
          securityContext: { runAsNonRoot: true, runAsUser: 1000, runAsGroup: 1000, fsGroup: 1000 },
          containers: [
            {
              name: 'router',
              image,
              command: [...SERVICE_COMMANDS.router],
              env: [...env(routerEnvironment({ tls: !!a.tls })), redisUrlEnv],
              ports: [{ name: 'http', containerPort: ROUTER_PORT }],
              readinessProbe: { httpGet: { path: '/readyz', port: ROUTER_PORT, scheme }, periodSeconds: 5 },
              livenessProbe: {
                httpGet: { path: '/healthz', port: ROUTER_PORT, scheme },
                periodSeconds: 10,
                failureThreshold: 6,
              },
              resources: { requests: { cpu: '250m', memory: '256Mi' }, limits: { memory: '1Gi' } },
              securityContext: {
                allowPrivilegeEscalation: false,
                readOnlyRootFilesystem: true,
                capabilities: { drop: ['ALL'] },
              },
              volumeMounts: [
                { name: 'verify-key', mountPath: KEY_DIR, readOnly: true },
                { name: 'tmp', mountPath: '/tmp' },
                ...tlsMount,
              ],
            },
          ],
          volumes: [
            { name: 'verify-key', configMap: { name: 'space-verify-key' } },
            { name: 'tmp', emptyDir: {} },
            ...tlsVolume,
          ],
        },
      },
    },
  };
  add('router', routerDeployment);
  add(
    'router-svc',
    publicService(
      ns,
      'space-router',
      routerSel,
      { ...publicPort(ROUTER_PORT), ...(a.router?.nodePort ? { nodePort: a.router.nodePort } : {}) },
      exposure,
    ),
  );
  add('router-hpa', {
    ...hpa,
    metadata: { name: 'space-router', namespace: ns, labels: routerSel },
    spec: {
      ...hpa.spec,
      scaleTargetRef: { apiVersion: 'apps/v1', kind: 'Deployment', name: 'space-router' },
      minReplicas: a.router?.replicas ?? d.apiReplicas,
      maxReplicas: Math.max(a.router?.maxReplicas ?? d.apiMaxReplicas, a.router?.replicas ?? d.apiReplicas),
    },
  } satisfies k8s.types.input.autoscaling.v2.HorizontalPodAutoscaler);
  add('router-pdb', {
    ...pdb,
    metadata: { name: 'space-router', namespace: ns, labels: routerSel },
    spec: { minAvailable: 1, selector: { matchLabels: routerSel } },
  } satisfies k8s.types.input.policy.v1.PodDisruptionBudget);

  // ---- agents: one DaemonSet per pool
  const tolerations = [
    // pools may be tainted so that nothing else lands there; the agent goes everywhere it is asked to
    { key: POOL_LABEL, operator: 'Exists', effect: 'NoSchedule' },
    ...(a.agentTolerations ?? []),
  ];
  // the gateway of each pool first: on a version bump the agents roll only after their gateways
  // (a restarted gateway forgets registrations; an agent re-registers its sandboxes when it starts)
  for (const pool of a.nodePools) {
    if (d.gatewayEnabled) add(`gateway-${pool.name}`, gatewayDaemonSet(a, pool, image, tolerations));
    add(
      `agent-${pool.name}`,
      agentDaemonSet(a, pool, image, tolerations),
      d.gatewayEnabled ? [`gateway-${pool.name}`] : undefined,
    );
  }

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
      podSelector: { matchLabels: apiSel },
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
      podSelector: { matchLabels: routerSel },
      policyTypes: ['Ingress'],
      ingress: [{ ports: [{ protocol: 'TCP', port: ROUTER_PORT }] }],
    },
  };
  add('netpol-router', routerIngress);
  if (a.redis.mode === 'in-cluster') {
    const redisIngress: k8s.types.input.networking.v1.NetworkPolicy = {
      apiVersion: 'networking.k8s.io/v1',
      kind: 'NetworkPolicy',
      metadata: { name: 'space-redis-ingress', namespace: ns, labels: labels('policy') },
      spec: {
        podSelector: { matchLabels: labels('redis') },
        policyTypes: ['Ingress'],
        ingress: [
          {
            from: [
              { podSelector: { matchLabels: apiSel } },
              { podSelector: { matchLabels: routerSel } },
              // agents run on the host network: their packets carry node addresses
              ...d.nodeCidrs.map((cidr) => ({ ipBlock: { cidr } })),
            ],
            ports: [{ protocol: 'TCP', port: REDIS_PORT }],
          },
        ],
      },
    };
    add('netpol-redis', redisIngress);
  }

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
  return out;
}

/** A client-facing Service (`space-api`, `space-router`) with the cloud's exposure. Pure. */
export function publicService(
  namespace: string,
  name: string,
  selector: Record<string, string>,
  svc: PublicServiceArgs,
  exposure: PublicExposure,
): k8s.types.input.core.v1.Service {
  const type = exposure.serviceType ?? 'LoadBalancer';
  const lb = type === 'LoadBalancer';
  return {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: {
      name,
      namespace,
      labels: selector,
      ...(lb && exposure.annotations ? { annotations: { ...exposure.annotations } } : {}),
    },
    spec: {
      type,
      selector,
      ...(lb && exposure.loadBalancerSourceRanges?.length
        ? { loadBalancerSourceRanges: [...exposure.loadBalancerSourceRanges] }
        : {}),
      ports: [
        {
          name: 'http',
          port: svc.port,
          targetPort: svc.targetPort ?? svc.port,
          protocol: 'TCP',
          ...(type === 'NodePort' && svc.nodePort ? { nodePort: svc.nodePort } : {}),
        },
      ],
    },
  };
}

function agentDaemonSet(
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
      minReadySeconds: 10,
      template: {
        metadata: {
          labels: { ...sel, 'app.kubernetes.io/version': a.version },
          // /metrics is on the data-plane port
          annotations: scrapeAnnotations(AGENT_PORT),
        },
        spec: {
          serviceAccountName: 'space-agent',
          automountServiceAccountToken: false,
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
 * The gateway of `pool`: on exactly the agent's nodes (same selector and tolerations), host network,
 * root (its 0600 control socket in the host directory it shares with the agent), no capabilities.
 * An init container (NET_ADMIN) first installs the host firewall that closes its ports to anything
 * but sandbox interfaces: NetworkPolicies do not apply to host-network pods.
 */
function gatewayDaemonSet(
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
      minReadySeconds: 5,
      template: {
        metadata: { labels: { ...sel, ...version }, annotations: scrapeAnnotations(GATEWAY_METRICS_PORT) },
        spec: {
          serviceAccountName: 'space-gateway',
          automountServiceAccountToken: false,
          nodeSelector: { [POOL_LABEL]: pool.name },
          tolerations,
          priorityClassName: 'system-node-critical',
          // sandbox traffic reaches it through the node's nftables redirect
          hostNetwork: true,
          dnsPolicy: 'ClusterFirstWithHostNet',
          terminationGracePeriodSeconds: 30,
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
  HorizontalPodAutoscaler: k8s.autoscaling.v2.HorizontalPodAutoscaler,
  PodDisruptionBudget: k8s.policy.v1.PodDisruptionBudget,
  NetworkPolicy: k8s.networking.v1.NetworkPolicy,
} as const;

/** A cert-manager resource (no typed class in @pulumi/kubernetes): a CustomResource of its kind. */
class CertManagerResource extends k8s.apiextensions.CustomResource {
  constructor(name: string, args: Record<string, unknown>, opts?: pulumi.CustomResourceOptions) {
    super(name, { apiVersion: 'cert-manager.io/v1', kind: 'Certificate', ...args } as never, opts);
  }
}

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

/** Creates every object of {@link renderRuntimeObjects} as a child of `parent`, in order. */
export function createRuntime(
  parent: pulumi.ComponentResource,
  name: string,
  args: RuntimeArgs,
): Record<string, pulumi.CustomResource> {
  const created: Record<string, pulumi.CustomResource> = {};
  let namespace: pulumi.CustomResource | undefined;
  for (const { role, object, after } of renderRuntimeObjects(args)) {
    const Ctor = (
      object.kind === 'Certificate'
        ? CertManagerResource
        : RESOURCE_CLASSES[object.kind as keyof typeof RESOURCE_CLASSES]
    ) as ResourceCtor | undefined;
    if (!Ctor) throw new pulumi.ResourceError(`no resource class for kind ${object.kind}`, parent);
    const { apiVersion: _v, kind: _k, ...body } = object;
    const r = new Ctor(`${name}-${role}`, body, {
      parent,
      dependsOn: [...(namespace ? [namespace] : []), ...(after ?? []).map((r) => created[r]!)],
      // the Secret's data must not show in plain text in the state or the CLI
      ...(object.kind === 'Secret' ? { additionalSecretOutputs: ['data', 'stringData'] } : {}),
    });
    if (object.kind === 'Namespace') namespace = r;
    created[role] = r;
  }
  return created;
}
