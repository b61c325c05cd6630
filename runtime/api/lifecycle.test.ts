/** The pause-mode policy (pure). */
import { describe, expect, it } from 'vitest';
import { choosePauseMode, type PausePolicy } from './lifecycle.ts';

const policy = (mode: PausePolicy['mode']): PausePolicy => ({
  mode,
  hibernateAbovePercent: 70,
  retentionSec: 60,
});
const snapNode = { capabilities: ['pause', 'snapshot', 'restore'], memoryMiB: 1000, usedMemoryMiB: 500 };
const pauseOnly = { capabilities: ['pause'], memoryMiB: 1000, usedMemoryMiB: 900 };

describe('choosePauseMode', () => {
  it('takes the mode asked for, else the policy', () => {
    expect(choosePauseMode('frozen', snapNode, policy('hibernated'))).toBe('frozen');
    expect(choosePauseMode('hibernated', snapNode, policy('frozen'))).toBe('hibernated');
    expect(choosePauseMode(undefined, snapNode, policy('hibernated'))).toBe('hibernated');
    expect(choosePauseMode('auto', snapNode, policy('frozen'))).toBe('frozen');
  });
  it('auto hibernates only above the memory threshold and only where snapshots work', () => {
    expect(choosePauseMode(undefined, snapNode, policy('auto'))).toBe('frozen');
    expect(choosePauseMode(undefined, { ...snapNode, usedMemoryMiB: 701 }, policy('auto'))).toBe(
      'hibernated',
    );
    expect(choosePauseMode(undefined, pauseOnly, policy('auto'))).toBe('frozen');
  });
  it('refuses a hibernation the node cannot make', () => {
    expect(() => choosePauseMode('hibernated', pauseOnly, policy('auto'))).toThrow(/cannot hibernate/);
  });
});
