import { describe, expect, it } from 'vitest';
import { StartGate, type StartKind } from './start-gate.ts';

/** A start that runs until released; records when it began. */
function starter(gate: StartGate, order: string[]) {
  const releases = new Map<string, () => void>();
  const start = (kind: StartKind, name: string) =>
    gate.run(kind, async () => {
      order.push(name);
      await new Promise<void>((r) => releases.set(name, r));
    });
  const release = async (name: string) => {
    releases.get(name)!();
    await new Promise((r) => setImmediate(r));
  };
  return { start, release };
}

const tick = () => new Promise((r) => setImmediate(r));

describe('start gate', () => {
  it('starts at most `limit` at once and hands freed places to waiting creates before refills', async () => {
    const gate = new StartGate(2, 1);
    const order: string[] = [];
    const { start, release } = starter(gate, order);
    const all = [start('create', 'c1'), start('create', 'c2'), start('refill', 'r1'), start('create', 'c3')];
    await tick();
    expect(order).toEqual(['c1', 'c2']);
    expect(gate.stats()).toEqual({ running: { create: 2, refill: 0 }, waiting: { create: 1, refill: 1 } });
    await release('c1');
    expect(order).toEqual(['c1', 'c2', 'c3']); // the create queued after the refill still goes first
    await release('c2');
    expect(order).toEqual(['c1', 'c2', 'c3', 'r1']);
    await release('c3');
    await release('r1');
    await Promise.all(all);
    expect(gate.stats()).toEqual({ running: { create: 0, refill: 0 }, waiting: { create: 0, refill: 0 } });
  });

  it('keeps refills within their own limit even with places free, and a create never waits behind them', async () => {
    const gate = new StartGate(3, 1);
    const order: string[] = [];
    const { start, release } = starter(gate, order);
    const all = [start('refill', 'r1'), start('refill', 'r2'), start('create', 'c1')];
    await tick();
    expect(order).toEqual(['r1', 'c1']);
    await release('r1');
    expect(order).toEqual(['r1', 'c1', 'r2']);
    await release('c1');
    await release('r2');
    await Promise.all(all);
  });

  it('gives the place back when a start fails', async () => {
    const gate = new StartGate(1, 1);
    await expect(gate.run('create', async () => Promise.reject(new Error('boot failed')))).rejects.toThrow(
      'boot failed',
    );
    await expect(gate.run('refill', async () => 'ok')).resolves.toBe('ok');
  });

  it('refuses limits that cannot work', () => {
    expect(() => new StartGate(0)).toThrow(RangeError);
    expect(() => new StartGate(2, 3)).toThrow(RangeError);
    expect(() => new StartGate(2, 0)).toThrow(RangeError);
  });
});
