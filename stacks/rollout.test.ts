/**
 * Rolling a large pool (issue 42 item 4), as the Pulumi engine is asked to: each pool's gateway and
 * agent DaemonSets are registered with no dependency on each other (neither waits for the other's
 * whole roll) and with `customTimeouts` sized from the pool, so a 50-node roll does not fail
 * `pulumi up` at the provider's 10-minute await while it goes on in the cluster.
 */
import { describe, expect, it } from 'vitest';
import { unwrapSecrets } from '../providers/testing/mocks.ts';
import { componentOf, render, VARIANTS, withSecrets } from './test-stacks.ts';

/** Minutes of a Pulumi duration such as `75m`. */
const minutes = (d: string | undefined) => Number(/^(\d+)m$/.exec(d ?? '')?.[1] ?? Number.NaN);

describe('DaemonSet rollouts under the engine', () => {
  it('a 50-node CKS pool: agents and gateways registered without depending on each other, awaited for as long as 50 nodes need', async () => {
    const raw = {
      ...withSecrets(VARIANTS['coreweave']!),
      nodePools: JSON.stringify([
        { name: 'big', driver: 'gvisor', instanceType: 'cd-hp-a96-genoa', count: 50 },
      ]),
    };
    const recorded = await render(raw);
    const ds = recorded.filter((r) => r.type === 'kubernetes:apps/v1:DaemonSet');
    const agent = ds.find((r) => componentOf(r) === 'agent')!;
    const gateway = ds.find((r) => componentOf(r) === 'gateway')!;
    expect(agent.dependencies).not.toContain(gateway.urn);
    expect(gateway.dependencies).not.toContain(agent.urn);
    // 50 × (120 s drain + 30 s + start) on top of 10 minutes: hours, not the default 10 minutes
    expect(minutes(agent.customTimeouts?.update)).toBeGreaterThanOrEqual(10 + (50 * 150) / 60);
    expect(agent.customTimeouts?.create).toBe(agent.customTimeouts?.update);
    expect(minutes(gateway.customTimeouts?.update)).toBeGreaterThanOrEqual(10 + (50 * 30) / 60);
    // the Deployments keep the provider's default
    for (const d of recorded.filter((r) => r.type === 'kubernetes:apps/v1:Deployment'))
      expect(
        d.customTimeouts?.update ?? '',
        (unwrapSecrets(d.inputs) as { metadata: { name: string } }).metadata.name,
      ).toBe('');
  });
});
