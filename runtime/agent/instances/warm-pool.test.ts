import pino from 'pino';
import { describe, expect, it } from 'vitest';
import type { InstanceInfo } from '../drivers/driver.ts';
import { WarmPool, type WarmPoolOptions } from './warm-pool.ts';

const shape = { vcpus: 1, memoryMiB: 512 };
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * A pool whose instances are plain records (the pool only holds and hands them out; making real
 * ones is the sandbox manager's, covered by the stack tests). Records boots in flight at once.
 */
function pool(o: Partial<WarmPoolOptions> = {}) {
  let n = 0;
  let inFlight = 0;
  const seen = { maxInFlight: 0, booted: 0, discarded: [] as string[] };
  const p = new WarmPool({
    templates: ['base'],
    min: 2,
    max: 32,
    shape,
    parallel: 1,
    share: 0.5,
    capacityMiB: 19_660,
    reservedMiB: () => 0,
    boot: async () => {
      inFlight++;
      seen.maxInFlight = Math.max(seen.maxInFlight, inFlight);
      await sleep(5);
      inFlight--;
      seen.booted++;
      return { instanceId: `i_${++n}`, ...shape } as unknown as InstanceInfo;
    },
    discard: async (i) => {
      seen.discarded.push(i.instanceId);
    },
    log: pino({ level: 'silent' }),
    ...o,
  });
  return { p, seen };
}

async function filled(p: WarmPool) {
  p.refill();
  await p.settle();
}

describe('warm pool', () => {
  it('fills to its minimum one refill at a time', async () => {
    const { p, seen } = pool();
    await filled(p);
    expect(p.counts()).toEqual({ base: 2 });
    expect(seen.maxInFlight).toBe(1);
    // before a measurement a slot counts at its shape
    expect(p.held()).toEqual({ slots: 2, memoryMiB: 1024, footprintMiB: 512 });
  });

  it('grows with a burst of creates of its shape, within its bounds, and at most `parallel` refills in flight', async () => {
    const { p, seen } = pool({ parallel: 2 });
    await filled(p);
    for (let i = 0; i < 8; i++) p.claim('base', shape); // 2 hits, 6 misses: 8 creates in a second
    expect(p.counts()).toEqual({ base: 0 });
    expect(p.target('base')).toBe(8);
    await filled(p);
    expect(p.counts()).toEqual({ base: 8 });
    expect(seen.maxInFlight).toBe(2);
    // another shape or template is not this pool's demand
    p.claim('base', { vcpus: 2, memoryMiB: 512 });
    p.claim('other', shape);
    expect(p.target('base')).toBe(8);
  });

  it('shrinks back to its minimum once the demand window has passed', async () => {
    const { p, seen } = pool({ demandWindowMs: 100 });
    for (let i = 0; i < 5; i++) p.claim('base', shape);
    await filled(p);
    expect(p.counts()).toEqual({ base: 5 });
    await sleep(150);
    await p.tick();
    expect(p.counts()).toEqual({ base: 2 });
    expect(seen.discarded).toHaveLength(3);
  });

  it('holds no more slots than the unreserved memory fits', async () => {
    let reserved = 0;
    const { p } = pool({ reservedMiB: () => reserved });
    for (let i = 0; i < 6; i++) p.claim('base', shape);
    reserved = 19_660 - 3 * 512;
    await filled(p);
    expect(p.counts()).toEqual({ base: 3 });
  });

  it('counts each slot at the largest footprint a tick measured', async () => {
    const { p } = pool({ footprint: async (i) => (i.instanceId === 'i_1' ? 30 : 28.5) * 1_048_576 });
    await filled(p);
    await p.tick();
    expect(p.held()).toEqual({ slots: 2, memoryMiB: 60, footprintMiB: 30 });
  });

  it('drains: refills stop and every ready slot is discarded', async () => {
    const { p, seen } = pool();
    await filled(p);
    await p.drain();
    p.refill();
    await p.settle();
    expect(p.counts()).toEqual({ base: 0 });
    expect(seen.discarded.sort()).toEqual(['i_1', 'i_2']);
  });
});

describe('warm pool pacing', () => {
  it('refills back to back while low, and hands each next slot to `schedule` once stocked', async () => {
    const asked: number[] = [];
    const { p } = pool({ min: 8, schedule: () => asked.push(p.counts().base ?? 0) });
    expect(p.stocked()).toBe(false);
    await filled(p);
    // slots 1–4 were made back to back (below half of 8); from the 4th on the pool is stocked, so
    // the next slot waits for the owner's quiet moment instead of starting
    expect(p.counts()).toEqual({ base: 4 });
    expect(asked).toEqual([4]);
    expect(p.stocked()).toBe(true);
    // the owner's top-up carries on (one slot, then asks again)
    p.refill();
    await p.settle();
    expect(p.counts()).toEqual({ base: 5 });
    expect(asked).toEqual([4, 5]);
  });

  it('a tick tops a stocked pool up through `schedule`, a low one at once', async () => {
    let scheduled = 0;
    const { p } = pool({ min: 4, schedule: () => scheduled++ });
    await p.tick();
    await p.settle();
    expect(p.counts()).toEqual({ base: 2 });
    expect(scheduled).toBe(1);
    await p.tick();
    expect(scheduled).toBe(2);
    p.claim('base', shape);
    p.claim('base', shape);
    expect(p.stocked()).toBe(false);
    await p.tick(); // low: starts a slot itself
    expect(scheduled).toBe(2);
    await p.settle();
    expect(p.counts()).toEqual({ base: 2 });
  });

  it('without `schedule` tops up at once however stocked', async () => {
    const { p } = pool({ min: 8 });
    await filled(p);
    expect(p.counts()).toEqual({ base: 8 });
  });
});

describe('warm pool eviction', () => {
  it('takes out the named ready slot only, and nothing once it is claimed', async () => {
    const { p } = pool();
    await filled(p);
    const [first, second] = p.instanceIds();
    expect(p.evict(second!)?.instanceId).toBe(second);
    expect(p.instanceIds()).toEqual([first]);
    expect(p.evict(second!)).toBeNull();
    expect(p.claim('base', shape)?.instanceId).toBe(first);
    expect(p.evict(first!)).toBeNull();
    expect(p.counts()).toEqual({ base: 0 });
  });
});
