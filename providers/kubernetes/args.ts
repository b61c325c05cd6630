/**
 * The arguments of `space:kubernetes:Runtime` and what every per-service renderer shares: the
 * defaults, the labels, the env helpers, the rendered-object shape and the render context (image,
 * namespace, TLS mounts, the client-facing exposure).
 */

import type * as k8s from '@pulumi/kubernetes';
import type * as pulumi from '@pulumi/pulumi';
import type { NodePool } from '../node-pool.ts';
import {
  DEFAULT_AGENT_DRAIN_SECONDS,
  DEFAULT_IMAGE_REPOSITORY,
  imageRef,
  TLS_DIR,
} from '../runtime-settings.ts';
import type { K8sBackupArgs } from './backup.ts';

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
      /**
       * Access mode of the volume (one Redis pod mounts it either way). Default `ReadWriteOnce`;
       * `ReadWriteMany` where the class is documented for that mode only (CKS `shared-vast`).
       */
      readonly accessMode?: 'ReadWriteOnce' | 'ReadWriteMany';
      /** Redis image (its `redis-server`, `redis-sentinel`, `redis-cli`, `sh`). Default `redis:7.4-alpine` (Docker Hub). */
      readonly image?: string;
      /**
       * Failover through Redis Sentinel (redis-sentinel.ts): `servers` data servers (one primary,
       * the rest replicas; 2-7) in the `space-redis` StatefulSet and `sentinels` sentinels (3, 5
       * or 7) in `space-redis-sentinel`, each spread across nodes; services get
       * `redis-sentinel://…@space-redis-sentinel.<ns>.svc:26379/space`. The password must then be
       * 16-128 of `A-Za-z0-9._~-` (it goes into sentinel.conf and the URL as it is). Absent: one
       * Redis, no failover.
       */
      readonly sentinel?: { readonly servers: number; readonly sentinels: number };
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
  /**
   * Domain of the servers in sandboxes (`<port>-<id>.<it>`, pointed at the router's load balancer
   * by a wildcard record): the certificate also carries `*.<it>`, which an ACME issuer can only
   * prove over DNS-01. Absent: no wildcard.
   */
  readonly sandboxDomain?: string;
}

/**
 * Registry credentials the kubelet pulls the SPACE image with (`imagePullSecrets` of every pod that
 * runs it): an existing `kubernetes.io/dockerconfigjson` Secret in the namespace, or a user name and
 * password (a Pulumi secret) the component turns into one ({@link IMAGE_PULL_SECRET}) for the
 * registry of the image repository.
 */
export type ImagePullArgs =
  | { readonly secretName: string }
  | { readonly username: string; readonly password: Input<string> };

/** Name of the `kubernetes.io/dockerconfigjson` Secret the component makes from a user name and password. */
export const IMAGE_PULL_SECRET = 'space-image-pull';

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
   * The nodes' address blocks: the gateways never dial them (`SPACE_GATEWAY_NODE_CIDRS`). Default
   * none. (Redis does not admit by address: see redis.ts `addRedisPolicy`.)
   */
  readonly nodeCidrs?: readonly string[];
  /** Tolerations added to agent (and gateway) pods, e.g. a cloud's taints on CPU nodes. Default none. */
  readonly agentTolerations?: readonly k8s.types.input.core.v1.Toleration[];
  /** Extra API settings (`SPACE_*`, checked by the stack config). Default none. */
  readonly apiEnv?: Readonly<Record<string, string>>;
  /** Extra agent settings (`SPACE_*`). Default none. */
  readonly agentEnv?: Readonly<Record<string, string>>;
  /** How pods authenticate to the image's registry. Default none: the image is public. */
  readonly imagePull?: ImagePullArgs;
  /**
   * Make Prometheus Operator objects (PodMonitors and a PrometheusRule; the CRDs must exist),
   * labelled with `labels` besides SPACE's own. Default none: pods carry scrape annotations only.
   */
  readonly prometheusOperator?: { readonly labels?: Readonly<Record<string, string>> };
  /** Scheduled Redis backups (`space:backup`): the `space-backup` CronJob (backup.ts). Default none. */
  readonly backup?: K8sBackupArgs;
}

/** One rendered object with the Pulumi logical-name suffix it gets (`${name}-${role}`). */
export interface RenderedObject {
  readonly role: string;
  readonly object: { readonly apiVersion: string; readonly kind: string } & Record<string, unknown>;
  /** Roles this object is applied after (Pulumi `dependsOn`). */
  readonly after?: readonly string[];
  /**
   * How long Pulumi may wait for the object to be ready after a create or an update, s (its
   * `customTimeouts`). Default: the provider's (10 minutes for workloads).
   */
  readonly timeoutSeconds?: number;
}

/** The label naming a pod's SPACE component (`api`, `router`, `agent`, `gateway`, `redis`, …). */
export const COMPONENT_LABEL = 'app.kubernetes.io/component';
/** The labels of every object of `component` (plus `extra`, e.g. the pool). */
export const labels = (component: string, extra: Record<string, string> = {}) => ({
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
    agentDrainSeconds: a.agentDrainSeconds ?? DEFAULT_AGENT_DRAIN_SECONDS,
    gatewayEnabled: a.gatewayEnabled ?? true,
    nodeCidrs: a.nodeCidrs ?? [],
  };
}

