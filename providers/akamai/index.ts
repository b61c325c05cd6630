/**
 * Akamai (Linode) with `@pulumi/linode` 5.1.1. Two modes:
 * - `vm`: VPC + subnet, Cloud Firewalls (inbound DROP by default; only the API — through the
 *   NodeBalancer — and the data plane open to `space:clientCidrs`; Redis only from the subnet;
 *   SSH only from `space:sshCidrs`), a Dedicated control VM (API + Redis), Dedicated pool VMs, a
 *   NodeBalancer in front of the API. cloud-init installs the systemd units.
 * - `kubernetes` (LKE): an LKE cluster with one pool per node pool, labelled for the agents, a
 *   firewall on its nodes, and the Kubernetes component (its LoadBalancer Service makes the
 *   NodeBalancer through Linode's cloud controller).
 * Linode KVM is unconfirmed (docs/deployment.md "Akamai (Linode)"): pools default to gVisor.
 */
import * as k8s from '@pulumi/kubernetes';
import * as linode from '@pulumi/linode';
import * as pulumi from '@pulumi/pulumi';
import { CloudStack, type CloudStackArgs, type StackOutputs } from '../cloud-stack.ts';
import { runtimeArgsFromConfig } from '../kubernetes/from-config.ts';
import { type PublicExposure, pullSecretsOf, Runtime } from '../kubernetes/runtime.ts';
import { NODE_LABEL, POOL_LABEL } from '../node-pool.ts';
import {
  AGENT_PORT,
  API_PORT,
  imageRef,
  REDIS_PORT,
  ROUTER_PORT,
  SENTINEL_PORT,
} from '../runtime-settings.ts';
import type { StackConfig } from '../stack-config.ts';
import {
  type AgentArgs,
  agentPlan,
  agentServiceEnv,
  controlPlan,
  controlServiceEnv,
  toCloudConfig,
} from '../systemd/cloud-init.ts';
import type { VmHa } from '../systemd/plan.ts';
import { VmConfig } from '../systemd/vm-config.ts';
import {
  bootstrapKeySha256,
  controlAddress,
  controlAddresses,
  controlVmSecrets,
  vmSecretArgs,
  vmSigningKey,
} from '../vm-network.ts';
import { lkeFirewallObjects } from './lke-firewall.ts';

/** Linode's range for NodeBalancer-to-backend traffic (Linode NodeBalancer docs; unverified here). */
export const NODEBALANCER_SOURCE_CIDR = '192.168.255.0/24';
/** Linode private addresses (LKE node-to-node traffic, `privateIp`). */
export const LINODE_PRIVATE_CIDR = '192.168.128.0/17';
/** Image of the VMs (cloud-init capable). */
export const AKAMAI_IMAGE = 'linode/ubuntu24.04';

/** A Cloud Firewall inbound rule (`linode.types.input.FirewallInbound`, plain values). */
export interface InboundRule {
  label: string;
  action: 'ACCEPT';
  protocol: 'TCP' | 'UDP' | 'ICMP' | 'IPENCAP';
  ports?: string;
  ipv4s: string[];
}

const rule = (
  label: string,
  protocol: InboundRule['protocol'],
  ports: string | undefined,
  ipv4s: readonly string[],
) =>
  ipv4s.length
    ? [{ label, action: 'ACCEPT' as const, protocol, ...(ports ? { ports } : {}), ipv4s: [...ipv4s] }]
    : [];

/**
 * Inbound rules of each firewall (policy DROP). `controlPublicIps` (each control VM's) let the API
 * dispatch to agents. With several control VMs their sentinels talk inside the subnet. Pure.
 */
