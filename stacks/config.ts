/**
 * Stack configuration: every `space:*` key declared once (type, default, secret, meaning, clouds),
 * read from Pulumi config, validated all at once (every problem with its key, in one error thrown
 * before any resource exists), and frozen. docs/deployment.md has the same table; a test keeps
 * the two in step.
 */
import * as pulumi from '@pulumi/pulumi';
import { CLOUDS, type Cloud, instanceType } from '../providers/catalogue.ts';
import { cloudProfiles, type DeployMode, parseNodePools } from '../providers/node-pool.ts';
import { checkEnvOverrides, DEFAULT_IMAGE_REPOSITORY } from '../providers/runtime-settings.ts';
import type { StackConfig } from '../providers/stack-config.ts';
import { LETS_ENCRYPT_DIRECTORY } from '../providers/systemd/cloud-init.ts';
import { agentSettings } from '../runtime/agent/config.ts';
import { isIPv4, isIPv4Cidr, isIPv6NoZone } from '../runtime/core/net-address.ts';
import { buildDenySet, type Cidr, parseCidr } from '../runtime/gateway/addresses.ts';
import { caFromPem } from '../runtime/gateway/ca.ts';

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
    default: DEFAULT_IMAGE_REPOSITORY,
    doc: 'Image repository (one image, one command per service).',
  },
  imageBuild: {
    type: 'boolean',
    default: 'false',
    doc: '`pulumi up` builds the image (`scripts/image.sh`, buildah, root) on the machine running Pulumi and pushes it as `imageRepository:version` (`buildah push`; log in first with `buildah login`) before anything that runs it. False: the tag must already be pushed.',
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
    doc: 'Ed25519 private key, PKCS#8 PEM (`openssl genpkey -algorithm ed25519`). Required in `kubernetes` mode; `vm` mode makes its own on the control VM.',
  },
  redisPassword: {
    type: 'string',
    secret: true,
    doc: 'Password of the in-cluster Redis. Required in `kubernetes` mode unless `redisUrl` is set.',
  },
  redisUrl: {
    type: 'string',
    secret: true,
    doc: 'External Redis URL (`kubernetes` mode); then no Redis is deployed.',
  },
  redisStorageClass: {
    type: 'string',
    doc: 'StorageClass of the Redis volume (default: the cluster’s default).',
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
    doc: '`{ "api": "<dns name>", "router": "<dns name>" }`: the names clients use and the certificate carries. Kubernetes: with `tlsIssuer`, point them at the `space-api` and `space-router` load balancers; Akamai `vm`: the names on `apiTlsCertificate`, pointed at the NodeBalancer; Crusoe: the control VM gets the certificate from an ACME CA (`acmeEmail`), point both at its address (output `controlPublicIp`).',
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
    doc: 'Node address blocks (`kubernetes` mode): agents use the host network, so Redis admits these. Required on CoreWeave (the CKS VPC host prefix).',
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
  apiEnv: {
    type: 'object',
    default: '`{}`',
    doc: 'Extra API settings (`SPACE_*` from README.md), e.g. `SPACE_LOG_LEVEL`.',
  },
  agentEnv: {
    type: 'object',
    default: '`{}`',
    doc: 'Extra agent settings (`SPACE_*`), e.g. `SPACE_WARM_POOL_SIZE`.',
  },
} as const satisfies Record<string, KeySpec>;

/** The validated configuration's type is the providers' (providers/stack-config.ts); re-exported for callers here. */
export type { StackConfig };

/** A declared key name. */
export type ConfigKey = keyof typeof CONFIG_KEYS;

/** Thrown with every configuration problem, one per line. */
export class StackConfigError extends Error {
  readonly problems: readonly string[];
  constructor(problems: string[]) {
    super(
      `invalid stack configuration (${problems.length} problem${problems.length > 1 ? 's' : ''}):\n  - ${problems.join('\n  - ')}`,
    );
    this.name = 'StackConfigError';
    this.problems = problems;
  }
}

/** True for an IPv4 CIDR such as `10.0.0.0/16` (runtime/core/net-address.ts). */
export const isCidr: (s: unknown) => s is string = isIPv4Cidr;

/** True for `ip:port` (IPv4) or `[ipv6]:port`, what `SPACE_GATEWAY_UPSTREAM_DNS` takes. */
export function isResolver(s: unknown): s is string {
  if (typeof s !== 'string') return false;
  const m = /^(?:([^[\]:]+)|\[([0-9A-Fa-f:.]+)\]):(\d{1,5})$/.exec(s);
  if (!m || Number(m[3]) < 1 || Number(m[3]) > 65535) return false;
  return m[1] !== undefined ? isIPv4(m[1]) : isIPv6NoZone(m[2]);
}

