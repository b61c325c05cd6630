/**
 * Every stack file in stacks/ rendered under Pulumi's mock runtime, with policies phrased as the
 * properties that matter (issue 4): schemas, secrets, firewalls, KVM, upgrades.
 */
import { createHash, generateKeyPairSync } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { parse } from 'yaml';
import { catalogue } from '../providers/catalogue.ts';
import { GATEWAY_PORTS } from '../providers/runtime-settings.ts';
import { schemaProblems } from '../providers/testing/k8s-schema.ts';
import {
  isWireSecret,
  plaintextOccurrences,
  type RecordedResource,
  unwrapSecrets,
} from '../providers/testing/mocks.ts';
import { loadAgentConfig } from '../runtime/agent/config.ts';
import { createDriver } from '../runtime/agent/drivers/index.ts';
import type { DriverName } from '../runtime/core/drivers.ts';
import { renderEnvFile } from '../runtime/core/env-file.ts';
import { cidrContains } from '../runtime/core/net-address.ts';
import { CONFIG_KEYS, loadStackConfig, StackConfigError } from './config.ts';
import {
  CA,
  NEEDLES,
  type Raw,
  render,
  SECRETS,
  VARIANTS,
  withDeploymentKey,
  withSecrets,
} from './test-stacks.ts';

type Obj = Record<string, unknown>;
/** The problems the stack configuration `raw` is refused with (empty when it loads). */
const fails = (given: Raw) => {
  const raw = withDeploymentKey(given);
  try {
    loadStackConfig((k) => raw[k]);
  } catch (err) {
    if (err instanceof StackConfigError) return err.problems;
    throw err;
  }
  return [];
};
const firewallInbounds = (r: RecordedResource[]) =>
  r
    .filter((x) => x.type === 'linode:index/firewall:Firewall')
    .map(
      (x) =>
        unwrapSecrets(x.inputs) as {
          inboundPolicy: string;
          inbounds?: { ports?: string; ipv4s: string[]; protocol: string }[];
        },
    );

describe.each(Object.entries(VARIANTS))('stack %s under the mock runtime', (_name, base) => {
  const raw = withSecrets(base);

  it('renders, and every Kubernetes object is valid against the Kubernetes schemas', async () => {
    const recorded = await render(raw);
    expect(recorded.length).toBeGreaterThan(3);
    const k8sObjects = recorded
      .filter((r) => r.type.startsWith('kubernetes:') && r.type !== 'pulumi:providers:kubernetes')
      // CoreWeave's NodePool is a custom resource with no public schema here
      .filter((r) => r.type !== 'kubernetes:compute.coreweave.com/v1alpha1:NodePool')
      .map((r) => unwrapSecrets(r.inputs) as Obj);
    expect(k8sObjects.flatMap(schemaProblems)).toEqual([]);
  });

  it('no secret appears in plaintext in any resource input or user data', async () => {
    const recorded = await render(raw);
    const leaks = recorded.flatMap((r) =>
      NEEDLES.flatMap((n) => plaintextOccurrences(r.inputs, n).map((p) => `${r.type} ${r.name}: ${p}`)),
    );
    expect(leaks).toEqual([]);
  });

  it('firewalls drop inbound by default; Redis is never open beyond the private network', async () => {
    const recorded = await render(raw);
    for (const fw of firewallInbounds(recorded)) {
      expect(fw.inboundPolicy).toBe('DROP');
      for (const rule of fw.inbounds ?? []) {
        // clients reach the API and the router only (NodeBalancer 80/443/8082/8443, API 8080, router
        // 8082); never an agent (8081), Redis or a gateway
        if (rule.ipv4s.includes('0.0.0.0/0'))
          expect(['80', '443', '8080', '8082', '8443']).toContain(rule.ports);
        if (rule.ipv4s.includes('0.0.0.0/0')) expect(portsCover(rule.ports, 8081)).toBe(false);
        if (rule.ports === '6379') expect(rule.ipv4s).toEqual([raw.privateCidr]);
        if (rule.ports === '22') expect(rule.ipv4s).not.toContain('0.0.0.0/0');
      }
    }
    for (const r of recorded.filter((x) => x.type === 'pulumi-nodejs:dynamic/crusoe:FirewallRule')) {
      const i = r.inputs as { sources: string[]; destinationPorts: string[]; direction: string };
      if (i.direction === 'egress') {
        // egress leaves from the subnet only
        expect(i.sources).toEqual([raw.privateCidr]);
        continue;
      }
      expect(i.direction).toBe('ingress');
      if (i.destinationPorts.includes('6379')) expect(i.sources).toEqual([raw.privateCidr]);
      if (i.sources.includes('0.0.0.0/0'))
        expect(['8080', '8082']).toEqual(expect.arrayContaining(i.destinationPorts));
    }
    for (const r of recorded.filter((x) => x.type === 'kubernetes:core/v1:Service')) {
      const s = unwrapSecrets(r.inputs) as { metadata: { name: string }; spec: { type: string } };
      if (s.metadata.name === 'space-redis') expect(s.spec.type).toBe('ClusterIP');
    }
  });
});