export function akamaiFirewallRules(cfg: StackConfig, controlPublicIps: readonly string[] = []) {
  const ssh = rule('ssh', 'TCP', '22', cfg.sshCidrs);
  return {
    control: [
      ...rule('api-from-nodebalancer', 'TCP', String(API_PORT), [NODEBALANCER_SOURCE_CIDR]),
      ...rule('router-from-nodebalancer', 'TCP', String(ROUTER_PORT), [NODEBALANCER_SOURCE_CIDR]),
      ...rule('redis-from-subnet', 'TCP', String(REDIS_PORT), [cfg.privateCidr]),
      ...(cfg.controlPlaneReplicas > 1
        ? rule('sentinel-from-subnet', 'TCP', String(SENTINEL_PORT), [cfg.privateCidr])
        : []),
      ...ssh,
    ],
    // agents: no client rule. Clients reach sandboxes through the router, which forwards to the
    // agents' private addresses inside the subnet
    nodes: [
      ...rule('dispatch-from-subnet', 'TCP', String(AGENT_PORT), [cfg.privateCidr]),
      ...rule(
        'dispatch-from-control',
        'TCP',
        String(AGENT_PORT),
        controlPublicIps.map((ip) => `${ip}/32`),
      ),
      ...ssh,
    ],
    nodebalancer: [
      ...rule('api', 'TCP', cfg.apiTlsCertificate ? '443' : '80', cfg.clientCidrs),
      ...rule('router', 'TCP', String(akamaiRouterPort(cfg)), cfg.clientCidrs),
    ],
    // LKE nodes: no client rule; the api and router NodeBalancers reach their NodePorts
    lke: [
      ...rule('nodeports-from-nodebalancer', 'TCP', '30000-32767', [NODEBALANCER_SOURCE_CIDR]),
      ...rule('cluster-tcp', 'TCP', undefined, [LINODE_PRIVATE_CIDR]),
      ...rule('cluster-udp', 'UDP', undefined, [LINODE_PRIVATE_CIDR]),
      ...rule('cluster-ipencap', 'IPENCAP', undefined, [LINODE_PRIVATE_CIDR]),
      ...ssh,
    ],
  } as const;
}

const id = (r: pulumi.CustomResource) => r.id.apply(Number);

/** The NodeBalancer port of the router (`vm` mode): 8443 (https) with the TLS certificate, else 8082 (tcp). */
export function akamaiRouterPort(cfg: Pick<StackConfig, 'apiTlsCertificate'>): number {
  return cfg.apiTlsCertificate ? 8443 : ROUTER_PORT;
}

/** Annotation of Linode's cloud controller that puts a CCM-managed Cloud Firewall on a Service's NodeBalancer. */
export const LINODE_FIREWALL_ACL_ANNOTATION = 'service.beta.kubernetes.io/linode-loadbalancer-firewall-acl';

/**
 * How LKE exposes client-facing Services. Linode's cloud controller ignores
 * `spec.loadBalancerSourceRanges` (docs/deployment.md "What only a real cloud account can confirm"); it applies an access
 * list only through the `linode-loadbalancer-firewall-acl` annotation, a JSON object with an
 * `allowList` (or `denyList`, not both) of `ipv4` / `ipv6` CIDRs, from which it makes and keeps a
 * Cloud Firewall on the NodeBalancer (https://github.com/linode/linode-cloud-controller-manager/blob/main/docs/configuration/firewall.md,
 * "CCM-Managed Firewalls"). So the field is not set at all: it
 * would only suggest a protection that does not exist. Pure.
 */
export function lkeExposure(clientCidrs: readonly string[]): PublicExposure {
  // space:clientCidrs is IPv4 only (stacks/config.ts)
  return {
    annotations: {
      [LINODE_FIREWALL_ACL_ANNOTATION]: JSON.stringify({ allowList: { ipv4: [...clientCidrs] } }),
    },
  };
}

/** Arguments of {@link AkamaiStack}. */
export type AkamaiStackArgs = CloudStackArgs;

/** `space:akamai:Stack`: SPACE on Linode, as VMs (`vm` mode) or on LKE (`kubernetes` mode). */
export class AkamaiStack extends CloudStack {
  readonly outputs: StackOutputs;

  constructor(name: string, args: AkamaiStackArgs, opts?: pulumi.ComponentResourceOptions) {
    super('akamai', name, opts);
    const { config: cfg, image } = args;
    this.outputs = cfg.mode === 'vm' ? akamaiVms(this, cfg, image) : akamaiLke(this, cfg, image);
    this.registerOutputs(this.outputs);
  }
}

