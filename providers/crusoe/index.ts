/**
 * Crusoe, `vm` mode: a VPC subnet, firewall rules (only the API and the router open to
 * clients, both on the control VM; agents only inside the subnet; Redis only inside the subnet; SSH only from `space:sshCidrs`; egress from the subnet
 * to anywhere), a control VM (API + Redis) and the pool VMs with nested virtualisation, all
 * through the dynamic provider. The startup script is the systemd plan as a bash script (Crusoe
 * has no cloud-init field); Crusoe runs it at every boot, so it provisions once and then exits.
 *
 * The control VM's private address is the API's to choose (computed in the Terraform provider):
 * the agents' scripts are rendered from the address the created VM reports.
 */
import * as pulumi from '@pulumi/pulumi';
import { CloudStack, type CloudStackArgs, type StackOutputs } from '../cloud-stack.ts';
import { isVmmDriver } from '../node-pool.ts';
import { AGENT_PORT, API_PORT, REDIS_PORT, ROUTER_PORT, SENTINEL_PORT } from '../runtime-settings.ts';
import type { StackConfig } from '../stack-config.ts';
import {
  type AgentArgs,
  agentPlan,
  agentServiceEnv,
  type ControlArgs,
  controlPlan,
  controlServiceEnv,
  LETS_ENCRYPT_DIRECTORY,
  toShellScript,
} from '../systemd/cloud-init.ts';
import { SELF_ADDRESS, type VmHa } from '../systemd/plan.ts';
import { VmConfig } from '../systemd/vm-config.ts';
import { bootstrapKeySha256, controlVmSecrets, vmSecretArgs, vmSigningKey } from '../vm-network.ts';
import { instancePrivateIpv4, instancePublicIpv4 } from './crud.ts';
import { FirewallRule, Instance, Subnet } from './provider.ts';

/** One Crusoe VPC firewall rule, plain values. */
export interface CrusoeRule {
  readonly name: string;
  readonly direction: 'ingress' | 'egress';
  readonly protocols: readonly string[];
  readonly sources: readonly string[];
  readonly destinations: readonly string[];
  readonly ports: readonly string[];
}

/**
 * The firewall rules of a Crusoe stack. Pure, for tests. Custom VPCs deny all egress until egress
 * rules exist (Crusoe networking docs, "VPC firewall rules"; docs/deployment.md "What only a real cloud
 * account can confirm"): without `space-egress` the VMs could not install packages, pull the image, or carry any
 * sandbox egress through the gateway. `1-65535` is how the Terraform provider spells "all ports"
 * (`vpc_firewall_rule` replaces `*` with it).
 */
export function crusoeFirewallRules(cfg: StackConfig): CrusoeRule[] {
  const ingress = (name: string, sources: readonly string[], port: number | string): CrusoeRule => ({
    name,
    direction: 'ingress',
    protocols: ['tcp'],
    sources,
    destinations: [cfg.privateCidr],
    ports: [String(port)],
  });
  const rules = [
    // clients reach the API and the router (both on the control VM), never an agent
    ingress('space-api', cfg.clientCidrs, API_PORT),
    ingress('space-router', cfg.clientCidrs, ROUTER_PORT),
    // ACME HTTP-01: the CA validates from addresses it does not publish, so port 80 is open to all
    // (only certbot listens there, while it asks for or renews the certificate)
    ...(cfg.acme ? [ingress('space-acme-http', ['0.0.0.0/0'], 80)] : []),
    ingress('space-redis-private', [cfg.privateCidr], REDIS_PORT),
    // several control VMs: their sentinels, and every VM asking them, inside the subnet
    ...(cfg.controlPlaneReplicas > 1
      ? [ingress('space-sentinel-private', [cfg.privateCidr], SENTINEL_PORT)]
      : []),
    // dispatch (API) and forwarding (router) to the agents, inside the subnet only
    ingress('space-dispatch-private', [cfg.privateCidr], AGENT_PORT),
    ...(cfg.sshCidrs.length ? [ingress('space-ssh', cfg.sshCidrs, 22)] : []),
    {
      name: 'space-egress',
      direction: 'egress' as const,
      protocols: ['tcp', 'udp'],
      sources: [cfg.privateCidr],
      destinations: ['0.0.0.0/0'],
      ports: ['1-65535'],
    },
  ];
  return rules.filter((r) => r.sources.length > 0);
}

/** The control VM's private address, from the VM the API created (fails loudly when absent). */
export function controlPrivateAddress(resource: unknown): string {
  const address = instancePrivateIpv4(resource);
  if (!address)
    throw new Error(
      'crusoe: the control VM reports no private IPv4 (network_interfaces[0].ips[0].private_ipv4)',
    );
  return address;
}

