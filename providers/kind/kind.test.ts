import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { parse } from 'yaml';
import { defaultNodePools } from '../node-pool.ts';
import { kindClusterConfig } from './index.ts';

describe('kind cluster config', () => {
  it('the committed providers/kind/kind-cluster.yaml is the render of the default pool', () => {
    const committed = readFileSync(new URL('./kind-cluster.yaml', import.meta.url), 'utf8');
    expect(committed).toBe(kindClusterConfig(defaultNodePools('kind')));
  });

  it('one labelled worker per pool node; /dev/kvm passed through only for VMM pools', () => {
    const doc = parse(
      kindClusterConfig([
        { name: 'vmm', driver: 'qemu', instanceType: 'host', count: 2, labels: {}, allowUnverifiedKvm: true },
        {
          name: 'gv',
          driver: 'gvisor',
          instanceType: 'host',
          count: 1,
          labels: { team: 'a' },
          allowUnverifiedKvm: false,
        },
      ]),
    ) as { nodes: { role: string; labels?: Record<string, string>; extraMounts?: { hostPath: string }[] }[] };
    const workers = doc.nodes.filter((n) => n.role === 'worker');
    expect(workers.map((w) => w.labels?.['space.dev/pool'])).toEqual(['vmm', 'vmm', 'gv']);
    expect(workers.map((w) => w.extraMounts?.[0]?.hostPath ?? null)).toEqual(['/dev/kvm', '/dev/kvm', null]);
    expect(workers[2]!.labels).toMatchObject({ team: 'a', 'space.dev/node': 'true' });
  });
});