/** `vm` mode: the VPC, firewalls, NodeBalancer and VMs, as children of `parent`. */
function akamaiVms(parent: CloudStack, cfg: StackConfig, image?: pulumi.Resource): StackOutputs {
  const stack = pulumi.getStack();
  const tags = ['space', `space-${stack}`];
  const vpc = new linode.Vpc(
    'space-vpc',
    {
      label: `space-${stack}`,
      region: cfg.region,
      description: 'SPACE',
    },
    parent.child(),
  );
  const subnet = new linode.VpcSubnet(
    'space-subnet',
    {
      vpcId: id(vpc),
      label: 'space',
      ipv4: cfg.privateCidr,
    },
    parent.child(),
  );
  const rules = akamaiFirewallRules(cfg);
  const firewall = (name: string, inbounds: readonly InboundRule[]) =>
    new linode.Firewall(
      name,
      {
        label: `${name}-${stack}`.slice(0, 32),
        inboundPolicy: 'DROP',
        outboundPolicy: 'ACCEPT',
        inbounds: inbounds.map((r) => ({ ...r, ipv4s: [...r.ipv4s] })),
        tags,
      },
      parent.child(),
    );
  const controlFw = firewall('space-control-fw', rules.control);
  // several control VMs (space:controlPlane): at addresses the program chooses, all known to each
  const n = cfg.controlPlaneReplicas;
  const ha: VmHa | undefined =
    n > 1
      ? {
          controlVms: n,
          controlAddresses: controlAddresses(cfg.privateCidr, n),
          initialPrimary: controlAddress(cfg.privateCidr),
        }
      : undefined;
  const vmArgs = {
    version: cfg.version,
    imageRepository: cfg.imageRepository,
    privateCidr: cfg.privateCidr,
    ...(ha ? { ha } : {}),
  };
  const ssh = cfg.sshPublicKey ? { authorizedKeys: [cfg.sshPublicKey] } : {};
  const iface = (vpcAddress?: string) => [
    { purpose: 'public' },
    {
      purpose: 'vpc',
      subnetId: id(subnet),
      ipv4: { ...(vpcAddress ? { vpc: vpcAddress } : {}), nat11: 'any' },
    },
  ];
  // a version bump must not replace VMs (their sandboxes would die): after creation the user data
  // is ignored and upgrades run `space-upgrade` per VM (docs/deployment.md, platform team upgrade)
  // and with space:imageBuild, no VM is made before its image is pushed
  const keep = { ignoreChanges: ['metadatas'], dependsOn: image ? [image] : [] };
  const userData = (text: string) => [{ userData: Buffer.from(text).toString('base64') }];
  const nbFw = firewall('space-nb-fw', rules.nodebalancer);
  const nb = new linode.NodeBalancer(
    'space-api-nb',
    {
      label: `space-api-${stack}`.slice(0, 32),
      region: cfg.region,
      firewallId: id(nbFw),
      tags,
    },
    parent.child(),
  );
  const routerScheme = cfg.apiTlsCertificate ? 'https' : 'http';
  // the API hands out the router's address on the NodeBalancer (or the operator's name for it)
  // the names the certificate carries (space:tlsHostnames) when given, else the NodeBalancer's address
  const routerUrl = cfg.routerUrl
    ? pulumi.output(cfg.routerUrl)
    : cfg.vmTlsHostnames
      ? pulumi.output(`https://${cfg.vmTlsHostnames.router}:${akamaiRouterPort(cfg)}`)
      : pulumi.interpolate`${routerScheme}://${nb.ipv4}:${akamaiRouterPort(cfg)}`;
  const keySha = bootstrapKeySha256(cfg);
  // the Redis password and pull credentials: every user data that holds them is a secret input
  // (the only channel into a new VM)
  const vmSecrets = vmSecretArgs(cfg);
  const controlArgs = (url: string, sha: string | undefined) => ({
    ...vmArgs,
    apiEnv: cfg.apiEnv,
    routerUrl: url,
    ...(sha ? { bootstrapKeySha256: sha } : {}),
  });
  const agentArgs = (pool: (typeof cfg.nodePools)[number]): Omit<AgentArgs, 'redisPassword'> => ({
    ...vmArgs,
    pool,
    controlAddress: controlAddress(cfg.privateCidr),
    gatewayEnabled: cfg.gatewayEnabled,
    gatewayUpstreamDns: cfg.gatewayUpstreamDns,
    gatewayDenyCidrs: cfg.gatewayDenyCidrs,
    gatewayEnv: cfg.gatewayEnv,
    agentEnv: cfg.agentEnv,
    agentDrainSeconds: cfg.agentDrainSeconds,
  });
  // the one signing key of several control VMs (one VM makes its own)
  const signingKey = ha ? vmSigningKey(cfg) : pulumi.output(undefined);
  const addresses = controlAddresses(cfg.privateCidr, n);
  // the first keeps the name of the single control VM: a stack made with one keeps it
  const controls = addresses.map(
    (address, i) =>
      new linode.Instance(
        i === 0 ? 'space-control' : `space-control-${i}`,
        {
          label: i === 0 ? `space-control-${stack}` : `space-control-${i}-${stack}`,
          region: cfg.region,
          type: cfg.controlInstanceType,
          image: AKAMAI_IMAGE,
          privateIp: true,
          interfaces: iface(address),
          firewallId: id(controlFw),
          metadatas: pulumi.all([routerUrl, keySha, vmSecrets, signingKey]).apply(([url, sha, s, key]) =>
            userData(
              toCloudConfig(
                controlPlan({
                  ...controlArgs(url, sha),
                  ...controlVmSecrets(s, i),
                  ...(key ? { self: { address, signingKey: key } } : {}),
                }),
              ),
            ),
          ),
          tags,
          ...ssh,
        },
        parent.child(keep),
      ),
  );
  const control = controls[0]!;
  const nodesFw = new linode.Firewall(
    'space-nodes-fw',
    {
      label: `space-nodes-fw-${stack}`.slice(0, 32),
      inboundPolicy: 'DROP',
      outboundPolicy: 'ACCEPT',
      inbounds: pulumi.all(controls.map((c) => c.ipv4s)).apply((ips) =>
        akamaiFirewallRules(
          cfg,
          ips.map((x) => x[0]!),
        ).nodes.map((r) => ({ ...r, ipv4s: [...r.ipv4s] })),
      ),
      tags,
    },
    parent.child(),
  );
  const nodes = cfg.nodePools.flatMap((pool) =>
    Array.from(
      { length: pool.count },
      (_, i) =>
        new linode.Instance(
          `space-node-${pool.name}-${i}`,
          {
            label: `space-${pool.name}-${i}-${stack}`.slice(0, 64),
            region: cfg.region,
            type: pool.instanceType,
            image: AKAMAI_IMAGE,
            privateIp: true,
            interfaces: iface(),
            firewallId: id(nodesFw),
            metadatas: vmSecrets.apply((s) =>
              userData(toCloudConfig(agentPlan({ ...agentArgs(pool), ...s }))),
            ),
            tags: [...tags, `space-pool-${pool.name}`],
            ...ssh,
          },
          parent.child(keep),
        ),
    ),
  );
  const tls = cfg.apiTlsCertificate && cfg.secrets.apiTlsKey;
  // several control VMs: a backend out of rotation after two failed checks 5 s apart (the
  // NodeBalancer's own defaults otherwise; NodeBalancerConfig checkInterval/Timeout/Attempts)
  const healthTiming = ha ? { checkInterval: 5, checkTimeout: 3, checkAttempts: 2 } : {};
  const nbConfig = new linode.NodeBalancerConfig(
    'space-api-nb-config',
    {
      nodebalancerId: id(nb),
      port: tls ? 443 : 80,
      protocol: tls ? 'https' : 'tcp',
      ...(tls ? { sslCert: cfg.apiTlsCertificate, sslKey: cfg.secrets.apiTlsKey } : {}),
      algorithm: 'leastconn',
      check: 'http',
      checkPath: '/readyz',
      ...healthTiming,
    },
    parent.child(),
  );
  // one backend per control VM: the NodeBalancer sends clients to those whose /readyz answers
  const backends = (prefix: string, config: linode.NodeBalancerConfig, label: string, port: number) =>
    controls.map(
      (c, i) =>
        new linode.NodeBalancerNode(
          i === 0 ? prefix : `${prefix}-${i}`,
          {
            nodebalancerId: id(nb),
            configId: id(config),
            label: i === 0 ? label : `${label}-${i}`,
            address: pulumi.interpolate`${c.privateIpAddress}:${port}`,
          },
          parent.child(),
        ),
    );
  backends('space-api-nb-control', nbConfig, 'space-control', API_PORT);
  // the router on the same NodeBalancer, its own port: https (the NodeBalancer terminates TLS with
  // the same certificate) or tcp; streams are long-lived HTTP responses (docs/deployment.md "TLS")
  const routerConfig = new linode.NodeBalancerConfig(
    'space-router-nb-config',
    {
      nodebalancerId: id(nb),
      port: akamaiRouterPort(cfg),
      protocol: tls ? 'https' : 'tcp',
      ...(tls ? { sslCert: cfg.apiTlsCertificate, sslKey: cfg.secrets.apiTlsKey } : {}),
      algorithm: 'leastconn',
      check: 'http',
      checkPath: '/readyz',
      ...healthTiming,
    },
    parent.child(),
  );
  backends('space-router-nb-control', routerConfig, 'space-control-router', ROUTER_PORT);
  const apiUrl = cfg.vmTlsHostnames
    ? pulumi.output(`https://${cfg.vmTlsHostnames.api}`)
    : pulumi.interpolate`${tls ? 'https' : 'http'}://${nb.ipv4}`;
  if (cfg.secrets.bootstrapApiKey) {
    // every pulumi up: what a VM made now would get, written for the VMs that exist
    new VmConfig(
      'space-vm-config',
      {
        apiUrl,
        apiKey: cfg.secrets.bootstrapApiKey,
        // a version bump reaches the VMs too: each moves to it in place (space-version-sync)
        version: cfg.version,
        services: pulumi
          .all([routerUrl, keySha])
          .apply(([url, sha]) =>
            Object.assign(
              controlServiceEnv(controlArgs(url, sha)),
              ...cfg.nodePools.map((pool) => agentServiceEnv(agentArgs(pool))),
            ),
          ),
      },
      parent.child({ dependsOn: [...controls, ...nodes] }),
    );
  }
  return {
    apiUrl,
    routerUrl,
    controlIp: control.ipv4s.apply((ips) => ips[0]),
    ...(ha ? { controlIps: controls.map((c) => c.ipv4s.apply((ips) => ips[0])) } : {}),
    nodeIps: nodes.map((n) => n.ipv4s.apply((ips) => ips[0])),
  };
}