/** The control VM's public address, from the VM the API created (fails loudly when absent). */
export function controlPublicAddress(resource: unknown): string {
  const address = instancePublicIpv4(resource);
  if (!address)
    throw new Error(
      'crusoe: the control VM reports no public IPv4 (network_interfaces[0].ips[0].public_ipv4)',
    );
  return address;
}

/** The API's URL on Crusoe: its TLS name when `space:tlsHostnames` is set, else the control VM's address. Pure. */
export function crusoeApiUrl(
  cfg: Pick<StackConfig, 'acme'>,
  names: { api?: string },
  publicIp: string,
): string {
  return cfg.acme && names.api ? `https://${names.api}:${API_PORT}` : `http://${publicIp}:${API_PORT}`;
}

/** Arguments of {@link CrusoeStack}. */
export type CrusoeStackArgs = CloudStackArgs;

/** `space:crusoe:Stack`: SPACE on Crusoe VMs (`vm` mode), through the dynamic provider. */
export class CrusoeStack extends CloudStack {
  readonly outputs: StackOutputs;

  constructor(name: string, args: CrusoeStackArgs, opts?: pulumi.ComponentResourceOptions) {
    super('crusoe', name, opts);
    const { config: cfg, image } = args;
    const common = { projectId: cfg.crusoeProjectId };
    const subnet = new Subnet(
      'space-subnet',
      {
        ...common,
        name: `space-${pulumi.getStack()}`,
        cidr: cfg.privateCidr,
        location: cfg.region,
        vpcNetworkId: cfg.crusoeVpcNetworkId,
        natGatewayEnabled: true,
      },
      this.child(),
    );
    // Crusoe cannot create subnets and firewall rules concurrently: chain them
    let previous: pulumi.Resource = subnet;
    for (const r of crusoeFirewallRules(cfg)) {
      previous = new FirewallRule(
        r.name,
        {
          ...common,
          name: `${r.name}-${pulumi.getStack()}`,
          vpcNetworkId: cfg.crusoeVpcNetworkId,
          action: 'allow',
          direction: r.direction,
          protocols: [...r.protocols],
          sources: [...r.sources],
          destinations: [...r.destinations],
          destinationPorts: [...r.ports],
        },
        this.child({ dependsOn: [previous] }),
      );
    }
    const vmCommon = {
      ...common,
      location: cfg.region,
      image: cfg.crusoeImage,
      sshPublicKey: cfg.sshPublicKey!,
      subnetId: subnet.id,
    };
    const vmArgs = {
      version: cfg.version,
      imageRepository: cfg.imageRepository,
      privateCidr: cfg.privateCidr,
    };
    // a version bump must not replace VMs (that would kill their sandboxes): upgrades run
    // `space-upgrade` on each VM (docs/deployment.md), so the startup script is ignored after creation
    // and with space:imageBuild, no VM is made before its image is pushed
    const keepVms = { ignoreChanges: ['startupScript'], dependsOn: [previous, ...(image ? [image] : [])] };
    const names = { api: cfg.acme?.hostnames[0] };
    // the TLS unit is always there (no names: plain HTTP), so TLS can be turned on later through
    // the VM configuration without replacing the control VM
    const acme = cfg.acme ?? { hostnames: [], email: '', server: LETS_ENCRYPT_DIRECTORY };
    // without a name the router's public address is not known before the VM exists: routerUrl is required
    const routerUrl = cfg.routerUrl ?? `https://${cfg.acme!.hostnames.at(-1)}:${ROUTER_PORT}`;
    const keySha = bootstrapKeySha256(cfg);
    // the Redis password and pull credentials: every startup script that holds them is a secret
    // input (the only channel into a new VM)
    const vmSecrets = vmSecretArgs(cfg);
    const controlArgs = (sha: string | undefined): Omit<ControlArgs, 'redisPassword'> => ({
      ...vmArgs,
      apiEnv: cfg.apiEnv,
      routerUrl,
      acme,
      ...(sha ? { bootstrapKeySha256: sha } : {}),
    });
    // several control VMs (space:controlPlane): Crusoe's API chooses their addresses, so the
    // first is made first (its own rendering names itself as the first primary) and the others
    // after it, from its address; the nodes, made after all of them, know every one
    const n = cfg.controlPlaneReplicas;
    const signingKey = n > 1 ? vmSigningKey(cfg) : pulumi.output(undefined);
    const haOf = (addrs: string[]): VmHa | undefined =>
      n > 1
        ? { controlVms: n, controlAddresses: addrs, initialPrimary: addrs[0] ?? SELF_ADDRESS }
        : undefined;
    const controlVm = (i: number, known: pulumi.Input<string[]>) =>
      new Instance(
        i === 0 ? 'space-control' : `space-control-${i}`,
        {
          ...vmCommon,
          name: i === 0 ? `space-control-${pulumi.getStack()}` : `space-control-${i}-${pulumi.getStack()}`,
          type: cfg.controlInstanceType,
          startupScript: pulumi.all([keySha, vmSecrets, signingKey, known]).apply(([sha, s, key, addrs]) => {
            const ha = haOf(addrs);
            return toShellScript(
              controlPlan({
                ...controlArgs(sha),
                ...(ha ? { ha } : {}),
                ...controlVmSecrets(s, i),
                // its own address is the API's to choose: the scripts find it at each start
                ...(key ? { self: { address: SELF_ADDRESS, signingKey: key } } : {}),
              }),
            );
          }),
          nestedVirtualization: false,
        },
        this.child(keepVms),
      );
    const control = controlVm(0, []);
    const firstAddress = control.resource.apply(controlPrivateAddress);
    const controls = [
      control,
      ...Array.from({ length: n - 1 }, (_, i) =>
        controlVm(
          i + 1,
          firstAddress.apply((a) => [a]),
        ),
      ),
    ];
    const allAddresses = pulumi.all(controls.map((c) => c.resource.apply(controlPrivateAddress)));
    const agentArgs = (
      pool: (typeof cfg.nodePools)[number],
      controlAddress: string,
      addresses: string[] = [],
    ): Omit<AgentArgs, 'redisPassword'> => ({
      ...vmArgs,
      ...(n > 1 ? { ha: { controlVms: n, controlAddresses: addresses, initialPrimary: addresses[0]! } } : {}),
      pool,
      controlAddress,
      gatewayEnabled: cfg.gatewayEnabled,
      gatewayUpstreamDns: cfg.gatewayUpstreamDns,
      gatewayDenyCidrs: cfg.gatewayDenyCidrs,
      gatewayEnv: cfg.gatewayEnv,
      agentEnv: cfg.agentEnv,
      agentDrainSeconds: cfg.agentDrainSeconds,
    });
    const nodes = cfg.nodePools.flatMap((pool) =>
      Array.from(
        { length: pool.count },
        (_, i) =>
          new Instance(
            `space-node-${pool.name}-${i}`,
            {
              ...vmCommon,
              name: `space-node-${pool.name}-${i}-${pulumi.getStack()}`,
              type: pool.instanceType,
              startupScript: pulumi
                .all([control.resource, vmSecrets, allAddresses])
                .apply(([resource, s, addrs]) =>
                  toShellScript(
                    agentPlan({ ...agentArgs(pool, controlPrivateAddress(resource), addrs), ...s }),
                  ),
                ),
              nestedVirtualization: isVmmDriver(pool.driver),
            },
            this.child(keepVms),
          ),
      ),
    );
    const publicIp = control.resource.apply(controlPublicAddress);
    const apiUrl = publicIp.apply((ip) => crusoeApiUrl(cfg, names, ip));
    if (cfg.secrets.bootstrapApiKey) {
      // every pulumi up: what a VM made now would get, written for the VMs that exist
      new VmConfig(
        'space-vm-config',
        {
          apiUrl,
          ...(cfg.acme ? { plainApiUrl: pulumi.interpolate`http://${publicIp}:${API_PORT}` } : {}),
          apiKey: cfg.secrets.bootstrapApiKey,
          // a version bump reaches the VMs too: each moves to it in place (space-version-sync)
          version: cfg.version,
          services: pulumi.all([control.resource, keySha, allAddresses]).apply(([resource, sha, addrs]) => {
            const ha = haOf(addrs);
            // the same env a control VM made now gets (its rendering has `ha` too)
            return Object.assign(
              controlServiceEnv({ ...controlArgs(sha), ...(ha ? { ha } : {}) }),
              ...cfg.nodePools.map((pool) =>
                agentServiceEnv(agentArgs(pool, controlPrivateAddress(resource))),
              ),
            );
          }),
        },
        this.child({ dependsOn: [...controls, ...nodes] }),
      );
    }
    this.outputs = {
      apiUrl,
      routerUrl,
      controlVm: control.id,
      controlPublicIp: publicIp,
      controlPrivateAddress: control.resource.apply(controlPrivateAddress),
      nodeVms: nodes.map((n) => n.id),
      ...(n > 1
        ? {
            controlVms: controls.map((c) => c.id),
            controlPublicIps: controls.map((c) => c.resource.apply(controlPublicAddress)),
          }
        : {}),
    };
    this.registerOutputs(this.outputs);
  }
}