const GATEWAY_PORT_LIST: number[] = Object.values(GATEWAY_PORTS);
/** True when a firewall `ports` field (`"80"`, `"80,443"`, `"30000-32767"`, absent = all) covers `port`. */
function portsCover(ports: string | undefined, port: number): boolean {
  if (ports === undefined || ports === '') return true;
  return ports.split(',').some((p) => {
    const [lo, hi = lo] = p.trim().split('-').map(Number) as [number, number?];
    return port >= lo! && port <= hi!;
  });
}
/** True for a CIDR inside RFC 1918 space (a private network, never the internet). */
function isPrivateCidr(cidr: string): boolean {
  return ['10.0.0.0/8', '172.16.0.0/12', '192.168.0.0/16'].some((rfc1918) => cidrContains(rfc1918, cidr));
}
/** Decoded user data / startup script of every VM, by resource name. */
function vmScripts(recorded: RecordedResource[]): Record<string, string> {
  const out: Record<string, string> = {};
  for (const r of recorded) {
    if (r.type === 'linode:index/instance:Instance')
      out[r.name] = Buffer.from(
        (r.inputs['metadatas'] as { userData: string }[])[0]!.userData,
        'base64',
      ).toString();
    if (r.type === 'pulumi-nodejs:dynamic/crusoe:Instance') out[r.name] = String(r.inputs['startupScript']);
  }
  return out;
}
const podSpecOf = (r: RecordedResource) =>
  (((unwrapSecrets(r.inputs) as Obj)['spec'] as Obj)['template'] as Obj)['spec'] as Obj;
const componentOf = (r: RecordedResource) =>
  (((unwrapSecrets(r.inputs) as Obj)['metadata'] as Obj)['labels'] as Record<string, string>)[
    'app.kubernetes.io/component'
  ];

describe.each(Object.entries(VARIANTS))('egress gateway of stack %s', (_name, base) => {
  const raw = withSecrets(base);

  it('the gateway is on by default and runs on every agent node, sharing its control socket', async () => {
    const { gatewayEnabled: _g, ...noKey } = raw;
    const recorded = await render(noKey);
    const vms = vmScripts(recorded);
    const nodes = Object.entries(vms).filter(([name]) => name.startsWith('space-node-'));
    for (const [name, script] of nodes) {
      expect(script, name).toContain('/etc/systemd/system/space-gateway.service');
      expect(script, name).toContain('SPACE_GATEWAY_CONTROL_SOCKET=/run/space/gateway.sock');
    }
    expect(vms['space-control'] ?? '').not.toContain('space-gateway');
    const ds = recorded.filter((r) => r.type === 'kubernetes:apps/v1:DaemonSet');
    const agents = ds.filter((r) => componentOf(r) === 'agent');
    const gateways = ds.filter((r) => componentOf(r) === 'gateway');
    expect(nodes.length + agents.length).toBeGreaterThan(0);
    for (const a of agents) {
      const g = gateways.find(
        (x) => JSON.stringify(podSpecOf(x)['nodeSelector']) === JSON.stringify(podSpecOf(a)['nodeSelector']),
      );
      expect(g, a.name).toBeDefined();
      expect(podSpecOf(g!)['tolerations']).toEqual(podSpecOf(a)['tolerations']);
    }
  });

  it('no gateway port is open to the internet: cloud firewalls never admit them from outside the private network, and every node closes them on the host', async () => {
    const recorded = await render(raw);
    for (const fw of firewallInbounds(recorded))
      for (const rule of fw.inbounds ?? [])
        if (GATEWAY_PORT_LIST.some((p) => portsCover(rule.ports, p)))
          expect(rule.ipv4s.every(isPrivateCidr), `${JSON.stringify(rule)}`).toBe(true);
    for (const r of recorded.filter((x) => x.type === 'pulumi-nodejs:dynamic/crusoe:FirewallRule')) {
      const i = r.inputs as { sources: string[]; destinationPorts: string[] };
      if (i.destinationPorts.some((p) => GATEWAY_PORT_LIST.some((g) => portsCover(p, g))))
        expect(i.sources.every(isPrivateCidr)).toBe(true);
    }
    // the host firewall: VMs apply it at boot; gateway pods install it before the gateway starts
    for (const [name, script] of Object.entries(vmScripts(recorded)).filter(([n]) =>
      n.startsWith('space-node-'),
    )) {
      expect(script, name).toContain('tcp dport { 15053, 15080, 15443 } counter drop');
      expect(script, name).toContain('ExecStart=/usr/sbin/nft -f /etc/space/gateway-guard.nft');
    }
    for (const g of recorded.filter(
      (r) => r.type === 'kubernetes:apps/v1:DaemonSet' && componentOf(r) === 'gateway',
    )) {
      const init = (podSpecOf(g)['initContainers'] as Obj[])[0]!;
      expect(init['command']).toEqual(['nft', '-f', '/etc/space/nft/guard.nft']);
      for (const c of podSpecOf(g)['containers'] as Obj[]) expect(c['ports']).toBeUndefined();
    }
  });

  it('gatewayEnabled false: no gateway anywhere, and agents get no control socket', async () => {
    const { gatewayCaCertificate: _c, gatewayCaKey: _k, ...rest } = raw;
    const recorded = await render({ ...rest, gatewayEnabled: 'false' });
    const text =
      JSON.stringify(recorded.map((r) => unwrapSecrets(r.inputs))) +
      Object.values(vmScripts(recorded)).join('\n');
    expect(text).not.toContain('SPACE_GATEWAY_CONTROL_SOCKET');
    expect(text).not.toContain('space-gateway');
  });
});

