import { describe, expect, it } from 'vitest';
import { catalogue } from '../providers/catalogue.ts';
import { GATEWAY_PORTS } from '../providers/runtime-settings.ts';
import { schemaProblems } from '../providers/testing/k8s-schema.ts';
import { plaintextOccurrences, type RecordedResource, unwrapSecrets } from '../providers/testing/mocks.ts';
import { loadAgentConfig } from '../runtime/agent/config.ts';
import { createDriver } from '../runtime/agent/drivers/index.ts';
import type { DriverName } from '../runtime/core/drivers.ts';
import { cidrContains } from '../runtime/core/net-address.ts';
import {
  componentOf,
  fails,
  NEEDLES,
  podSpecOf,
  render,
  VARIANTS,
  vmScripts,
  withSecrets,
} from './test-stacks.ts';

type Obj = Record<string, unknown>;
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
        if (rule.ports === '6379' || rule.ports === '26379') expect(rule.ipv4s).toEqual([raw.privateCidr]);
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
      if (i.destinationPorts.includes('6379') || i.destinationPorts.includes('26379'))
        expect(i.sources).toEqual([raw.privateCidr]);
      if (i.sources.includes('0.0.0.0/0'))
        expect(['8080', '8082']).toEqual(expect.arrayContaining(i.destinationPorts));
    }
    for (const r of recorded.filter((x) => x.type === 'kubernetes:core/v1:Service')) {
      const s = unwrapSecrets(r.inputs) as { metadata: { name: string }; spec: { type: string } };
      // Redis, and with Sentinel the sentinels: inside the cluster only
      if (s.metadata.name.startsWith('space-redis')) expect(s.spec.type).toBe('ClusterIP');
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
      ['space-control-1', false],
      ['space-control-2', false],
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
    // three control VMs (the stack file's space:controlPlane): the nodes name their sentinels
    const sentinels = /SPACE_REDIS_URL=redis-sentinel:\/\/:[^@\s]+@([0-9.:,]+)\/space/.exec(
      scripts['space-node-default-0']!,
    )?.[1];
    const chosen = sentinels?.split(',').map((h) => h.replace(/:26379$/, ''));
    expect(chosen).toHaveLength(3);
    for (const a of chosen!) expect(a).toMatch(/^10\.77\.128\.\d+$/);
    expect(chosen).not.toContain('10.77.128.10');
    expect(new Set(chosen).size).toBe(3);
    expect(control.name).toBe('space-control');
  });

  it('akamai vm: user data is base64 cloud-init; the API and the router sit behind the NodeBalancer, and the API hands out its router port', async () => {
    const recorded = await render(withSecrets(VARIANTS['akamai']!));
    const vms = recorded.filter((r) => r.type === 'linode:index/instance:Instance');
    // three control VMs (the stack file's space:controlPlane) and two nodes
    expect(vms).toHaveLength(5);
    for (const vm of vms) {
      const ud = Buffer.from(
        (unwrapSecrets(vm.inputs['metadatas']) as { userData: string }[])[0]!.userData,
        'base64',
      ).toString();
      expect(ud.startsWith('#cloud-config\n')).toBe(true);
      // agents register their private address: the router reaches them, clients never do
      expect(ud).toContain('ip -4 -o addr show to 10.77.128.0/24');
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
      ...Array(6).fill('linode:index/nodeBalancerNode:NodeBalancerNode'),
    ]);
    const nodesOf = recorded
      .filter((r) => r.type === 'linode:index/nodeBalancerNode:NodeBalancerNode')
      .map((r) => String(r.inputs['address']).split(':')[1])
      .sort();
    // each control VM behind both ports
    expect(nodesOf).toEqual(['8080', '8080', '8080', '8082', '8082', '8082']);
    const control = vms.find((v) => v.name === 'space-control')!;
    const ud = Buffer.from(
      (unwrapSecrets(control.inputs['metadatas']) as { userData: string }[])[0]!.userData,
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
          imageVmms: JSON.stringify(['gvisor', 'qemu', 'firecracker']),
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
