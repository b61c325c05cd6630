import { describe, expect, it } from 'vitest';
import { REFILL_MAX_DELAY_MS, REFILL_QUIET_MS, refillDelay } from './refill-pacing.ts';

describe('refill pacing (refillDelay)', () => {
  it('waits the quiet time after the last create came or ended', () => {
    expect(refillDelay({ askedAtMs: 1000, lastCreateMs: 1000, nowMs: 1000 })).toBe(REFILL_QUIET_MS);
    // part of the quiet has passed already
    expect(refillDelay({ askedAtMs: 1000, lastCreateMs: 1000, nowMs: 1100 })).toBe(REFILL_QUIET_MS - 100);
  });

  it('starts at once when no create came lately', () => {
    expect(refillDelay({ askedAtMs: 50_000, lastCreateMs: 1000, nowMs: 50_000 })).toBe(0);
    expect(refillDelay({ askedAtMs: 50_000, lastCreateMs: 0, nowMs: 50_000 })).toBe(0);
  });

  it('never waits past the bound after the first ask, however steady the creates', () => {
    // a create just came, but the refill was asked for long ago
    const now = REFILL_MAX_DELAY_MS - 10;
    expect(refillDelay({ askedAtMs: 0, lastCreateMs: now, nowMs: now })).toBe(10);
    expect(refillDelay({ askedAtMs: 0, lastCreateMs: now, nowMs: REFILL_MAX_DELAY_MS + 500 })).toBe(0);
  });
});