describe('cloud-specific policies', () => {
  it('crusoe: every pool VM asks for nested virtualisation; the control VM does not', async () => {
    const recorded = await render(withSecrets(VARIANTS['crusoe']!));
    const vms = recorded.filter((r) => r.type === 'pulumi-nodejs:dynamic/crusoe:Instance');
    const nested = vms.map((v) => [
      v.name,
      (v.inputs as { nestedVirtualization: boolean }).nestedVirtualization,
    ]);
    expect(nested.sort()).toEqual([
      ['space-control', false],
      ['space-node-default-0', true],
      ['space-node-default-1', true],
    ]);
    expect(recorded.some((r) => r.type === 'pulumi-nodejs:dynamic/crusoe:Subnet')).toBe(true);
    // the serialized provider captures no credentials
    for (const v of vms)
      expect(String(v.inputs['__provider'] ?? '')).not.toMatch(/CRUSOE_SECRET_KEY=|secretKey:/);
  });

  it('crusoe: the subnet may reach the internet (custom VPCs deny egress), no VM pins its private address, and agents are told the address the API gave the control VM', async () => {
    const recorded = await render(withSecrets(VARIANTS['crusoe']!));
    const rules = recorded
      .filter((r) => r.type === 'pulumi-nodejs:dynamic/crusoe:FirewallRule')
      .map((r) => r.inputs as { direction: string; destinations: string[]; protocols: string[] });
    expect(rules.filter((r) => r.direction === 'egress')).toEqual([
      expect.objectContaining({ destinations: ['0.0.0.0/0'], protocols: ['tcp', 'udp'] }),
    ]);
    const vms = recorded.filter((r) => r.type === 'pulumi-nodejs:dynamic/crusoe:Instance');
    for (const v of vms) expect(Object.keys(v.inputs)).not.toContain('privateAddress');
    // the mock API gives the control VM an address off the old pinned one (.10)
    const control = vms.find((v) => v.name === 'space-control')!;
    const scripts = vmScripts(recorded);
    const chosen = /SPACE_REDIS_URL=redis:\/\/([0-9.]+):6379/.exec(scripts['space-node-default-0']!)?.[1];
    expect(chosen).toMatch(/^10\.77\.128\.\d+$/);
    expect(chosen).not.toBe('10.77.128.10');
    expect(control.name).toBe('space-control');
  });

  it('akamai vm: user data is base64 cloud-init; the API and the router sit behind the NodeBalancer, and the API hands out its router port', async () => {
    const recorded = await render(withSecrets(VARIANTS['akamai']!));
    const vms = recorded.filter((r) => r.type === 'linode:index/instance:Instance');
    expect(vms).toHaveLength(3);
    for (const vm of vms) {
      const ud = Buffer.from(
        (vm.inputs['metadatas'] as { userData: string }[])[0]!.userData,
        'base64',
      ).toString();
      expect(ud.startsWith('#cloud-config\n')).toBe(true);
      // agents register their private address: the router reaches them, clients never do
      if (vm.name !== 'space-control') expect(ud).toContain('ip -4 -o addr show to 10.77.128.0/24');
    }
    expect(
      recorded
        .filter((r) => r.type.startsWith('linode:index/nodeBalancer'))
        .map((r) => r.type)
        .sort(),
    ).toEqual([
      'linode:index/nodeBalancer:NodeBalancer',
      'linode:index/nodeBalancerConfig:NodeBalancerConfig',
      'linode:index/nodeBalancerConfig:NodeBalancerConfig',
      'linode:index/nodeBalancerNode:NodeBalancerNode',
      'linode:index/nodeBalancerNode:NodeBalancerNode',
    ]);
    const nodesOf = recorded
      .filter((r) => r.type === 'linode:index/nodeBalancerNode:NodeBalancerNode')
      .map((r) => String(r.inputs['address']).split(':')[1])
      .sort();
    expect(nodesOf).toEqual(['8080', '8082']);
    const control = vms.find((v) => v.name === 'space-control')!;
    const ud = Buffer.from(
      (control.inputs['metadatas'] as { userData: string }[])[0]!.userData,
      'base64',
    ).toString();
    expect(ud).toMatch(/SPACE_ROUTER_URL=http:\/\/[0-9.]+:8082/);
    expect(ud).toContain('/etc/systemd/system/space-router.service');
  });

  it('akamai lke: the API load balancer admits only space:clientCidrs through the Linode firewall ACL annotation (the CCM ignores loadBalancerSourceRanges)', async () => {
    const recorded = await render(
      withSecrets({
        ...VARIANTS['akamai-lke'],
        clientCidrs: JSON.stringify(['198.51.100.0/24', '203.0.113.7/32']),
      }),
    );
    const api = unwrapSecrets(recorded.find((r) => r.name === 'space-api-svc')!.inputs) as {
      metadata: { annotations: Record<string, string> };
      spec: Obj;
    };
    expect(api.spec['type']).toBe('LoadBalancer');
    expect(api.spec['loadBalancerSourceRanges']).toBeUndefined();
    expect(
      JSON.parse(api.metadata.annotations['service.beta.kubernetes.io/linode-loadbalancer-firewall-acl']!),
    ).toEqual({
      allowList: { ipv4: ['198.51.100.0/24', '203.0.113.7/32'] },
    });
  });

  it('akamai lke: the nodes’ firewall is not attached by node id (ids go stale when LKE replaces nodes); a DaemonSet on every node attaches each node, with its token from a Secret', async () => {
    const recorded = await render(withSecrets(VARIANTS['akamai-lke']!));
    const fw = recorded.find((r) => r.name === 'space-lke-fw')!;
    expect(fw.inputs['linodes']).toBeUndefined();
    expect(recorded.some((r) => r.type === 'linode:index/firewallDevice:FirewallDevice')).toBe(false);
    const ds = unwrapSecrets(recorded.find((r) => r.name === 'space-lke-firewall')!.inputs) as Obj;
    const pod = podSpecOf({ inputs: ds } as unknown as RecordedResource);
    expect(pod['tolerations']).toEqual([{ operator: 'Exists' }]);
    expect(pod['nodeSelector']).toBeUndefined();
    const env = (pod['containers'] as Obj[])[0]!['env'] as {
      name: string;
      value?: string;
      valueFrom?: Obj;
    }[];
    // the firewall's id (the mock's ids are numbers as strings)
    expect(env.find((e) => e.name === 'SPACE_LKE_FIREWALL_ID')!.value).toMatch(/^\d+$/);
    expect(env.find((e) => e.name === 'LINODE_TOKEN')!.valueFrom).toEqual({
      secretKeyRef: { name: 'space-lke-firewall', key: 'token' },
    });
    expect(env.find((e) => e.name === 'NODE_NAME')!.valueFrom).toEqual({
      fieldRef: { fieldPath: 'spec.nodeName' },
    });
    const script = unwrapSecrets(recorded.find((r) => r.name === 'space-lke-firewall-script')!.inputs) as {
      data: Record<string, string>;
    };
    expect(script.data['firewall-attach.ts']).toContain('export async function attachNode');
    // the token is refused without LKE
    expect(fails({ ...VARIANTS['akamai'], lkeFirewallToken: 'x' })).toEqual([
      expect.stringContaining('space:lkeFirewallToken: not used in vm mode'),
    ]);
    expect(fails({ ...withSecrets(VARIANTS['akamai-lke']!), lkeFirewallToken: undefined })).toEqual([
      expect.stringContaining('space:lkeFirewallToken: required in kubernetes mode on akamai'),
    ]);
  });

  it('coreweave: the API load balancer is public (annotated) and admits only space:clientCidrs (loadBalancerSourceRanges)', async () => {
    const recorded = await render(
      withSecrets({ ...VARIANTS['coreweave'], clientCidrs: JSON.stringify(['198.51.100.0/24']) }),
    );
    const api = unwrapSecrets(recorded.find((r) => r.name === 'space-api-svc')!.inputs) as {
      metadata: { annotations: Record<string, string> };
      spec: Obj;
    };
    expect(api.metadata.annotations['service.beta.kubernetes.io/coreweave-load-balancer-type']).toBe(
      'public',
    );
    expect(api.spec['loadBalancerSourceRanges']).toEqual(['198.51.100.0/24']);
  });

  it('coreweave: every instance type has KVM unverified (only a preview documents VMs), so a VMM pool needs the explicit opt-in', () => {
    for (const [type, facts] of Object.entries(catalogue.coreweave))
      expect(facts.kvm, type).toBe('unverified');
    const pool = { name: 'a', driver: 'firecracker', instanceType: 'cd-hp-a96-genoa' };
    expect(fails(withSecrets({ ...VARIANTS['coreweave'], nodePools: JSON.stringify([pool]) }))).toEqual([
      expect.stringContaining('KVM on "cd-hp-a96-genoa" is unverified'),
    ]);
    expect(
      fails(
        withSecrets({
          ...VARIANTS['coreweave'],
          nodePools: JSON.stringify([{ ...pool, allowUnverifiedKvm: true }]),
        }),
      ),
    ).toEqual([]);
  });

  it('coreweave: one CKS NodePool per pool, labelled for its agent DaemonSet', async () => {
    const recorded = await render(withSecrets(VARIANTS['coreweave']!));
    const np = recorded.find((r) => r.type === 'kubernetes:compute.coreweave.com/v1alpha1:NodePool')!;
    expect((np.inputs['spec'] as Obj)['nodeLabels']).toMatchObject({ 'space.dev/pool': 'default' });
    const ds = recorded.find((r) => r.name === 'space-agent-default')!;
    const pod = ((ds.inputs['spec'] as Obj)['template'] as Obj)['spec'] as Obj;
    expect(pod['nodeSelector']).toEqual({ 'space.dev/pool': 'default' });
  });
});

