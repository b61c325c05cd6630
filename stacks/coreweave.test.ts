/**
 * The CoreWeave CKS findings of issue 42: Redis's volume names the StorageClass CKS documents, and
 * a pool's NodePool changes name with its (immutable) instance type, so pulumi-kubernetes replaces
 * it create-then-delete instead of deleting the whole pool first.
 */
import { describe, expect, it } from 'vitest';
import { unwrapSecrets } from '../providers/testing/mocks.ts';
import { render, VARIANTS, withSecrets } from './test-stacks.ts';

type Obj = Record<string, unknown>;
const NODE_POOL = 'kubernetes:compute.coreweave.com/v1alpha1:NodePool';

/** The Redis StatefulSet's volume claim spec. */
async function redisClaim(raw: Record<string, string | undefined>) {
  const recorded = await render(raw);
  // the data servers' (with Sentinel the sentinels have no volume)
  const sts = recorded.find((r) => r.type === 'kubernetes:apps/v1:StatefulSet' && r.name === 'space-redis')!;
  const spec = (unwrapSecrets(sts.inputs) as { spec: { volumeClaimTemplates: { spec: Obj }[] } }).spec;
  return spec.volumeClaimTemplates[0]!.spec;
}

/** NodePool names by the pool label they give their nodes. */
async function nodePoolNames(pools: { name: string; instanceType: string }[]) {
  const recorded = await render({
    ...withSecrets(VARIANTS['coreweave']!),
    nodePools: JSON.stringify(pools.map((p) => ({ ...p, driver: 'gvisor', count: 1 }))),
  });
  return recorded
    .filter((r) => r.type === NODE_POOL)
    .map((r) => (unwrapSecrets(r.inputs) as { metadata: { name: string } }).metadata.name);
}

// several renders per test, seconds each on a loaded host (not a speed goal)
describe('coreweave CKS', { timeout: 60_000 }, () => {
  it('the Redis claim uses shared-vast (ReadWriteMany, as CKS documents it) unless space:redisStorageClass names another', async () => {
    expect(await redisClaim(withSecrets(VARIANTS['coreweave']!))).toMatchObject({
      storageClassName: 'shared-vast',
      accessModes: ['ReadWriteMany'],
    });
    expect(
      await redisClaim({ ...withSecrets(VARIANTS['coreweave']!), redisStorageClass: 'block-nvme' }),
    ).toMatchObject({ storageClassName: 'block-nvme', accessModes: ['ReadWriteOnce'] });
    // other clouds keep the cluster's default class
    expect(await redisClaim(withSecrets(VARIANTS['kind']!))).not.toHaveProperty('storageClassName');
  });

  it('a NodePool is renamed when its instance type changes (create-then-delete), kept when it does not, and unique per pool', async () => {
    const before = await nodePoolNames([{ name: 'default', instanceType: 'cd-hp-a96-genoa' }]);
    const same = await nodePoolNames([{ name: 'default', instanceType: 'cd-hp-a96-genoa' }]);
    const after = await nodePoolNames([{ name: 'default', instanceType: 'cd-gp-a192-genoa' }]);
    expect(same).toEqual(before);
    expect(after[0]).not.toBe(before[0]);
    for (const n of [...before, ...after]) expect(n).toMatch(/^space-default-[0-9a-f]{8}$/);
    // pool names with dashes cannot collide with another pool's name plus suffix
    const two = await nodePoolNames([
      { name: 'a', instanceType: 'cd-hp-a96-genoa' },
      { name: 'a-b', instanceType: 'cd-hp-a96-genoa' },
    ]);
    expect(new Set(two).size).toBe(2);
  });
});
