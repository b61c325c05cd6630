/**
 * Stack configuration: every `space:*` key (declared once in config-keys.ts) read from Pulumi
 * config, validated all at once (every problem with its key, in one error thrown before any
 * resource exists), and frozen. docs/deployment.md has the same table; a test keeps the two in step.
 */
import * as pulumi from '@pulumi/pulumi';
import { CLOUDS, type Cloud, instanceType } from '../providers/catalogue.ts';
import { cloudProfiles, type DeployMode, parseNodePools } from '../providers/node-pool.ts';
import { checkEnvOverrides } from '../providers/runtime-settings.ts';
import type { StackConfig } from '../providers/stack-config.ts';
import { LETS_ENCRYPT_DIRECTORY, REDIS_PASSWORD } from '../providers/systemd/cloud-init.ts';
import { agentSettings } from '../runtime/agent/config.ts';
import { DRIVER_NAMES, type DriverName } from '../runtime/core/drivers.ts';
import { isIPv4, isIPv4Cidr, isIPv6NoZone } from '../runtime/core/net-address.ts';
import { parseRedisUrl, redactRedisUrl } from '../runtime/core/redis-connection.ts';
import { buildDenySet, type Cidr, parseCidr } from '../runtime/gateway/addresses.ts';
import { caFromPem } from '../runtime/gateway/ca.ts';
import { parseBackup } from './config-backup.ts';
import { CONFIG_KEYS, type ConfigKey, type KeySpec } from './config-keys.ts';

export { CONFIG_KEYS, type ConfigKey, type KeySpec, type KeyType } from './config-keys.ts';

/** The validated configuration's type is the providers' (providers/stack-config.ts); re-exported for callers here. */
export type { StackConfig };

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

/** The `space:*` key names set in the stack's Pulumi config, without the prefix (e.g. `version`). */
export function pulumiConfigKeys(): string[] {
  return Object.keys(pulumi.runtime.allConfig())
    .filter((k) => k.startsWith('space:'))
    .map((k) => k.slice('space:'.length));
}

/**
 * Levenshtein distance of `a` and `b` (insertions, deletions, substitutions; one row of the
 * dynamic-programming table at a time). No edit-distance library is a dependency here, and key
 * names are short. Pure.
 */
export function editDistance(a: string, b: string): number {
  let prev = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const row = [i];
    for (let j = 1; j <= b.length; j++)
      row[j] = Math.min(prev[j]! + 1, row[j - 1]! + 1, prev[j - 1]! + (a[i - 1] === b[j - 1] ? 0 : 1));
    prev = row;
  }
  return prev[b.length]!;
}

/**
 * The declared key nearest to `key` (case-insensitive edit distance), when it is close enough to
 * be a misspelling: at most a third of the name's length away, and at least 2 edits allowed.
 */
export function nearestKey(key: string): ConfigKey | undefined {
  let best: { key: ConfigKey; d: number } | undefined;
  for (const k of Object.keys(CONFIG_KEYS) as ConfigKey[]) {
    const d = editDistance(key.toLowerCase(), k.toLowerCase());
    if (!best || d < best.d) best = { key: k, d };
  }
  return best && best.d <= Math.max(2, Math.floor(key.length / 3)) ? best.key : undefined;
}