describe('configuration validation', () => {
  it('the router URL: required where the router address is not known before it exists; TLS needs issuer and hostnames together', () => {
    expect(fails(withSecrets({ ...VARIANTS['crusoe']!, routerUrl: undefined }))).toEqual([
      expect.stringContaining('space:routerUrl: required on crusoe'),
    ]);
    expect(fails(withSecrets({ ...VARIANTS['coreweave']!, routerUrl: undefined }))).toEqual([
      expect.stringContaining('space:routerUrl: required on coreweave'),
    ]);
    expect(fails(withSecrets({ ...VARIANTS['coreweave']!, routerUrl: 'router.example.com' }))).toEqual([
      expect.stringContaining('must be http(s)://'),
    ]);
    expect(fails(withSecrets({ ...VARIANTS['coreweave-tls']!, tlsHostnames: undefined }))).toEqual(
      expect.arrayContaining([expect.stringContaining('space:tlsIssuer and space:tlsHostnames')]),
    );
    expect(
      fails(withSecrets({ ...VARIANTS['coreweave-tls']!, tlsHostnames: JSON.stringify({ api: 'x' }) })),
    ).toEqual([expect.stringContaining('space:tlsHostnames: must be')]);
    expect(fails(withSecrets(VARIANTS['coreweave-tls']!))).toEqual([]);
    // kind and akamai vm derive it
    expect(fails(withSecrets(VARIANTS['kind']!))).toEqual([]);
    expect(fails(withSecrets(VARIANTS['akamai']!))).toEqual([]);
  });

  it('coreweave with cert-manager TLS: a Certificate custom resource for both names; both services serve HTTPS on 443', async () => {
    const recorded = await render(withSecrets(VARIANTS['coreweave-tls']!));
    const cert = recorded.find((r) => r.type === 'kubernetes:cert-manager.io/v1:Certificate')!;
    expect(cert).toBeDefined();
    const body = unwrapSecrets(cert.inputs) as Obj;
    expect(schemaProblems(body)).toEqual([]);
    expect(body['spec']).toMatchObject({
      secretName: 'space-tls',
      dnsNames: ['api.space.example.com', 'router.space.example.com'],
      issuerRef: { name: 'letsencrypt', kind: 'ClusterIssuer' },
    });
    const svcs = recorded
      .filter((r) => r.type === 'kubernetes:core/v1:Service')
      .map((r) => unwrapSecrets(r.inputs) as { metadata: { name: string }; spec: { ports: Obj[] } });
    for (const name of ['space-api', 'space-router'])
      expect(svcs.find((x) => x.metadata.name === name)!.spec.ports[0]!['port']).toBe(443);
    const api = recorded.find((r) => r.type === 'kubernetes:apps/v1:Deployment' && componentOf(r) === 'api')!;
    const env = (podSpecOf(api)['containers'] as { env: { name: string; value?: string }[] }[])[0]!.env;
    expect(env.find((e) => e.name === 'SPACE_ROUTER_URL')?.value).toBe('https://router.space.example.com');
  });

  it('a VMM driver on a type without verified KVM fails before anything is created, with every problem', () => {
    const problems = fails({
      ...VARIANTS['akamai'],
      nodePools: JSON.stringify([
        { name: 'a', driver: 'firecracker', instanceType: 'g6-dedicated-4' },
        { name: 'b', driver: 'gvisor', instanceType: 'g6-nope' },
      ]),
      version: '',
    });
    expect(problems).toHaveLength(3);
    expect(problems).toEqual(
      expect.arrayContaining([
        expect.stringContaining(
          'space:nodePools[0]: driver "firecracker" needs KVM but KVM on "g6-dedicated-4" is unverified',
        ),
        expect.stringContaining('space:nodePools[1].instanceType: "g6-nope" is not in the akamai catalogue'),
        expect.stringContaining('space:version: required'),
      ]),
    );
  });

  it('opting in after a probe allows a VMM driver on Linode', () => {
    const nodePools = JSON.stringify([
      { name: 'a', driver: 'firecracker', instanceType: 'g6-dedicated-4', allowUnverifiedKvm: true },
    ]);
    expect(fails({ ...VARIANTS['akamai'], nodePools })).toEqual([]);
  });

  it('crusoe refuses Firecracker (Cloud Hypervisor is its only inner hypervisor)', () => {
    const nodePools = JSON.stringify([{ name: 'a', driver: 'firecracker', instanceType: 'c1a.8x' }]);
    expect(fails({ ...VARIANTS['crusoe'], nodePools })).toEqual([
      expect.stringContaining('crusoe cannot run "firecracker"'),
    ]);
  });

  it('kubernetes mode needs the signing key and a Redis password; overrides of deployment-owned settings are refused', () => {
    const problems = fails({
      ...VARIANTS['kind'],
      agentEnv: JSON.stringify({ SPACE_DRIVER: 'x', SPACE_NOPE: '1' }),
    });
    expect(problems).toEqual(
      expect.arrayContaining([
        expect.stringMatching(/^space:signingKey: required/),
        expect.stringMatching(/^space:redisPassword: required/),
        'space:agentEnv.SPACE_DRIVER: set by the deployment; cannot be overridden',
        'space:agentEnv.SPACE_NOPE: not a agent setting (see README.md)',
      ]),
    );
  });

  it('kubernetes mode with the gateway needs a valid CA; vm mode refuses one (each node makes its own)', () => {
    const { gatewayCaCertificate: _c, gatewayCaKey: _k, ...noCa } = withSecrets(VARIANTS['kind']!);
    expect(fails(noCa)).toEqual([
      expect.stringMatching(/^space:gatewayCaCertificate and space:gatewayCaKey: required/),
    ]);
    expect(fails({ ...noCa, gatewayEnabled: 'false' })).toEqual([]);
    const other = generateKeyPairSync('ec', { namedCurve: 'P-256' }).privateKey.export({
      type: 'pkcs8',
      format: 'pem',
    });
    expect(fails({ ...noCa, gatewayCaCertificate: CA.certPem, gatewayCaKey: other.toString() })).toEqual([
      'space:gatewayCaCertificate/gatewayCaKey: deployment CA key does not match its certificate',
    ]);
    expect(
      fails({ ...VARIANTS['akamai'], gatewayCaCertificate: CA.certPem, gatewayCaKey: CA.keyPem }),
    ).toEqual([
      expect.stringMatching(/^space:gatewayCaCertificate: not used in vm mode/),
      expect.stringMatching(/^space:gatewayCaKey: not used in vm mode/),
    ]);
  });

  it('gateway settings are checked: resolvers, deny CIDRs that still cover the deployment, gatewayEnv', () => {
    expect(
      fails({
        ...VARIANTS['crusoe'],
        gatewayUpstreamDns: JSON.stringify(['10.77.128.2:53', '[2606:4700:4700::1111]:53']),
        gatewayDenyCidrs: JSON.stringify(['10.0.0.0/8', 'fc00::/7']),
        gatewayEnv: JSON.stringify({ SPACE_GATEWAY_DNS_QPS: '20' }),
      }),
    ).toEqual([]);
    expect(
      fails({
        ...VARIANTS['crusoe'],
        gatewayUpstreamDns: JSON.stringify(['1.1.1.1']),
        gatewayDenyCidrs: JSON.stringify(['192.168.0.0/16']),
        gatewayEnv: JSON.stringify({
          SPACE_GATEWAY_TLS_PORT: '443',
          SPACE_GATEWAY_UPSTREAM_DNS: '8.8.8.8:53',
          SPACE_NODE_ID: 'x',
        }),
      }),
    ).toEqual([
      'space:gatewayEnv.SPACE_GATEWAY_TLS_PORT: set by the deployment; cannot be overridden',
      'space:gatewayEnv.SPACE_GATEWAY_UPSTREAM_DNS: set it with space:gatewayUpstreamDns',
      'space:gatewayEnv.SPACE_NODE_ID: not a gateway setting (see README.md)',
      expect.stringMatching(/^space:gatewayUpstreamDns: must be a list of "ip:port"/),
      "space:gatewayDenyCidrs: must cover 10.77.128.0/24 (the deployment's own network; sandboxes must not reach it)",
      "space:gatewayDenyCidrs: must cover 10.77.0.0/16 (the deployment's own network; sandboxes must not reach it)",
    ]);
    expect(
      fails({ ...VARIANTS['crusoe'], agentEnv: JSON.stringify({ SPACE_GATEWAY_CONTROL_SOCKET: '' }) }),
    ).toEqual(['space:agentEnv.SPACE_GATEWAY_CONTROL_SOCKET: set by the deployment; cannot be overridden']);
  });

  it('keys of another cloud are refused', () => {
    expect(fails(withSecrets({ ...VARIANTS['kind'], crusoeProjectId: 'x' }))).toEqual([
      'space:crusoeProjectId: does not apply to kind (only crusoe)',
    ]);
  });

  it('every stack file sets only declared keys, and docs/deployment.md documents every key', () => {
    const declared = Object.keys(CONFIG_KEYS);
    for (const raw of Object.values(VARIANTS))
      for (const k of Object.keys(raw)) expect(declared).toContain(k);
    const doc = readFileSync(new URL('../docs/deployment.md', import.meta.url), 'utf8');
    for (const k of declared) expect(doc, `space:${k}`).toContain(`| \`space:${k}\``);
  });
});

