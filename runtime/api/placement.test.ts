import { Redis } from 'ioredis';
import { afterAll, describe, expect, inject, it } from 'vitest';
import { KEY_PREFIX, keys } from '../core/redis-keys.ts';
import { NodeStore } from './node-store.ts';
import {
  type AskView,
  askView,
  largestShapes,
  nodeTakes,
  nodeView,
  PLACEMENT_RULES,
  PLACEMENT_RULES_JSON,
} from './placement.ts';
import { withScripts } from './redis-scripts.ts';

describe('r25 largestShapes: the largest shapes on offer', () => {
  it('keeps each shape no other node beats on both vCPUs and memory, largest memory first', () => {
    const nodes = [
      { vcpus: 4, memoryMiB: 8192 },
      { vcpus: 16, memoryMiB: 4096 },
      { vcpus: 2, memoryMiB: 2048 },
      { vcpus: 4, memoryMiB: 8192 },
    ];
    expect(largestShapes(nodes)).toEqual([
      { vcpus: 4, memoryMiB: 8192 },
      { vcpus: 16, memoryMiB: 4096 },
    ]);
    expect(largestShapes([{ vcpus: 8, memoryMiB: 1024 }])).toEqual([{ vcpus: 8, memoryMiB: 1024 }]);
  });
});

/**
 * One placement rule, two judges: the same cases through `nodeTakes` (what the create's pre-check
 * consults) and through place.lua on a real Redis, compared case by case.
 */
describe('placement rules: nodeTakes and place.lua agree', () => {
  const redis = withScripts(new Redis(inject('redisUrl'), { db: 13 }));
  const nodes = new NodeStore(redis);
  afterAll(() => redis.disconnect());

  /** A small deterministic PRNG (mulberry32), so a failing case can be replayed. */
  function prng(seed: number) {
    let a = seed;
    return () => {
      a = (a + 0x6d2b79f5) | 0;
      let t = Math.imul(a ^ (a >>> 15), 1 | a);
      t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
      return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
    };
  }
  const pick = <T>(r: () => number, xs: readonly T[]): T => xs[Math.floor(r() * xs.length)]!;

  /** Writes node `n1` as an agent registers it. */
  async function writeNode(n: Record<string, string>, alive: boolean) {
    await redis.flushdb();
    const m = redis
      .multi()
      .sadd(keys.nodeIndex(), 'n1')
      .hset(keys.node('n1'), { id: 'n1', url: 'http://n1', ...n });
    if (alive) m.set(keys.nodeAlive('n1'), '1');
    await m.exec();
  }

  /** place.lua's answer for `ask` against what Redis holds: the node, or why none. */
  async function luaPlaces(ask: AskView): Promise<string> {
    const [node, extra] = await redis.spacePlace(
      keys.nodeIndex(),
      keys.sandbox('sbx_placementcase00001'),
      KEY_PREFIX,
      'sbx_placementcase00001',
      ask.template,
      String(ask.vcpusMilli),
      String(ask.memoryMiB),
      ask.drivers.join(','),
      ask.store,
      PLACEMENT_RULES_JSON,
    );
    return node || String(extra);
  }

  it('the same answer for 300 generated single-node cases (every rule met or broken in turn)', async () => {
    const r = prng(43);
    const seen = new Set<string>();
    const broken = new Set<string>();
    for (let i = 0; i < 300; i++) {
      const alive = r() < 0.85;
      const hash = {
        schedulable: r() < 0.85 ? '1' : '0',
        templates: pick(r, ['base', 'base,py', 'py', '']),
        driver: pick(r, ['gvisor', 'firecracker', 'qemu', 'unknown']),
        hibernateStore: pick(r, ['', 'store-a', 'store-b']),
        vcpusMilli: pick(r, ['1000', '2000', '4000']),
        usedVcpusMilli: pick(r, ['0', '500', '1500', '3500']),
        memoryMiB: pick(r, ['1024', '4096']),
        usedMemoryMiB: pick(r, ['0', '512', '3800']),
        maxSandboxes: pick(r, ['1', '10']),
        sandboxes: pick(r, ['0', '1', '9']),
        // an operator's drain (`space nodes drain`): '' is how an older hash could hold none
        drainRequestedAt: pick(r, ['', '', '', '', '', '', '1700000000000']),
      };
      const ask = askView(
        {
          template: pick(r, ['base', 'py']),
          vcpus: pick(r, [0.5, 1, 2, 3]),
          memoryMiB: pick(r, [256, 512, 1024]),
        },
        pick(r, ['', '', 'store-a']),
      );
      await writeNode(hash, alive);
      const info = await nodes.get('n1');
      for (const rule of PLACEMENT_RULES) {
        if (!nodeTakes(nodeView(info!), ask, { only: [rule.name] })) broken.add(rule.name);
      }
      const ts = nodeTakes(nodeView(info!), ask) ? 'n1' : alive ? 'full' : 'no_nodes';
      const lua = await luaPlaces(ask);
      expect(lua, JSON.stringify({ i, alive, hash, ask })).toBe(ts);
      seen.add(lua);
    }
    // the generated cases reach every outcome
    expect([...seen].sort()).toEqual(['full', 'n1', 'no_nodes']);
    // … and break every rule
    expect([...broken].sort()).toEqual(PLACEMENT_RULES.map((rule) => rule.name).sort());
  });

  it('place.lua passes over a node that does not hold the template, as the pre-check does', async () => {
    const node = {
      schedulable: '1',
      templates: 'py',
      driver: 'gvisor',
      hibernateStore: '',
      vcpusMilli: '4000',
      usedVcpusMilli: '0',
      memoryMiB: '4096',
      usedMemoryMiB: '0',
      maxSandboxes: '10',
      sandboxes: '0',
    };
    await writeNode(node, true);
    expect(await luaPlaces(askView({ template: 'base', vcpus: 1, memoryMiB: 512 }))).toBe('full');
    expect(await luaPlaces(askView({ template: 'py', vcpus: 1, memoryMiB: 512 }))).toBe('n1');
  });
});
