/**
 * The rehearsal's pure parts: what each VM is seeded with comes from the Pulumi program itself
 * (under the mock runtime), and the NoCloud network config gives the address and route a cloud's
 * private network would.
 */
import { describe, expect, it } from 'vitest';
import { parse } from 'yaml';
import { controlAddress } from '../../providers/vm-network.ts';
import { counterDamage } from './exercise.ts';
import { REHEARSAL_NET } from './host.ts';
import { controlVms, nodeVms, ONE_CONTROL_VM, renderStack } from './render.ts';
import { macFor, networkConfig } from './vm.ts';

const KEY = `space_${'ab'.repeat(24)}`;
/** What the rehearsal sets on the Akamai stack besides its shape. */
const AKAMAI = {
  version: '9.9.9',
  imageRepository: '10.88.1.1:5443/space',
  privateCidr: REHEARSAL_NET.privateCidr,
  routerUrl: 'http://10.88.1.1:8082',
  bootstrapApiKey: KEY,
};

describe('the rehearsal seeds VMs with what the program renders', () => {
  it('akamai vm: a control VM and one VM per pool node, each with its own #cloud-config naming the rehearsal registry', async () => {
    const r = await renderStack('akamai', {
      ...AKAMAI,
      ...ONE_CONTROL_VM,
    });
    expect(r.vms.map((v) => v.role)).toEqual(['control', 'node', 'node']);
    expect(r.vms.map((v) => v.address)).toEqual(['10.88.0.10', '10.88.0.21', '10.88.0.22']);
    for (const v of r.vms) {
      expect(v.userData.startsWith('#cloud-config\n')).toBe(true);
      expect(v.userData).toContain('10.88.1.1:5443/space:9.9.9');
      // the key itself never reaches user data (only its hash does)
      expect(v.userData).not.toContain(KEY);
    }
    expect(r.vms[1]!.userData).toContain(controlAddress(REHEARSAL_NET.privateCidr));
    // a version bump is applied as `pulumi up` applies it: the VmConfig resource's own inputs
    expect(r.vmConfig?.['version']).toBe('9.9.9');
    expect(r.vmConfig?.['apiKey']).toBe(KEY);
  }, 60_000);

  it('akamai vm with three control VMs: each at the address the program gives it, the NodeBalancer checks as rendered, the nodes asked for', async () => {
    const r = await renderStack('akamai', {
      ...AKAMAI,
      ...controlVms(3),
      ...nodeVms('akamai', 1),
    });
    expect(r.vms.map((v) => [v.resource, v.role, v.address])).toEqual([
      ['space-control', 'control', '10.88.0.10'],
      ['space-control-1', 'control', '10.88.0.11'],
      ['space-control-2', 'control', '10.88.0.12'],
      ['space-node-default-0', 'node', '10.88.0.23'],
    ]);
    // each control VM's user data lists all three; the node's names the three sentinels
    for (const v of r.vms)
      for (const a of ['10.88.0.10', '10.88.0.11', '10.88.0.12']) expect(v.userData).toContain(a);
    expect(r.vms[3]!.userData).toContain('redis-sentinel://');
    for (const c of [r.healthChecks.api, r.healthChecks.router]) {
      expect(c?.path).toBe('/readyz');
      expect(c!.intervalSec).toBeGreaterThan(0);
      expect(c!.attempts).toBeGreaterThan(0);
    }
    // one control VM: one backend, no timing set (the NodeBalancer's defaults)
    const one = await renderStack('akamai', {
      ...AKAMAI,
      ...ONE_CONTROL_VM,
    });
    expect(one.healthChecks).toEqual({});
  }, 60_000);

  it('crusoe: the startup scripts, run by cloud-init as a user-data script', async () => {
    const r = await renderStack('crusoe', {
      version: '9.9.9',
      imageRepository: '10.88.1.1:5443/space',
      privateCidr: REHEARSAL_NET.privateCidr,
      bootstrapApiKey: KEY,
      ...ONE_CONTROL_VM,
    });
    const [control, ...more] = r.vms.filter((v) => v.role === 'control');
    expect(more).toEqual([]);
    const nodes = r.vms.filter((v) => v.role === 'node');
    expect(nodes.length).toBeGreaterThan(0);
    for (const v of r.vms) expect(v.userData.startsWith('#!')).toBe(true);
    // Crusoe's API picks private addresses: the mock reports the ones the rehearsal's VMs get, and
    // each node's script points at the control VM's
    expect(control!.address).toBe(controlAddress(REHEARSAL_NET.privateCidr));
    expect(new Set(r.vms.map((v) => v.address)).size).toBe(r.vms.length);
    for (const n of nodes) expect(n.userData).toContain(control!.address);
  }, 60_000);
});

describe('network config', () => {
  it('matches the VM by its MAC, with its address and a default route through the bridge', () => {
    const doc = parse(networkConfig('node0', '10.88.0.21')) as {
      version: number;
      ethernets: Record<string, { match: { macaddress: string }; addresses: string[]; gateway4: string }>;
    };
    expect(doc.version).toBe(2);
    expect(doc.ethernets['eth0']).toEqual({
      match: { macaddress: macFor('node0') },
      'set-name': 'eth0',
      addresses: ['10.88.0.21/24'],
      gateway4: REHEARSAL_NET.gateway,
    });
  });

  it('gives each VM a distinct, locally administered unicast MAC', () => {
    const macs = ['control', 'node0', 'node1', 'node2'].map(macFor);
    expect(new Set(macs).size).toBe(4);
    for (const m of macs) {
      expect(m).toMatch(/^([0-9a-f]{2}:){5}[0-9a-f]{2}$/);
      const first = Number.parseInt(m.slice(0, 2), 16);
      expect(first & 1).toBe(0); // unicast
      expect(first & 2).toBe(2); // locally administered
    }
  });
});

describe('counterDamage: what a streamed counter lost or repeated', () => {
  const lines = (...n: (number | string)[]) => n.map(String);
  it('an intact counter', () => {
    expect(counterDamage(lines(0, 1, 2, 'end 3'))).toEqual({ count: 3, lost: 0, repeated: 0 });
  });
  it('a gap, a repeat, a line out of order and a stray line are each counted', () => {
    expect(counterDamage(lines(0, 2, 'end 3'))).toEqual({ count: 3, lost: 1, repeated: 0 });
    expect(counterDamage(lines(0, 1, 1, 2, 'end 3'))).toEqual({ count: 3, lost: 0, repeated: 1 });
    expect(counterDamage(lines(0, 2, 1, 'end 3'))).toEqual({ count: 3, lost: 0, repeated: 1 });
    expect(counterDamage(lines(0, 'x', 1, 'end 2'))).toEqual({ count: 2, lost: 0, repeated: 1 });
  });
  it('lines lost at the end show as an unknown count (no end line)', () => {
    expect(counterDamage(lines(0, 1))).toEqual({ count: null, lost: 0, repeated: 0 });
    expect(counterDamage(lines())).toEqual({ count: null, lost: 0, repeated: 0 });
  });
});