/** True for an IPv4 or IPv6 CIDR the gateway accepts. */
export function isAnyCidr(s: unknown): s is string {
  if (typeof s !== 'string') return false;
  try {
    parseCidr(s);
    return true;
  } catch {
    return false;
  }
}

/** True when CIDR `outer` contains all of `inner`. */
function covers(outer: Cidr, inner: Cidr): boolean {
  if (outer.family !== inner.family || outer.prefix > inner.prefix) return false;
  const bits = BigInt(outer.family === 4 ? 32 : 128);
  const shift = bits - BigInt(outer.prefix);
  return inner.network >> shift === outer.network >> shift;
}

/** Raw config as strings by key (what Pulumi stores), e.g. from `pulumi.runtime.getConfig`. */
export type RawConfig = (key: ConfigKey) => string | undefined;

/** Reads the raw `space:*` values from the Pulumi runtime (no secret warning: secrets are re-read as secrets). */
export const pulumiRawConfig: RawConfig = (key) => pulumi.runtime.getConfig(`space:${key}`);

/**
 * Parses and validates the whole configuration. `raw` gives each key's stored string; secrets are
 * wrapped with `pulumi.secret`. Throws {@link StackConfigError} listing every problem.
 */
export function loadStackConfig(raw: RawConfig = pulumiRawConfig): StackConfig {
  const problems: string[] = [];
  const json = (key: ConfigKey): unknown => {
    const v = raw(key);
    if (v === undefined) return undefined;
    try {
      return JSON.parse(v);
    } catch {
      problems.push(`space:${key}: not valid JSON (${CONFIG_KEYS[key].type} expected)`);
      return undefined;
    }
  };
  const str = (key: ConfigKey, def?: string) => raw(key) ?? def;
  const int = (key: ConfigKey, def: number, min: number, max: number) => {
    const v = raw(key);
    if (v === undefined) return def;
    const n = Number(v);
    if (!Number.isInteger(n) || n < min || n > max)
      problems.push(`space:${key}: must be an integer from ${min} to ${max} (got "${v}")`);
    return n;
  };
  const bool = (key: ConfigKey, def: boolean) => {
    const v = raw(key);
    if (v === undefined) return def;
    if (v !== 'true' && v !== 'false') problems.push(`space:${key}: must be true or false (got "${v}")`);
    return v === 'true';
  };
  const cidrs = (key: ConfigKey, def: string[]) => {
    const v = json(key) ?? def;
    if (!Array.isArray(v) || !v.every(isCidr)) {
      problems.push(`space:${key}: must be a list of IPv4 CIDRs (got ${JSON.stringify(v)})`);
      return [];
    }
    return v as string[];
  };

  const cloudRaw = raw('cloud');
  if (!(CLOUDS as readonly string[]).includes(cloudRaw ?? '')) {
    throw new StackConfigError([
      `space:cloud: must be one of ${CLOUDS.join(', ')} (got ${JSON.stringify(cloudRaw)})`,
    ]);
  }
  const cloud = cloudRaw as Cloud;
  const profile = cloudProfiles[cloud];

  // keys that do not apply to this cloud are mistakes (a stack file copied from another cloud)
  for (const [key, spec] of Object.entries(CONFIG_KEYS) as [ConfigKey, KeySpec][]) {
    if (spec.clouds && !spec.clouds.includes(cloud) && raw(key) !== undefined)
      problems.push(`space:${key}: does not apply to ${cloud} (only ${spec.clouds.join(', ')})`);
  }

  const mode = (raw('mode') ?? profile.modes[0]) as DeployMode;
  if (!(profile.modes as readonly string[]).includes(mode))
    problems.push(`space:mode: ${cloud} supports ${profile.modes.join(', ')} (got "${mode}")`);
  const version = raw('version');
  if (!version) problems.push('space:version: required (the image tag, e.g. 0.1.0)');
  else if (!/^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$/.test(version))
    problems.push(`space:version: not a valid image tag ("${version}")`);
  const imageRepository = str('imageRepository', DEFAULT_IMAGE_REPOSITORY)!;
  if (!/^[a-z0-9.-]+(:\d+)?(\/[a-z0-9._-]+)+$/.test(imageRepository))
    problems.push(`space:imageRepository: not an image repository ("${imageRepository}")`);

  const region = raw('region') ?? '';
  if ((cloud === 'akamai' || cloud === 'crusoe') && !region)
    problems.push('space:region: required on ' + cloud);

  const pools = parseNodePools(cloud, json('nodePools'));
  problems.push(...pools.problems);

  const clientCidrs = cidrs('clientCidrs', ['0.0.0.0/0']);
  const sshCidrs = cidrs('sshCidrs', []);
  const privateCidr = str('privateCidr', '10.77.128.0/24')!;
  if (!isCidr(privateCidr)) problems.push(`space:privateCidr: not an IPv4 CIDR ("${privateCidr}")`);
  const sshPublicKey = raw('sshPublicKey');
  if (
    sshPublicKey !== undefined &&
    !/^(ssh-ed25519|ssh-rsa|ecdsa-sha2-\S+) [A-Za-z0-9+/=]+( .*)?$/.test(sshPublicKey)
  )
    problems.push('space:sshPublicKey: not an OpenSSH public key');
  if (cloud === 'crusoe' && !sshPublicKey)
    problems.push('space:sshPublicKey: required on crusoe (its API requires one)');

  const controlDefault = cloud === 'crusoe' ? 'c1a.2x' : 'g6-dedicated-2';
  const controlInstanceType = str('controlInstanceType', controlDefault)!;
  if (mode === 'vm' && !instanceType(cloud, controlInstanceType))
    problems.push(`space:controlInstanceType: "${controlInstanceType}" is not in the ${cloud} catalogue`);

  const apiEnv = (json('apiEnv') ?? {}) as Record<string, string>;
  const agentEnv = (json('agentEnv') ?? {}) as Record<string, string>;
  const gatewayEnv = (json('gatewayEnv') ?? {}) as Record<string, string>;
  problems.push(
    ...checkEnvOverrides('api', apiEnv, 'space:apiEnv'),
    ...checkEnvOverrides('agent', agentEnv, 'space:agentEnv'),
    ...checkEnvOverrides('gateway', gatewayEnv, 'space:gatewayEnv'),
  );

  const nodeCidrDefault =
    cloud === 'kind' ? ['172.16.0.0/12'] : cloud === 'akamai' ? ['192.168.128.0/17'] : [];
  const nodeCidrs = cidrs('nodeCidrs', nodeCidrDefault);
  if (cloud === 'coreweave' && nodeCidrs.length === 0)
    problems.push('space:nodeCidrs: required on coreweave (the host prefix of the CKS VPC)');
  const nodeTolerations = (json('nodeTolerations') ?? []) as Record<string, string>[];
  if (!Array.isArray(nodeTolerations) || !nodeTolerations.every((t) => typeof t === 'object' && t !== null))
    problems.push('space:nodeTolerations: must be a list of toleration objects');

  const has = (k: ConfigKey) => raw(k) !== undefined;
  const gatewayEnabled = bool('gatewayEnabled', true);
  const gatewayUpstreamDns = (json('gatewayUpstreamDns') ?? []) as string[];
  if (!Array.isArray(gatewayUpstreamDns) || !gatewayUpstreamDns.every(isResolver))
    problems.push(
      `space:gatewayUpstreamDns: must be a list of "ip:port" (IPv6: "[addr]:port") (got ${JSON.stringify(gatewayUpstreamDns)})`,
    );
  const gatewayDenyCidrs = (json('gatewayDenyCidrs') ?? []) as string[];
  if (!Array.isArray(gatewayDenyCidrs) || !gatewayDenyCidrs.every(isAnyCidr)) {
    problems.push(
      `space:gatewayDenyCidrs: must be a list of IPv4/IPv6 CIDRs (got ${JSON.stringify(gatewayDenyCidrs)})`,
    );
  } else if (gatewayDenyCidrs.length) {
    // the gateway must never be a way into the deployment's own networks (Redis, agents, sandboxes)
    const deny = buildDenySet(gatewayDenyCidrs);
    const own = [
      ...(mode === 'vm' ? [privateCidr] : nodeCidrs),
      agentEnv['SPACE_NETWORK_POOL'] ?? String(agentSettings.networkPool.default),
    ].filter(isCidr);
    for (const c of own)
      if (!deny.some((d) => covers(d, parseCidr(c))))
        problems.push(
          `space:gatewayDenyCidrs: must cover ${c} (the deployment's own network; sandboxes must not reach it)`,
        );
  }
  if (mode === 'kubernetes' && gatewayEnabled) {
    if (!has('gatewayCaCertificate') || !has('gatewayCaKey'))
      problems.push(
        'space:gatewayCaCertificate and space:gatewayCaKey: required in kubernetes mode with the gateway (docs/deployment.md "Gateway CA")',
      );
    else {
      try {
        caFromPem(raw('gatewayCaCertificate')!, raw('gatewayCaKey')!);
      } catch (err) {
        problems.push(`space:gatewayCaCertificate/gatewayCaKey: ${(err as Error).message}`);
      }
    }
  } else if (mode === 'vm') {
    for (const k of ['gatewayCaCertificate', 'gatewayCaKey'] as const)
      if (has(k))
        problems.push(
          `space:${k}: not used in vm mode (each node's gateway makes its CA on the node; the key never leaves it)`,
        );
  }
  if (mode === 'kubernetes') {
    if (!has('signingKey'))
      problems.push(
        'space:signingKey: required in kubernetes mode (pulumi config set --secret space:signingKey -- "$(openssl genpkey -algorithm ed25519)")',
      );
    if (!has('redisPassword') && !has('redisUrl'))
      problems.push('space:redisPassword: required in kubernetes mode unless space:redisUrl is set');
  } else {
    for (const k of ['signingKey', 'redisPassword', 'redisUrl'] as const)
      if (has(k))
        problems.push(
          `space:${k}: not used in vm mode (the control VM makes its own keys; Redis runs there)`,
        );
  }
  const signing = raw('signingKey');
  if (signing !== undefined && !signing.includes('BEGIN PRIVATE KEY'))
    problems.push(
      'space:signingKey: must be an Ed25519 PKCS#8 PEM private key ("-----BEGIN PRIVATE KEY-----")',
    );
  if (cloud === 'akamai' && mode === 'kubernetes' && !has('lkeFirewallToken'))
    problems.push(
      'space:lkeFirewallToken: required in kubernetes mode on akamai (a Linode token with Firewalls read/write and Linodes read-only; see docs/deployment.md)',
    );
  if (cloud === 'akamai' && mode === 'vm' && has('lkeFirewallToken'))
    problems.push(
      'space:lkeFirewallToken: not used in vm mode (VMs are attached to their firewalls by Pulumi)',
    );
  if (cloud === 'coreweave' && !has('kubeconfig'))
    problems.push('space:kubeconfig: required on coreweave (see docs/deployment.md)');
  const hostnames = json('tlsHostnames') as { api?: unknown; router?: unknown } | undefined;
  const dns = /^(?=.{1,253}$)([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]{2,63}$/i;
  let tls: StackConfig['tls'];
  let acme: StackConfig['acme'];
  let vmTlsHostnames: StackConfig['vmTlsHostnames'];
  const names =
    hostnames !== undefined &&
    typeof hostnames.api === 'string' &&
    dns.test(hostnames.api) &&
    typeof hostnames.router === 'string' &&
    dns.test(hostnames.router)
      ? { api: hostnames.api, router: hostnames.router }
      : undefined;
  if (hostnames !== undefined && !names)
    problems.push('space:tlsHostnames: must be { "api": "<dns name>", "router": "<dns name>" }');
  if (cloud === 'crusoe') {
    // no load balancer here: the control VM gets its certificate from an ACME CA itself
    const email = raw('acmeEmail');
    const server = raw('acmeServer') ?? LETS_ENCRYPT_DIRECTORY;
    if (email !== undefined && !/^[^\s@]+@[^\s@]+$/.test(email))
      problems.push(`space:acmeEmail: not an e-mail address ("${email}")`);
    if (!/^https:\/\/\S+$/.test(server))
      problems.push(`space:acmeServer: must be an https:// URL ("${server}")`);
    if (hostnames === undefined) {
      for (const k of ['acmeEmail', 'acmeServer'] as const)
        if (has(k)) problems.push(`space:${k}: only with space:tlsHostnames (the names to certify)`);
    } else if (email === undefined)
      problems.push('space:acmeEmail: required with space:tlsHostnames on crusoe (the ACME account e-mail)');
    else if (names) acme = { hostnames: [...new Set([names.api, names.router])], email, server };
  } else if (mode === 'vm') {
    if (has('tlsIssuer'))
      problems.push('space:tlsIssuer: kubernetes mode only (VMs: the load balancer’s TLS)');
    else if (hostnames !== undefined && !has('apiTlsCertificate'))
      problems.push(
        'space:tlsHostnames: on akamai in vm mode these are the names on space:apiTlsCertificate; set it too',
      );
    else vmTlsHostnames = names;
  } else if (has('tlsIssuer') !== has('tlsHostnames'))
    problems.push('space:tlsIssuer and space:tlsHostnames: set both (cert-manager TLS) or neither');
  else if (names) tls = { issuer: raw('tlsIssuer')!, apiHostname: names.api, routerHostname: names.router };
  const routerUrl = raw('routerUrl');
  if (routerUrl !== undefined && !/^https?:\/\/[^/\s]+\/?$/.test(routerUrl))
    problems.push('space:routerUrl: must be http(s)://host[:port]');
  const routerUrlDefaulted =
    cloud === 'kind' ||
    (cloud === 'akamai' && mode === 'vm') ||
    (mode === 'kubernetes' && has('tlsHostnames')) ||
    (cloud === 'crusoe' && has('tlsHostnames'));
  if (routerUrl === undefined && !routerUrlDefaulted)
    problems.push(
      `space:routerUrl: required on ${cloud} in ${mode} mode (the router's public address is not known before it exists; clients reach sandboxes only through it)`,
    );
  const bootstrapApiKey = raw('bootstrapApiKey');
  if (mode === 'vm' && bootstrapApiKey === undefined)
    problems.push(
      'space:bootstrapApiKey: required in vm mode (pulumi config set --secret space:bootstrapApiKey "space_$(openssl rand -hex 24)"): every pulumi up writes the VMs’ configuration through the API with it',
    );
  else if (mode !== 'vm' && bootstrapApiKey !== undefined)
    problems.push('space:bootstrapApiKey: vm mode only (Kubernetes reconfigures pods itself)');
  else if (bootstrapApiKey !== undefined && !/^space_[A-Za-z0-9]{32,}$/.test(bootstrapApiKey))
    problems.push('space:bootstrapApiKey: must be "space_" and at least 32 letters or digits');
  if (has('apiTlsCertificate') !== has('apiTlsKey'))
    problems.push('space:apiTlsCertificate and space:apiTlsKey: set both or neither');
  if (cloud === 'crusoe') {
    if (!raw('crusoeProjectId')) problems.push('space:crusoeProjectId: required on crusoe');
    if (!raw('crusoeVpcNetworkId')) problems.push('space:crusoeVpcNetworkId: required on crusoe');
  }

  const cfg: StackConfig = {
    cloud,
    mode,
    version: version ?? '',
    imageRepository,
    imageBuild: bool('imageBuild', false),
    region,
    nodePools: pools.pools,
    clientCidrs,
    sshCidrs,
    sshPublicKey,
    privateCidr,
    controlInstanceType,
    gatewayEnabled,
    gatewayCaCertificate: raw('gatewayCaCertificate'),
    gatewayUpstreamDns: Array.isArray(gatewayUpstreamDns) ? gatewayUpstreamDns : [],
    gatewayDenyCidrs: Array.isArray(gatewayDenyCidrs) ? gatewayDenyCidrs : [],
    gatewayEnv,
    apiReplicas: int('apiReplicas', 2, 1, 100),
    agentDrainSeconds: int('agentDrainSeconds', 120, 10, 3600),
    k8sVersion: str('k8sVersion', '1.33')!,
    kubeContext: str('kubeContext', cloud === 'kind' ? 'kind-space' : undefined),
    redisStorageClass: raw('redisStorageClass'),
    apiTlsCertificate: raw('apiTlsCertificate'),
    routerUrl,
    tls,
    acme,
    vmTlsHostnames,
    nodeCidrs,
    nodeTolerations,
    crusoeProjectId: raw('crusoeProjectId') ?? '',
    crusoeVpcNetworkId: raw('crusoeVpcNetworkId') ?? '',
    crusoeImage: str('crusoeImage', 'ubuntu22.04:latest')!,
    apiEnv,
    agentEnv,
    secrets: Object.fromEntries(
      (
        [
          'signingKey',
          'redisPassword',
          'redisUrl',
          'kubeconfig',
          'apiTlsKey',
          'gatewayCaKey',
          'lkeFirewallToken',
          'bootstrapApiKey',
        ] as const
      )
        .filter((k) => raw(k) !== undefined)
        .map((k) => [k, pulumi.secret(raw(k)!)]),
    ),
  };
  if (problems.length) throw new StackConfigError(problems);
  return Object.freeze(cfg);
}