/** `kubernetes` mode: the LKE cluster, its nodes' firewall and the Kubernetes component, as children of `parent`. */
function akamaiLke(parent: CloudStack, cfg: StackConfig, image?: pulumi.Resource): StackOutputs {
  const stack = pulumi.getStack();
  const cluster = new linode.LkeCluster(
    'space-lke',
    {
      label: `space-${stack}`,
      region: cfg.region,
      k8sVersion: cfg.k8sVersion,
      tags: ['space'],
      pools: cfg.nodePools.map((pool) => ({
        type: pool.instanceType,
        count: pool.count,
        labels: { [POOL_LABEL]: pool.name, [NODE_LABEL]: 'true', ...pool.labels },
        tags: ['space', `space-pool-${pool.name}`],
      })),
    },
    parent.child(),
  );
  // no `linodes`: ids captured now go stale when LKE replaces nodes; the space-lke-firewall
  // DaemonSet attaches every node it runs on, new ones included (lke-firewall.ts)
  const nodesFw = new linode.Firewall(
    'space-lke-fw',
    {
      label: `space-lke-fw-${stack}`.slice(0, 32),
      inboundPolicy: 'DROP',
      outboundPolicy: 'ACCEPT',
      inbounds: akamaiFirewallRules(cfg).lke.map((r) => ({ ...r, ipv4s: [...r.ipv4s] })),
      tags: ['space'],
    },
    parent.child(),
  );
  // the kubeconfig output is base64 and secret (docs/deployment.md "Akamai (Linode)")
  const kubeconfig = pulumi.secret(
    cluster.kubeconfig.apply((b64) => Buffer.from(b64, 'base64').toString('utf8')),
  );
  // every Kubernetes object goes through this provider: with space:imageBuild, after the push
  const provider = new k8s.Provider('lke', { kubeconfig }, parent.child({ dependsOn: image ? [image] : [] }));
  const runtimeArgs = runtimeArgsFromConfig(cfg, { exposure: lkeExposure(cfg.clientCidrs) });
  const runtime = new Runtime(
    'space',
    runtimeArgs,
    parent.child({
      providers: [provider],
    }),
  );
  const K8S = {
    Secret: k8s.core.v1.Secret,
    ConfigMap: k8s.core.v1.ConfigMap,
    DaemonSet: k8s.apps.v1.DaemonSet,
  } as const;
  for (const { role, object } of lkeFirewallObjects({
    namespace: 'space',
    firewallId: nodesFw.id,
    token: cfg.secrets.lkeFirewallToken!,
    image: imageRef(cfg.imageRepository, cfg.version),
    version: cfg.version,
    pullSecrets: pullSecretsOf(runtimeArgs.imagePull),
  })) {
    const { apiVersion: _v, kind, ...body } = object as { apiVersion: string; kind: keyof typeof K8S };
    new K8S[kind](
      `space-${role}`,
      body as never,
      parent.child({
        provider,
        dependsOn: [runtime],
        ...(kind === 'Secret' ? { additionalSecretOutputs: ['data', 'stringData'] } : {}),
      }),
    );
  }
  return {
    kubeconfig,
    namespace: runtime.namespace,
    apiLoadBalancer: runtime.apiService.status.loadBalancer.ingress,
    // point space:routerUrl (or the router TLS hostname) here
    routerLoadBalancer: runtime.routerService.status.loadBalancer.ingress,
  };
}
