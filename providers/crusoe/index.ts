/**
 * Crusoe, `vm` mode: a VPC subnet, firewall rules (only the API and the data plane open to
 * clients; Redis only inside the subnet; SSH only from `space:sshCidrs`), a control VM (API +
 * Redis) and the pool VMs with nested virtualisation, all through the dynamic provider. The
 * startup script is the systemd plan as a shell script (Crusoe has no cloud-init field).
 */
import * as pulumi from '@pulumi/pulumi';
import type { StackConfig } from '../../stacks/config.ts';
import { isVmmDriver } from '../node-pool.ts';
import { AGENT_PORT, API_PORT, REDIS_PORT } from '../runtime-settings.ts';
import { agentPlan, controlPlan, toShellScript } from '../systemd/cloud-init.ts';
import { controlAddress } from '../vm-network.ts';
import { FirewallRule, Instance, Subnet } from './provider.ts';

/** The firewall rules of a Crusoe stack (name, protocol, sources, ports). Pure, for tests. */
export function crusoeFirewallRules(cfg: StackConfig) {
  const rules = [
    { name: 'space-api', sources: cfg.clientCidrs, ports: [String(API_PORT)] },
    { name: 'space-data-plane', sources: cfg.clientCidrs, ports: [String(AGENT_PORT)] },
    { name: 'space-redis-private', sources: [cfg.privateCidr], ports: [String(REDIS_PORT)] },
    { name: 'space-dispatch-private', sources: [cfg.privateCidr], ports: [String(AGENT_PORT)] },
    ...(cfg.sshCidrs.length ? [{ name: 'space-ssh', sources: cfg.sshCidrs, ports: ['22'] }] : []),
  ];
  return rules.filter((r) => r.sources.length > 0);
}

/** Deploys SPACE on Crusoe VMs. */
export function deployCrusoe(cfg: StackConfig): Record<string, pulumi.Input<unknown>> {
  const common = { projectId: cfg.crusoeProjectId };
  const subnet = new Subnet('space-subnet', {
    ...common,
    name: `space-${pulumi.getStack()}`,
    cidr: cfg.privateCidr,
    location: cfg.region,
    vpcNetworkId: cfg.crusoeVpcNetworkId,
    natGatewayEnabled: true,
  });
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
        direction: 'ingress',
        protocols: ['tcp'],
        sources: [...r.sources],
        destinations: [cfg.privateCidr],
        destinationPorts: r.ports,
      },
      { dependsOn: [previous] },
    );
  }
  const vmCommon = {
    ...common,
    location: cfg.region,
    image: cfg.crusoeImage,
    sshPublicKey: cfg.sshPublicKey!,
    subnetId: subnet.id,
  };
  const vmArgs = { version: cfg.version, imageRepository: cfg.imageRepository, privateCidr: cfg.privateCidr };
  // a version bump must not replace VMs (that would kill their sandboxes): upgrades run
  // `space-upgrade` on each VM (docs/deployment.md), so the startup script is ignored after creation
  const keepVms = { ignoreChanges: ['startupScript'], dependsOn: [previous] };
  const control = new Instance(
    'space-control',
    {
      ...vmCommon,
      name: `space-control-${pulumi.getStack()}`,
      type: cfg.controlInstanceType,
      privateAddress: controlAddress(cfg.privateCidr),
      startupScript: toShellScript(controlPlan({ ...vmArgs, apiEnv: cfg.apiEnv })),
      nestedVirtualization: false,
    },
    keepVms,
  );
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
            startupScript: toShellScript(
              agentPlan({
                ...vmArgs,
                pool,
                controlAddress: controlAddress(cfg.privateCidr),
                gatewayEnabled: cfg.gatewayEnabled,
                gatewayUpstreamDns: cfg.gatewayUpstreamDns,
                gatewayDenyCidrs: cfg.gatewayDenyCidrs,
                gatewayEnv: cfg.gatewayEnv,
                agentEnv: cfg.agentEnv,
              }),
            ),
            nestedVirtualization: isVmmDriver(pool.driver),
          },
          keepVms,
        ),
    ),
  );
  return { controlVm: control.id, nodeVms: nodes.map((n) => n.id) };
}