/** `vars` as container env entries, sorted by name (a stable order: no diff from map order). */
export const env = (vars: Record<string, string>): k8s.types.input.core.v1.EnvVar[] =>
  Object.entries(vars)
    .sort(([x], [y]) => x.localeCompare(y))
    .map(([name, value]) => ({ name, value }));

/** `SPACE_REDIS_URL` from the `space-redis` Secret (it may carry a password). */
export const redisUrlEnv: k8s.types.input.core.v1.EnvVar = {
  name: 'SPACE_REDIS_URL',
  valueFrom: { secretKeyRef: { name: 'space-redis', key: 'url' } },
};

/**
 * Topology spread of the pods `selector` matches: at most one more on any node than on another
 * (`kubernetes.io/hostname`, `DoNotSchedule`), and across zones where the nodes carry
 * `topology.kubernetes.io/zone` (`ScheduleAnyway`: a one-zone cluster still schedules). Unlike a
 * required pod anti-affinity this never leaves a pod pending on a cluster with fewer nodes than
 * pods (it evens them out instead), and `nodeTaintsPolicy: Honor` leaves out nodes the pods cannot
 * run on (tainted or cordoned), which would otherwise count as empty domains and block scheduling
 * (kubernetes.io/docs/concepts/scheduling-eviction/topology-spread-constraints/; the policy
 * fields are beta and on by default since Kubernetes 1.27). Pure.
 */
export function spreadAcrossNodes(
  selector: Record<string, string>,
): k8s.types.input.core.v1.TopologySpreadConstraint[] {
  const labelSelector = { matchLabels: { ...selector } };
  return [
    {
      maxSkew: 1,
      topologyKey: 'kubernetes.io/hostname',
      whenUnsatisfiable: 'DoNotSchedule',
      nodeTaintsPolicy: 'Honor',
      labelSelector,
    },
    {
      maxSkew: 1,
      topologyKey: 'topology.kubernetes.io/zone',
      whenUnsatisfiable: 'ScheduleAnyway',
      nodeTaintsPolicy: 'Honor',
      labelSelector,
    },
  ];
}

/** What the per-service renderers share for one render (derived once from {@link RuntimeArgs}). */
export interface RenderContext {
  readonly a: RuntimeArgs;
  readonly d: ReturnType<typeof runtimeDefaults>;
  /** The namespace. */
  readonly ns: string;
  /** `repository:version`, the one image. */
  readonly image: string;
  /** `app.kubernetes.io/version` of the workloads. */
  readonly version: { readonly 'app.kubernetes.io/version': string };
  /** Probe scheme of the client-facing services: HTTPS with {@link RuntimeArgs.tls}. */
  readonly scheme: 'HTTP' | 'HTTPS';
  /** The TLS Secret's mount and volume (empty without TLS). */
  readonly tlsMount: k8s.types.input.core.v1.VolumeMount[];
  readonly tlsVolume: k8s.types.input.core.v1.Volume[];
  /** The cloud's exposure of both client-facing Services. */
  readonly exposure: PublicExposure;
}

/** The {@link RenderContext} of `a`. Pure. */
export function renderContext(a: RuntimeArgs): RenderContext {
  const d = runtimeDefaults(a);
  return {
    a,
    d,
    ns: d.namespace,
    image: imageRef(d.imageRepository, a.version),
    version: { 'app.kubernetes.io/version': a.version },
    scheme: a.tls ? 'HTTPS' : 'HTTP',
    tlsMount: a.tls ? [{ name: 'tls', mountPath: TLS_DIR, readOnly: true }] : [],
    tlsVolume: a.tls ? [{ name: 'tls', secret: { secretName: TLS_SECRET, defaultMode: 0o440 } }] : [],
    exposure: { serviceType: d.apiServiceType, ...a.exposure },
  };
}

/**
 * What every pod running the SPACE image adds to its spec for `pull` ({@link RuntimeArgs.imagePull}):
 * `{ imagePullSecrets: [{ name }] }` naming the given Secret or {@link IMAGE_PULL_SECRET}, else
 * nothing (no empty field). Pure.
 */
export function pullSecretsOf(pull: ImagePullArgs | undefined): {
  imagePullSecrets?: k8s.types.input.core.v1.LocalObjectReference[];
} {
  if (!pull) return {};
  return { imagePullSecrets: [{ name: 'secretName' in pull ? pull.secretName : IMAGE_PULL_SECRET }] };
}

/**
 * Collects rendered objects in apply order: typed Kubernetes inputs go in (an excess property fails
 * to compile), plain data comes out.
 */
export class ObjectList {
  /** What was added, in order. */
  readonly out: RenderedObject[] = [];
  /**
   * Adds `object` as role `role` (Pulumi name `${name}-${role}`), applied after the roles in
   * `after`, awaited for at most `timeoutSeconds` (see {@link RenderedObject}).
   */
  add(role: string, object: object, after?: readonly string[], timeoutSeconds?: number): void {
    this.out.push({
      role,
      object: object as unknown as RenderedObject['object'],
      ...(after?.length ? { after } : {}),
      ...(timeoutSeconds ? { timeoutSeconds } : {}),
    });
  }
}