/** Leaves that differ between two renders, with base64 user data decoded. */
function differences(a: unknown, b: unknown, path = ''): [string, unknown, unknown][] {
  if (typeof a === 'string' && typeof b === 'string') {
    if (a === b) return [];
    const dec = (s: string) =>
      /^[A-Za-z0-9+/=]{16,}$/.test(s) ? Buffer.from(s, 'base64').toString('utf8') : s;
    const [da, db] = [dec(a), dec(b)];
    if (da !== a || db !== b) {
      const la = da.split('\n');
      const lb = db.split('\n');
      if (la.length !== lb.length) return [[path, da, db]];
      return la.flatMap((l, i) =>
        l === lb[i] ? [] : [[`${path}#${i + 1}`, l, lb[i]] as [string, unknown, unknown]],
      );
    }
    return [[path, a, b]];
  }
  if (Array.isArray(a) && Array.isArray(b)) {
    if (a.length !== b.length) return [[path, a, b]];
    return a.flatMap((x, i) => differences(x, b[i], `${path}[${i}]`));
  }
  if (typeof a === 'object' && a && typeof b === 'object' && b) {
    const keys = new Set([...Object.keys(a), ...Object.keys(b)]);
    return [...keys]
      .filter((k) => k !== '__provider')
      .flatMap((k) => differences((a as Obj)[k], (b as Obj)[k], path ? `${path}.${k}` : k));
  }
  return a === b ? [] : [[path, a, b]];
}

