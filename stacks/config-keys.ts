/**
 * Every `space:*` stack config key, declared once: type, default (as the docs write it), secrecy,
 * the clouds it applies to, and its meaning. config.ts reads and validates them; the deployment
 * docs carry the same table (a test keeps the two in step).
 */
import type { Cloud } from '../providers/catalogue.ts';

/** The type of a config value as `pulumi config set` stores it (objects and arrays as JSON). */
export type KeyType = 'string' | 'boolean' | 'integer' | 'array' | 'object';

/** One declared config key. */
export interface KeySpec {
  readonly type: KeyType;
  /** Default as written in the docs; undefined = required where `required` says, else unset. */
  readonly default?: string;
  readonly secret?: boolean;
  /** Clouds the key applies to (all when absent). */
  readonly clouds?: readonly Cloud[];
  readonly doc: string;
}

/** Every `space:*` key (without the `space:` prefix). */
export const CONFIG_KEYS = {
  cloud: { type: 'string', doc: 'Target: `akamai`, `coreweave`, `crusoe` or `kind`. Required.' },
  mode: {
    type: 'string',
    default: 'akamai: `vm`; coreweave, kind: `kubernetes`; crusoe: `vm`',
    doc: '`kubernetes` (the Kubernetes component on LKE/CKS/kind) or `vm` (cloud-init + systemd).',
  },
  version: { type: 'string', doc: 'SPACE version: the tag of the image every service runs. Required.' },
  imageRepository: {
    type: 'string',
    doc: 'Image repository your image is pushed to (one image, one command per service). Required: no SPACE image is published; build it with `npm run image` and push it, or set `space:imageBuild`.',
  },
  imageBuild: {
    type: 'boolean',
    default: 'false',
    doc: '`pulumi up` builds the image (`scripts/image.sh`, buildah, root) on the machine running Pulumi and pushes it as `imageRepository:version` (`buildah push`; log in first with `buildah login`) before anything that runs it. False: the tag must already be pushed.',
  },
  imageVmms: {
    type: 'array',
    default: '`["gvisor", "qemu"]` (what every build has, an offline one too)',
    doc: 'The drivers the image can run: its `dev.space.vmms` label (`buildah inspect`). A node pool whose driver is not listed is refused at preview; with `space:imageBuild` the build must produce them (`--require`: an online build, checksums pinned).',
  },
  imagePullUsername: {
    type: 'string',
    doc: 'User name for the image’s registry (the host of `imageRepository`; Docker Hub when it names none), with `imagePullPassword`. Kubernetes: the stack makes the `kubernetes.io/dockerconfigjson` Secret `space-image-pull` every SPACE pod pulls with. VMs: podman’s auth file `/etc/containers/auth.json` (mode 0600), named by every pull. Unset: the image is pulled anonymously.',
  },
  imagePullPassword: {
    type: 'string',
    secret: true,
    doc: 'Password or token for `imagePullUsername` (e.g. a GitHub token with `read:packages` for ghcr.io).',
  },
  imagePullSecretName: {
    type: 'string',
    clouds: ['akamai', 'coreweave', 'kind'],
    doc: 'Instead of `imagePullUsername`: an existing `kubernetes.io/dockerconfigjson` Secret in the `space` namespace every SPACE pod pulls with (`kubernetes` mode).',
  },
  region: {
    type: 'string',
    clouds: ['akamai', 'crusoe'],
    doc: 'Linode region (e.g. `us-ord`) or Crusoe location (e.g. `us-east1-a`). Required there.',
  },
  nodePools: {
    type: 'array',
    default: 'one pool `default` of the cloud’s default type and driver',
    doc: 'Node pools: `[{ name, driver, instanceType, count, labels, allowUnverifiedKvm }]` (see "Node pools").',
  },
  clientCidrs: {
    type: 'array',
    default: '`["0.0.0.0/0"]`',
    doc: 'Sources allowed to reach the API and the router (the data plane). Nothing else is open: agents, Redis and gateways stay private.',
  },
  sshCidrs: {
    type: 'array',
    default: '`[]` (SSH closed)',
    clouds: ['akamai', 'crusoe'],
    doc: 'Sources allowed to SSH (22) to VMs.',
  },
  sshPublicKey: {
    type: 'string',
    clouds: ['akamai', 'crusoe'],
    doc: 'OpenSSH public key installed for root. Required on Crusoe (its API requires one).',
  },
  privateCidr: {
    type: 'string',
    default: '`10.77.128.0/24`',
    clouds: ['akamai', 'crusoe'],
    doc: 'CIDR of the VPC subnet the nodes share (must not overlap the agents’ `SPACE_NETWORK_POOL`).',
  },
  controlInstanceType: {
    type: 'string',
    default: 'akamai `g6-dedicated-2`, crusoe `c1a.2x`',
    clouds: ['akamai', 'crusoe'],
    doc: 'Instance type of the control VM (API + Redis) in `vm` mode.',
  },
  gatewayEnabled: {
    type: 'boolean',
    default: 'true',
    doc: 'Run the egress gateway beside every agent. `false`: agents get no gateway socket, so sandboxes have **no network egress at all**.',
  },
  gatewayCaCertificate: {
    type: 'string',
    clouds: ['akamai', 'coreweave', 'kind'],
    doc: 'PEM certificate of the per-deployment CA (ECDSA P-256, CA:TRUE) the gateway signs intercepted leaves with; sandboxes trust it. Required in `kubernetes` mode with the gateway (see "Gateway CA"); `vm` mode makes one per node.',
  },
  gatewayCaKey: {
    type: 'string',
    secret: true,
    clouds: ['akamai', 'coreweave', 'kind'],
    doc: 'PEM private key of `gatewayCaCertificate`; only the gateway pods mount it.',
  },
  gatewayUpstreamDns: {
    type: 'array',
    default: 'the gateway’s (`["1.1.1.1:53"]`)',
    doc: 'Resolvers the gateway itself asks, `ip:port` each (`SPACE_GATEWAY_UPSTREAM_DNS`).',
  },
  gatewayDenyCidrs: {
    type: 'array',
    default: 'the gateway’s (RFC 1918, CGNAT, ULA, documentation ranges…)',
    doc: 'CIDRs the gateway never dials nor answers (`SPACE_GATEWAY_DENY_CIDRS`; loopback, link-local and multicast are always added). Must cover the nodes’ network and the sandbox pool.',
  },
  gatewayEnv: {
    type: 'object',
    default: '`{}`',
    doc: 'Extra gateway settings (`SPACE_GATEWAY_*`, `SPACE_LOG_LEVEL`), e.g. `SPACE_GATEWAY_DNS_QPS`.',
  },
  apiReplicas: { type: 'integer', default: '2', doc: 'API replicas (HPA minimum) in `kubernetes` mode.' },
  agentDrainSeconds: {
    type: 'integer',
    default: '120',
    doc: 'Drain budget of an agent, s; the pod grace period is this + 30 s.',
  },
  k8sVersion: {
    type: 'string',
    default: '`1.33`',
    clouds: ['akamai'],
    doc: 'LKE Kubernetes version (`lke` mode).',
  },
  kubeconfig: {
    type: 'string',
    secret: true,
    clouds: ['coreweave', 'kind'],
    doc: 'Kubeconfig of the cluster. Required on CoreWeave; on kind the default kubeconfig is used when unset.',
  },
  kubeContext: {
    type: 'string',
    default: '`kind-space`',
    clouds: ['kind'],
    doc: 'Context of the kubeconfig to use.',
  },
  signingKey: {
    type: 'string',
    secret: true,
    doc: 'Ed25519 private key, PKCS#8 PEM (`openssl genpkey -algorithm ed25519`). Required in `kubernetes` mode. `vm` mode: one control VM makes its own; several (`controlPlane.replicas` 3 or 5) share this one, or, unset, one derived from `bootstrapApiKey` (HKDF-SHA256; then whoever holds that key could also sign session tokens, so set your own for production).',
  },
  redisPassword: {
    type: 'string',
    secret: true,
    doc: 'Password of Redis, 16 characters or more. `kubernetes` mode: the in-cluster Redis (its only gate: every pod may reach its port); required unless `redisUrl` is set. `vm` mode: the control VM’s Redis (16-128 of `A-Za-z0-9._~-`); default: derived from `bootstrapApiKey` (HKDF-SHA256).',
  },
  redisUrl: {
    type: 'string',
    secret: true,
    doc: 'External Redis URL (`kubernetes` mode): `redis://`, `rediss://` or `redis-sentinel://h1:26379,…/<primary>` (an HA Redis of your own), checked at preview; then no Redis is deployed.',
  },
  redis: {
    type: 'object',
    default:
      'akamai (LKE), coreweave: `{ "mode": "sentinel", "servers": 3, "sentinels": 3 }`; kind: `{ "mode": "single" }`',
    clouds: ['akamai', 'coreweave', 'kind'],
    doc: '`kubernetes` mode, in-cluster Redis: `sentinel` (a primary and `servers` − 1 replicas, 2-7, and `sentinels` Redis Sentinels, 3, 5 or 7, each spread across nodes; services get `redis-sentinel://…`; failover automatic; `redisPassword` then 16-128 of `A-Za-z0-9._~-`) or `single` (one Redis, no failover). Not with `redisUrl`. See "Redis: failover".',
  },
  controlPlane: {
    type: 'object',
    default: '`{ "replicas": 1 }` (the stack files here set 3)',
    clouds: ['akamai', 'crusoe'],
    doc: '`vm` mode: `replicas` control VMs, 1, 3 or 5. With 3 or 5 each runs a Redis server (one primary, the others replicas) and a Sentinel, the API and the router; the load balancer (Akamai) spreads clients over them; nodes get `redis-sentinel://…`. Fixed when the stack is made (see "Redis: failover").',
  },
  redisStorageClass: {
    type: 'string',
    default: 'coreweave: `shared-vast` (`ReadWriteMany`); elsewhere the cluster’s default class',
    doc: 'StorageClass of the Redis volume (`kubernetes` mode; `ReadWriteOnce` when set).',
  },
  backup: {
    type: 'object',
    default: 'unset: no scheduled backup (the preview says so)',
    doc: 'Scheduled Redis backups to an S3-compatible store (`space backup run`): `{ "bucket", "endpoint", "region", "prefix", "schedule", "keepLast", "keepDays", "accessKeyId", "deployment" }`. `bucket` is required; `endpoint` (e.g. `https://us-ord-1.linodeobjects.com`) unset means AWS S3; `region` default `us-east-1`; `prefix` default `space-backups/`; `schedule` a UTC cron `MIN HOUR * * DOW` (default `17 3 * * *`, daily); retention `keepLast` (default 14) and `keepDays` (default 0, off); `deployment` (the folder in the bucket) default the stack name. `vm` mode: a systemd timer on the control VM (set at its creation); `kubernetes` mode: the CronJob `space-backup`.',
  },
  backupSecretAccessKey: {
    type: 'string',
    secret: true,
    doc: 'Secret key of `space:backup.accessKeyId` (set both or neither). Neither: the SDK’s own credentials (Kubernetes: none unless the pod has a cloud identity).',
  },
  apiTlsCertificate: {
    type: 'string',
    clouds: ['akamai'],
    doc: 'PEM certificate for HTTPS on the API NodeBalancer (`vm` mode); with `apiTlsKey`. Unset: plain TCP.',
  },
  apiTlsKey: {
    type: 'string',
    secret: true,
    clouds: ['akamai'],
    doc: 'PEM private key for `apiTlsCertificate`.',
  },
  routerUrl: {
    type: 'string',
    default:
      'kind: `http://127.0.0.1:8082`; akamai `vm`: the NodeBalancer’s router port (with `tlsHostnames`: `https://<router>:8443`); kubernetes with `tlsHostnames`: `https://<router>`; crusoe with `tlsHostnames`: `https://<router>:8082`',
    doc: 'Public base URL of the router (`SPACE_ROUTER_URL`): the data-plane URL the API hands to clients. Required where no default applies (coreweave and akamai `kubernetes` without `tlsHostnames`, crusoe without `tlsHostnames`).',
  },
  tlsIssuer: {
    type: 'string',
    clouds: ['akamai', 'coreweave', 'kind'],
    doc: 'cert-manager ClusterIssuer that signs the API and router certificate (`kubernetes` mode; cert-manager installed by the operator). With `tlsHostnames`. Unset: plain HTTP.',
  },
  tlsHostnames: {
    type: 'object',
    doc: '`{ "api": "<dns name>", "router": "<dns name>", "sandboxes"?: "<dns name>" }`: the names clients use and the certificate carries; `sandboxes` = the domain of servers in sandboxes (`<port>-<id>.<sandboxes>`, a wildcard DNS record to the router; the certificate carries `*.<sandboxes>`: DNS-01 issuers only, not on Crusoe). Kubernetes: with `tlsIssuer`, point them at the `space-api` and `space-router` load balancers; Akamai `vm`: the names on `apiTlsCertificate`, pointed at the NodeBalancer; Crusoe: the control VM gets the certificate from an ACME CA (`acmeEmail`), point both at its address (output `controlPublicIp`).',
  },
  acmeEmail: {
    type: 'string',
    clouds: ['crusoe'],
    doc: 'Account e-mail for the ACME CA that issues the control VM’s certificate (certbot, HTTP-01: port 80 is opened to all while `tlsHostnames` is set). Required with `tlsHostnames` on Crusoe.',
  },
  acmeServer: {
    type: 'string',
    default: 'Let’s Encrypt production (`https://acme-v02.api.letsencrypt.org/directory`)',
    clouds: ['crusoe'],
    doc: 'ACME directory URL (e.g. Let’s Encrypt staging while testing).',
  },
  bootstrapApiKey: {
    type: 'string',
    secret: true,
    clouds: ['akamai', 'crusoe'],
    doc: 'An API key the deployment makes for itself (`space_` + at least 32 letters or digits: `echo space_$(openssl rand -hex 24)`): the API imports its SHA-256 as an admin key, and every `pulumi up` writes the VMs’ configuration through it (`space:VmConfig`). Required in `vm` mode; use it as your first API key too.',
  },
  lkeFirewallToken: {
    type: 'string',
    secret: true,
    clouds: ['akamai'],
    doc: 'Linode API token (Firewalls read/write, Linodes read-only) the `space-lke-firewall` DaemonSet uses to attach every LKE node, new ones included, to the nodes’ Cloud Firewall. Required in `kubernetes` mode on Akamai.',
  },
  nodeCidrs: {
    type: 'array',
    default: 'kind `["172.16.0.0/12"]`, LKE `["192.168.128.0/17"]`',
    clouds: ['akamai', 'coreweave', 'kind'],
    doc: 'Node address blocks (`kubernetes` mode): the gateways never dial them (`SPACE_GATEWAY_NODE_CIDRS`), and `gatewayDenyCidrs` must cover them. Required on CoreWeave (the CKS VPC host prefix).',
  },
  nodeTolerations: {
    type: 'array',
    default: 'CoreWeave: `[]`',
    clouds: ['coreweave'],
    doc: 'Extra Kubernetes tolerations for the agent pods (e.g. taints of CPU node pools).',
  },
  crusoeProjectId: { type: 'string', clouds: ['crusoe'], doc: 'Crusoe project id. Required on Crusoe.' },
  crusoeVpcNetworkId: {
    type: 'string',
    clouds: ['crusoe'],
    doc: 'Existing Crusoe VPC network the subnet is made in. Required on Crusoe.',
  },
  crusoeImage: {
    type: 'string',
    default: '`ubuntu22.04:latest`',
    clouds: ['crusoe'],
    doc: 'Crusoe VM image (22.04+ for nested virtualisation).',
  },
  prometheusOperator: {
    type: 'boolean',
    default: 'false',
    clouds: ['akamai', 'coreweave', 'kind'],
    doc: '`kubernetes` mode: also make Prometheus Operator objects (`monitoring.coreos.com/v1`; the CRDs must be installed, e.g. by kube-prometheus-stack): a PodMonitor per service and the PrometheusRule `space-alerts` (see "Monitoring").',
  },
  prometheusOperatorLabels: {
    type: 'object',
    default: '`{}`',
    clouds: ['akamai', 'coreweave', 'kind'],
    doc: 'Labels added to those objects, for a Prometheus that selects by label (kube-prometheus-stack: `{ "release": "<its release name>" }`).',
  },
  apiEnv: {
    type: 'object',
    default: '`{}`',
    doc: 'Extra API settings (`SPACE_*` from README.md), e.g. `SPACE_LOG_LEVEL`, and OpenTelemetry’s `OTEL_*` (e.g. `OTEL_EXPORTER_OTLP_ENDPOINT` turns tracing on; in `kubernetes` mode the router gets the same `OTEL_*`).',
  },
  agentEnv: {
    type: 'object',
    default: '`{}`',
    doc: 'Extra agent settings (`SPACE_*`), e.g. `SPACE_WARM_POOL_SIZE`, and OpenTelemetry’s `OTEL_*`.',
  },
} as const satisfies Record<string, KeySpec>;

/** A declared key name. */
export type ConfigKey = keyof typeof CONFIG_KEYS;