/** One problem per name in `setKeys` that is not a declared key, with the nearest valid name. */
export function unknownKeyProblems(setKeys: readonly string[]): string[] {
  return setKeys
    .filter((k) => !Object.hasOwn(CONFIG_KEYS, k))
    .map((k) => {
      const near = nearestKey(k);
      return `space:${k}: not a SPACE configuration key${near ? `; did you mean \`space:${near}\`?` : ' (docs/deployment.md lists every key)'}`;
    });
}

/**
 * Parses and validates the whole configuration. `raw` gives each key's stored string; secrets are
 * wrapped with `pulumi.secret`. `setKeys` names every `space:` key the stack sets (default: the
 * Pulumi runtime's); one that is not declared is refused with the nearest valid name, since it
 * would otherwise be silently ignored. Throws {@link StackConfigError} listing every problem.
 */
export function loadStackConfig(
  raw: RawConfig = pulumiRawConfig,
  setKeys: readonly string[] = pulumiConfigKeys(),
): StackConfig {
  const problems: string[] = unknownKeyProblems(setKeys);
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
      ...problems,
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
  // no SPACE image is published anywhere: a default repository would name a tag nobody pushed
  const imageRepository = raw('imageRepository') ?? '';
  if (!imageRepository)
    problems.push(
      'space:imageRepository: required: the repository your image is pushed to (no SPACE image is published; `npm run image` and `buildah push`, or space:imageBuild: docs/deployment.md "The runtime image")',
    );
  else if (!/^[a-z0-9.-]+(:\d+)?(\/[a-z0-9._-]+)+$/.test(imageRepository))
    problems.push(`space:imageRepository: not an image repository ("${imageRepository}")`);
  const imageVmms = (json('imageVmms') ?? ['gvisor', 'qemu']) as DriverName[];
  if (!Array.isArray(imageVmms) || !imageVmms.every((d) => (DRIVER_NAMES as readonly string[]).includes(d)))
    problems.push(
      `space:imageVmms: must be a list of drivers (${DRIVER_NAMES.join(', ')}) (got ${JSON.stringify(imageVmms)})`,
    );
  const pullUser = raw('imagePullUsername');
  const pullSecretName = raw('imagePullSecretName');
  if ((pullUser === undefined) !== (raw('imagePullPassword') === undefined))
    problems.push('space:imagePullUsername and space:imagePullPassword: set both or neither');
  // RFC 7617 section 2: the user-id of basic credentials cannot contain a colon
  if (pullUser !== undefined && !/^[^:\s]+$/.test(pullUser))
    problems.push('space:imagePullUsername: must be non-empty, without ":" or spaces');
  if (pullSecretName !== undefined) {
    if (pullUser !== undefined)
      problems.push('space:imagePullSecretName and space:imagePullUsername: set one or the other');
    if (mode !== 'kubernetes')
      problems.push('space:imagePullSecretName: kubernetes mode only (a Secret in the cluster)');
    // a Secret's name is a DNS subdomain (RFC 1123), at most 253 characters
    if (
      !/^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/.test(pullSecretName)
    )
      problems.push(`space:imagePullSecretName: not a Kubernetes Secret name ("${pullSecretName}")`);
  }

  const region = raw('region') ?? '';
  if ((cloud === 'akamai' || cloud === 'crusoe') && !region)
    problems.push('space:region: required on ' + cloud);

  const pools = parseNodePools(cloud, json('nodePools'));
  problems.push(...pools.problems);
  if (Array.isArray(imageVmms))
    for (const p of pools.pools)
      if (!imageVmms.includes(p.driver))
        problems.push(
          `space:nodePools: pool "${p.name}" runs driver "${p.driver}", which the image lacks (space:imageVmms: ${imageVmms.join(', ')}): build the image online so it fetches that VMM (npm run image, scripts/vmm-releases.json) and add "${p.driver}" to space:imageVmms, or use ${imageVmms.includes('gvisor') ? 'gvisor' : imageVmms.join(' or ')}`,
        );

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
  const redisPassword = raw('redisPassword');
  if (mode === 'kubernetes') {
    if (!has('signingKey'))
      problems.push(
        'space:signingKey: required in kubernetes mode (pulumi config set --secret space:signingKey -- "$(openssl genpkey -algorithm ed25519)")',
      );
    if (redisPassword === undefined && !has('redisUrl'))
      problems.push('space:redisPassword: required in kubernetes mode unless space:redisUrl is set');
    // the password is the in-cluster Redis's only gate (providers/kubernetes/redis.ts)
    if (redisPassword !== undefined && redisPassword.length < 16)
      problems.push(
        'space:redisPassword: at least 16 characters (pulumi config set --secret space:redisPassword "$(openssl rand -hex 24)")',
      );
  } else {
    if (has('redisUrl')) problems.push('space:redisUrl: not used in vm mode (Redis runs on the control VMs)');
    // REDIS_PASSWORD holds the length too: one problem for a short password, not two
    if (redisPassword !== undefined && !REDIS_PASSWORD.test(redisPassword))
      problems.push(
        'space:redisPassword: in vm mode 16-128 characters from A-Z a-z 0-9 . _ ~ - (e.g. "$(openssl rand -hex 24)")',
      );
  }
  const redisUrl = raw('redisUrl');
  if (redisUrl !== undefined) {
    // the form every service parses at start (runtime/core/redis-connection.ts): refused here, not
    // in a crash-looping pod
    try {
      parseRedisUrl(redisUrl);
    } catch (err) {
      problems.push(`space:redisUrl: ${(err as Error).message} (${redactRedisUrl(redisUrl)})`);
    }
  }
  const redis = redisTopology(json('redis'), cloud, mode, has('redisUrl'), redisPassword, problems);
  const controlPlaneReplicas = controlPlane(json('controlPlane'), mode, problems);
  if (mode === 'vm' && has('signingKey') && controlPlaneReplicas === 1)
    problems.push(
      'space:signingKey: with one control VM it makes its own key; set it only with space:controlPlane.replicas 3 or 5 (one key for every control VM)',
    );
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
  const hostnames = json('tlsHostnames') as
    | { api?: unknown; router?: unknown; sandboxes?: unknown }
    | undefined;
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
    problems.push(
      'space:tlsHostnames: must be { "api": "<dns name>", "router": "<dns name>" } (and optionally "sandboxes": "<dns name>")',
    );
  // servers in sandboxes at <port>-<id>.<sandboxes>: a wildcard name on the router's certificate
  const sandboxes = hostnames?.sandboxes;
  if (sandboxes !== undefined && (typeof sandboxes !== 'string' || !dns.test(sandboxes)))
    problems.push('space:tlsHostnames.sandboxes: must be a DNS name (the certificate carries *.<it>)');
  const sandboxDomain = typeof sandboxes === 'string' && dns.test(sandboxes) ? sandboxes : undefined;
  if (sandboxDomain && cloud === 'crusoe')
    problems.push(
      'space:tlsHostnames.sandboxes: not on crusoe (its certbot proves names over HTTP-01, which cannot certify a wildcard; see docs/deployment.md)',
    );
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
  else if (names)
    tls = {
      issuer: raw('tlsIssuer')!,
      apiHostname: names.api,
      routerHostname: names.router,
      ...(sandboxDomain ? { sandboxDomain } : {}),
    };
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
  const prometheusOperator = bool('prometheusOperator', false);
  const promLabels = json('prometheusOperatorLabels') ?? {};
  if (
    typeof promLabels !== 'object' ||
    promLabels === null ||
    Array.isArray(promLabels) ||
    !Object.values(promLabels).every((v) => typeof v === 'string')
  )
    problems.push('space:prometheusOperatorLabels: must be an object of string labels');
  if (has('prometheusOperatorLabels') && !prometheusOperator)
    problems.push('space:prometheusOperatorLabels: only with space:prometheusOperator true');
  if (prometheusOperator && mode !== 'kubernetes')
    problems.push(
      'space:prometheusOperator: kubernetes mode only (VMs: load providers/observability/space-alerts.yaml into your Prometheus)',
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
  if (cloud === 'crusoe' && controlPlaneReplicas > 1 && acme)
    problems.push(
      'space:controlPlane: several control VMs on crusoe cannot take space:tlsHostnames: each would ask the ACME CA for the same names over HTTP-01, and the CA checks whichever VM the name leads it to (terminate TLS in front of them instead, see docs/deployment.md)',
    );
  if (has('apiTlsCertificate') !== has('apiTlsKey'))
    problems.push('space:apiTlsCertificate and space:apiTlsKey: set both or neither');
  if (cloud === 'crusoe') {
    if (!raw('crusoeProjectId')) problems.push('space:crusoeProjectId: required on crusoe');
    if (!raw('crusoeVpcNetworkId')) problems.push('space:crusoeVpcNetworkId: required on crusoe');
  }

  const backup = parseBackup(json('backup'), has('backupSecretAccessKey'), problems);

  const cfg: StackConfig = {
    cloud,
    mode,
    version: version ?? '',
    imageRepository,
    imagePullUsername: pullUser,
    imageBuild: bool('imageBuild', false),
    imageVmms: Array.isArray(imageVmms) ? imageVmms : [],
    imagePullSecretName: pullSecretName,
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
    redis,
    controlPlaneReplicas,
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
    prometheusOperator: prometheusOperator ? { labels: promLabels as Record<string, string> } : undefined,
    apiEnv,
    agentEnv,
    backup,
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
          'imagePullPassword',
          'backupSecretAccessKey',
        ] as const
      )
        .filter((k) => raw(k) !== undefined)
        .map((k) => [k, pulumi.secret(raw(k)!)]),
    ),
  };
  if (problems.length) throw new StackConfigError(problems);
  return Object.freeze(cfg);
}

/** Sentinel counts that keep a majority after losing one: odd (an even count tolerates no more than the odd one below it), 3 or more. */
const SENTINEL_COUNTS = [3, 5, 7];

/**
 * `space:redis` (`v`, parsed JSON or undefined) for `cloud` in `mode`, with a problem pushed for
 * each impossible setting: an unknown mode or field, fewer than 2 data servers (no replica to
 * promote), a sentinel count that cannot keep a majority after losing one (1, 2, even), the key
 * in vm mode or beside `space:redisUrl`, a Sentinel password unfit for sentinel.conf and the URL.
 * Default: sentinel 3/3, except kind (one machine: `single`).
 */
export function redisTopology(
  v: unknown,
  cloud: Cloud,
  mode: DeployMode,
  external: boolean,
  password: string | undefined,
  problems: string[],
): StackConfig['redis'] {
  const fallback: StackConfig['redis'] =
    cloud === 'kind' || mode !== 'kubernetes' || external
      ? { mode: 'single' }
      : { mode: 'sentinel', servers: 3, sentinels: 3 };
  if (v === undefined) {
    if (fallback.mode === 'sentinel' && password !== undefined && !REDIS_PASSWORD.test(password))
      problems.push(
        'space:redisPassword: with Redis Sentinel (space:redis, the default here) 16-128 characters from A-Z a-z 0-9 . _ ~ - (it goes into sentinel.conf and the redis-sentinel:// URL as it is; "$(openssl rand -hex 24)" fits), or set space:redis {"mode": "single"}',
      );
    return fallback;
  }
  const before = problems.length;
  if (mode !== 'kubernetes')
    problems.push(
      'space:redis: kubernetes mode only (vm mode: space:controlPlane decides, see docs/deployment.md)',
    );
  if (external)
    problems.push('space:redis: not with space:redisUrl (an external Redis: nothing is deployed)');
  if (typeof v !== 'object' || v === null || Array.isArray(v)) {
    problems.push(
      'space:redis: must be an object, e.g. { "mode": "sentinel", "servers": 3, "sentinels": 3 }',
    );
    return fallback;
  }
  const o = v as Record<string, unknown>;
  for (const k of Object.keys(o))
    if (!['mode', 'servers', 'sentinels'].includes(k))
      problems.push(`space:redis: unknown field "${k}" (mode, servers, sentinels)`);
  if (o['mode'] !== 'sentinel' && o['mode'] !== 'single') {
    problems.push(`space:redis.mode: "sentinel" or "single" (got ${JSON.stringify(o['mode'])})`);
    return fallback;
  }
  if (o['mode'] === 'single') {
    for (const k of ['servers', 'sentinels'])
      if (k in o) problems.push(`space:redis.${k}: only with mode "sentinel"`);
    return { mode: 'single' };
  }
  const servers = o['servers'] ?? 3;
  const sentinels = o['sentinels'] ?? 3;
  if (!Number.isInteger(servers) || (servers as number) < 2 || (servers as number) > 7)
    problems.push(
      `space:redis.servers: an integer from 2 to 7, the primary and its replicas (got ${JSON.stringify(servers)}; one server has no replica to promote: use mode "single")`,
    );
  if (!SENTINEL_COUNTS.includes(sentinels as number))
    problems.push(
      `space:redis.sentinels: 3, 5 or 7 (got ${JSON.stringify(sentinels)}): a failover needs a majority of all sentinels, so fewer than 3 cannot fail over after losing one, and an even count survives no more losses than the odd count below it`,
    );
  if (password !== undefined && !REDIS_PASSWORD.test(password))
    problems.push(
      'space:redisPassword: with Redis Sentinel 16-128 characters from A-Z a-z 0-9 . _ ~ - (it goes into sentinel.conf and the redis-sentinel:// URL as it is; "$(openssl rand -hex 24)" fits)',
    );
  if (problems.length > before) return fallback;
  return { mode: 'sentinel', servers: servers as number, sentinels: sentinels as number };
}

/**
 * `space:controlPlane.replicas` (`v`, parsed JSON or undefined): 1 (default), 3 or 5 control VMs;
 * a problem pushed for anything else (2 or 4: the sentinels on them could not keep a majority
 * after losing one VM) or outside vm mode.
 */
export function controlPlane(v: unknown, mode: DeployMode, problems: string[]): number {
  if (v === undefined) return 1;
  if (mode !== 'vm') {
    problems.push('space:controlPlane: vm mode only (kubernetes mode: space:apiReplicas and space:redis)');
    return 1;
  }
  const o = v as Record<string, unknown>;
  if (
    typeof v !== 'object' ||
    v === null ||
    Array.isArray(v) ||
    Object.keys(o).some((k) => k !== 'replicas')
  ) {
    problems.push('space:controlPlane: must be { "replicas": 1 | 3 | 5 }');
    return 1;
  }
  const n = o['replicas'] ?? 1;
  if (n !== 1 && n !== 3 && n !== 5) {
    problems.push(
      `space:controlPlane.replicas: 1, 3 or 5 (got ${JSON.stringify(n)}): each control VM runs a Redis Sentinel, and a failover needs a majority of them, which ${JSON.stringify(n)} cannot keep after losing one VM`,
    );
    return 1;
  }
  return n;
}