describe.each(Object.entries(VARIANTS))('upgrade of stack %s', (_name, base) => {
  it('bumping space:version changes only versions and image tags', async () => {
    const before = await render(withSecrets({ ...base, version: '0.1.0' }));
    const after = await render(withSecrets({ ...base, version: '0.2.0' }));
    expect(after.map((r) => `${r.type} ${r.name}`)).toEqual(before.map((r) => `${r.type} ${r.name}`));
    const changed = before.flatMap((r, i) =>
      differences(unwrapSecrets(r.inputs), unwrapSecrets(after[i]!.inputs)).map(([p, x, y]) => ({
        at: `${r.name}.${p}`,
        x,
        y,
      })),
    );
    expect(changed.length).toBeGreaterThan(0);
    for (const c of changed) {
      expect(typeof c.x, c.at).toBe('string');
      expect((c.x as string).replaceAll('0.1.0', '0.2.0'), c.at).toBe(c.y);
    }
  });
});

/** The driver each stack file selects for its pools. */
const STACK_DRIVERS: Record<string, string> = {
  akamai: 'gvisor',
  'akamai-lke': 'gvisor',
  coreweave: 'gvisor',
  'coreweave-tls': 'gvisor',
  crusoe: 'cloud-hypervisor',
  kind: 'gvisor',
};

describe.each(Object.entries(VARIANTS))('agents of stack %s accept their driver', (name, base) => {
  it('every rendered agent names a driver the agent loads and builds', async () => {
    const recorded = await render(withSecrets(base));
    const drivers = new Set<string>();
    for (const script of Object.values(vmScripts(recorded))) {
      for (const m of script.matchAll(/SPACE_DRIVER=([a-z-]+)/g)) drivers.add(m[1]!);
    }
    for (const ds of recorded.filter(
      (r) => r.type === 'kubernetes:apps/v1:DaemonSet' && componentOf(r) === 'agent',
    )) {
      const containers = podSpecOf(ds)['containers'] as { env?: { name: string; value?: string }[] }[];
      for (const c of containers)
        for (const e of c.env ?? []) if (e.name === 'SPACE_DRIVER') drivers.add(e.value!);
    }
    expect([...drivers]).toEqual([STACK_DRIVERS[name]]);
    for (const driver of drivers) {
      // the agent's own config loader and driver factory, as at its boot (KVM given: these pools
      // are placed on KVM-capable types; a node without it is refused at boot by chooseDriver)
      const config = loadAgentConfig({
        SPACE_DRIVER: driver,
        SPACE_VERIFY_KEY_FILE: '/etc/space/verify.pem',
      });
      expect(config.driver).toBe(driver);
      const built = createDriver(
        config.driver as DriverName,
        config,
        { stateDir: '/var/lib/space/agent/driver' },
        true,
      );
      expect(built.name).toBe(driver);
    }
  });
});

/** Env files a VM's first boot writes (`/etc/space/<name>.env`), from cloud-config or a startup script. */
function envFilesOf(script: string): Record<string, string> {
  const out: Record<string, string> = {};
  if (script.startsWith('#cloud-config')) {
    const doc = parse(script.slice(script.indexOf('\n') + 1)) as {
      write_files: { path: string; content: string }[];
    };
    for (const f of doc.write_files) {
      const m = /^\/etc\/space\/([^/]+)\.env$/.exec(f.path);
      if (m) out[m[1]!] = f.content;
    }
  } else {
    for (const m of script.matchAll(
      /cat > \/etc\/space\/([^/ ]+)\.env <<'(SPACE_EOF_\d+)'\n([\s\S]*?)\n\2\n/g,
    ))
      out[m[1]!] = `${m[3]}\n`;
  }
  return out;
}
const vmConfigOf = (recorded: RecordedResource[]) =>
  recorded.filter((r) => r.type === 'pulumi-nodejs:dynamic/space:VmConfig');

describe('vm stacks: config changes reach existing VMs through space:VmConfig', () => {
  it.each(['akamai', 'crusoe'])(
    '%s: one VmConfig writes, with the deployment key kept secret, the env files a VM made now would get',
    async (name) => {
      const recorded = await render(withSecrets(VARIANTS[name]!));
      const [vc, ...more] = vmConfigOf(recorded);
      expect(more).toEqual([]);
      expect(isWireSecret(vc!.inputs['apiKey'])).toBe(true);
      expect(unwrapSecrets(vc!.inputs['apiKey'])).toBe(SECRETS.bootstrapApiKey);
      const services = vc!.inputs['services'] as Record<string, Record<string, string>>;
      const scripts = vmScripts(recorded);
      const control = envFilesOf(scripts['space-control']!);
      const node = envFilesOf(scripts['space-node-default-0']!);
      expect(renderEnvFile(services['space-api']!)).toBe(control['space-api']);
      expect(renderEnvFile(services['space-router']!)).toBe(control['space-router']);
      expect(renderEnvFile(services['space-gateway']!)).toBe(node['space-gateway']);
      expect(renderEnvFile(services['space-agent@default']!)).toBe(node['space-agent']);
      // the API imports the key from its hash: the key itself is in no user data
      const sha = createHash('sha256').update(SECRETS.bootstrapApiKey).digest('hex');
      expect(services['space-api']!['SPACE_BOOTSTRAP_API_KEY_SHA256']).toBe(sha);
      // and the version: pulumi up with a new space:version upgrades the VMs in place
      expect(vc!.inputs['version']).toBe(VARIANTS[name]!.version);
      // every VM applies it
      for (const s of Object.values(scripts)) expect(s).toContain('space-config-sync.timer');
      expect(vc!.inputs['apiUrl']).toMatch(
        name === 'akamai' ? /^http:\/\/198\.51\.100\.10$/ : /^http:\/\/203\.0\.113\.\d+:8080$/,
      );
    },
  );

  it('a changed setting changes only what the VmConfig writes, never the VMs (they are not replaced)', async () => {
    const a = await render(withSecrets(VARIANTS['crusoe']!));
    const b = await render(
      withSecrets({ ...VARIANTS['crusoe']!, agentEnv: JSON.stringify({ SPACE_WARM_POOL_SIZE: '7' }) }),
    );
    const agent = (r: RecordedResource[]) =>
      (vmConfigOf(r)[0]!.inputs['services'] as Record<string, Record<string, string>>)[
        'space-agent@default'
      ]!;
    expect(agent(a)['SPACE_WARM_POOL_SIZE']).toBeUndefined();
    expect(agent(b)['SPACE_WARM_POOL_SIZE']).toBe('7');
    // the startup script differs too, but Instance ignores it after creation (ignoreChanges)
  });

  it('the deployment key: required in vm mode, refused in kubernetes mode, must be long and random-looking', () => {
    expect(fails({ ...VARIANTS['crusoe'], bootstrapApiKey: undefined })).toEqual([
      expect.stringContaining('space:bootstrapApiKey: required in vm mode'),
    ]);
    expect(fails({ ...VARIANTS['akamai'], bootstrapApiKey: 'space_short' })).toEqual([
      expect.stringContaining('space:bootstrapApiKey: must be'),
    ]);
    expect(
      fails(withSecrets({ ...VARIANTS['akamai-lke']!, bootstrapApiKey: SECRETS.bootstrapApiKey })),
    ).toEqual([expect.stringContaining('space:bootstrapApiKey: vm mode only')]);
  });
});

describe('crusoe: TLS on the control VM from an ACME CA', () => {
  const tlsRaw = {
    ...VARIANTS['crusoe']!,
    routerUrl: undefined,
    tlsHostnames: JSON.stringify({ api: 'api.space.example.com', router: 'router.space.example.com' }),
    acmeEmail: 'ops@example.com',
    acmeServer: 'https://acme-staging-v02.api.letsencrypt.org/directory',
  };

  it('the control VM asks for one certificate for both names; port 80 opens for HTTP-01; clients get https URLs', async () => {
    const recorded = await render(withSecrets(tlsRaw));
    const script = vmScripts(recorded)['space-control']!;
    expect(envFilesOf(script)['space-tls']).toBe(
      'SPACE_ACME_EMAIL=ops@example.com\nSPACE_ACME_SERVER=https://acme-staging-v02.api.letsencrypt.org/directory\nSPACE_TLS_HOSTNAMES=api.space.example.com,router.space.example.com\n',
    );
    expect(script).toContain('apt-get install -y podman redis-server openssl nftables certbot');
    expect(script).toContain('cat > /usr/local/sbin/space-tls');
    // started without waiting: a failed first certificate must not stop the provisioning script
    expect(script).toContain(
      'systemctl enable space-tls.service\nsystemctl start --no-block space-tls.service',
    );
    expect(envFilesOf(script)['space-api']).toContain(
      'SPACE_ROUTER_URL=https://router.space.example.com:8082\n',
    );
    const rules = recorded
      .filter((r) => r.type === 'pulumi-nodejs:dynamic/crusoe:FirewallRule')
      .map((r) => unwrapSecrets(r.inputs) as { name: string; sources: string[]; destinationPorts: string[] });
    expect(rules.find((r) => r.destinationPorts.includes('80'))).toMatchObject({
      sources: ['0.0.0.0/0'],
    });
    const vc = vmConfigOf(recorded)[0]!;
    expect(vc.inputs['apiUrl']).toBe('https://api.space.example.com:8080');
    // plain HTTP only to hand TLS to a control VM that does not serve it yet (see vm-config-client.ts)
    expect(vc.inputs['plainApiUrl']).toMatch(/^http:\/\/203\.0\.113\.\d+:8080$/);
  });

  it('without names: no port 80, plain HTTP, the TLS unit present but idle (TLS can be turned on later)', async () => {
    const recorded = await render(withSecrets(VARIANTS['crusoe']!));
    const script = vmScripts(recorded)['space-control']!;
    expect(envFilesOf(script)['space-tls']).toContain('SPACE_TLS_HOSTNAMES=\n');
    const ports = recorded
      .filter((r) => r.type === 'pulumi-nodejs:dynamic/crusoe:FirewallRule')
      .flatMap((r) => (unwrapSecrets(r.inputs) as { destinationPorts: string[] }).destinationPorts);
    expect(ports).not.toContain('80');
    expect(vmConfigOf(recorded)[0]!.inputs['plainApiUrl']).toBeUndefined();
  });

  it('config: the e-mail is required with names, refused without them; a bad server is refused', () => {
    expect(fails(withSecrets({ ...tlsRaw, acmeEmail: undefined }))).toEqual([
      expect.stringContaining('space:acmeEmail: required with space:tlsHostnames'),
    ]);
    expect(fails(withSecrets({ ...VARIANTS['crusoe']!, acmeEmail: 'ops@example.com' }))).toEqual([
      expect.stringContaining('space:acmeEmail: only with space:tlsHostnames'),
    ]);
    expect(fails(withSecrets({ ...tlsRaw, acmeServer: 'http://acme.example.com/dir' }))).toEqual([
      expect.stringContaining('space:acmeServer: must be an https:// URL'),
    ]);
    expect(fails(withSecrets(tlsRaw))).toEqual([]);
  });
});

/** The API's environment in a rendered stack: its Deployment's env, or the control VM's env file. */
function apiEnvOf(recorded: RecordedResource[]): Record<string, string> {
  const dep = recorded.find(
    (r) =>
      r.type === 'kubernetes:apps/v1:Deployment' &&
      ((unwrapSecrets(r.inputs) as Obj)['metadata'] as Obj)['name'] === 'space-api',
  );
  if (dep) {
    const c = (podSpecOf(dep)['containers'] as Obj[])[0]!;
    return Object.fromEntries(
      ((c['env'] as Obj[]) ?? [])
        .filter((e) => typeof e['value'] === 'string')
        .map((e) => [e['name'], e['value']]),
    ) as Record<string, string>;
  }
  const control = vmScripts(recorded)['space-control'];
  return Object.fromEntries(
    (envFilesOf(control ?? '')['space-api'] ?? '')
      .split('\n')
      .filter(Boolean)
      .map((l) => [l.slice(0, l.indexOf('=')), l.slice(l.indexOf('=') + 1)]),
  );
}

describe.each(Object.entries(VARIANTS))('exposure of stack %s', (name, base) => {
  // finding "agent URLs handed to clients are private addresses": the API hands out data-plane
  // URLs on SPACE_ROUTER_URL, and without it, the agent's own (private) URL
  it('the API hands clients the router’s public URL, never an agent’s address', async () => {
    const url = apiEnvOf(await render(withSecrets(base)))['SPACE_ROUTER_URL'];
    expect(url, 'SPACE_ROUTER_URL').toMatch(/^https?:\/\/[^/]+\/?$/);
    const u = new URL(url!);
    expect(u.port, 'not the agent port').not.toBe('8081');
    expect(u.hostname).not.toMatch(/^(10\.|192\.168\.|172\.(1[6-9]|2\d|3[01])\.)/);
    if (name !== 'kind') expect(u.hostname).not.toMatch(/^(127\.|localhost$)/);
  });
});

describe('akamai vm: TLS at the NodeBalancer', () => {
  // finding "no TLS except on one path": the vm path terminates TLS on the NodeBalancer
  it('https on 443 (API) and 8443 (router) with the certificate, its key kept secret; clients and pulumi up use the names', async () => {
    const key = 'nodebalancer-tls-key-5d1e';
    const recorded = await render(
      withSecrets({
        ...VARIANTS['akamai']!,
        apiTlsCertificate: CA.certPem,
        apiTlsKey: key,
        tlsHostnames: JSON.stringify({ api: 'api.space.example.com', router: 'router.space.example.com' }),
      }),
    );
    const configs = recorded.filter((r) => r.type === 'linode:index/nodeBalancerConfig:NodeBalancerConfig');
    expect(configs.map((c) => [c.inputs['port'], c.inputs['protocol']]).sort()).toEqual([
      [443, 'https'],
      [8443, 'https'],
    ]);
    for (const c of configs) {
      expect(isWireSecret(c.inputs['sslKey'])).toBe(true);
      expect(unwrapSecrets(c.inputs['sslCert'])).toBe(CA.certPem);
    }
    expect(recorded.flatMap((r) => plaintextOccurrences(r.inputs, key))).toEqual([]);
    expect(apiEnvOf(recorded)['SPACE_ROUTER_URL']).toBe('https://router.space.example.com:8443');
    expect(vmConfigOf(recorded)[0]!.inputs['apiUrl']).toBe('https://api.space.example.com');
    // the names are those of the certificate: without it they are refused
    expect(
      fails(
        withSecrets({
          ...VARIANTS['akamai']!,
          tlsHostnames: JSON.stringify({ api: 'a.example.com', router: 'r.example.com' }),
        }),
      ),
    ).toEqual([expect.stringContaining('space:tlsHostnames: on akamai in vm mode')]);
  });
});
