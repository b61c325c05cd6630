/** The outage rule (store-outage.ts): when a node without its alive key is still presumed alive. */
import { describe, expect, it } from 'vitest';
import { NODE_ALIVE_TTL_MS as TTL } from './redis-keys.ts';
import { StoreOutage } from './store-outage.ts';

describe('StoreOutage', () => {
  const t0 = 1_800_000_000_000;

  it('presumes nothing when no outage was seen', () => {
    const o = new StoreOutage();
    expect(o.presumedAlive(t0, t0 + 1)).toBe(false);
    expect(o.lastAt).toBe(0);
    expect(o.silentFor(t0, t0 + 5_000)).toBe(5_000);
  });

  it('f8-presumed-alive: a node alive as the outage began is presumed alive until one TTL after it ended', () => {
    const o = new StoreOutage();
    // Redis away from t0 to t0 + 22 s (errors on each reconnect, then ready)
    for (let t = t0; t <= t0 + 22_000; t += 2_000) o.down(t);
    o.up(t0 + 22_500);
    const end = t0 + 22_500;
    const heardAt = t0 - 3_000; // its last heartbeat, 3 s before Redis went
    expect(o.presumedAlive(heardAt, end + 1)).toBe(true);
    expect(o.presumedAlive(heardAt, end + TTL - 1)).toBe(true);
    // a full TTL of reachable Redis without a heartbeat: its silence is its own
    expect(o.presumedAlive(heardAt, end + TTL)).toBe(false);
    // a node already silent for a TTL when the outage began was dead before it
    expect(o.presumedAlive(t0 - TTL - 1, end + 1)).toBe(false);
    // the loss grace counts silence from the outage's end, not from the last heartbeat
    expect(o.silentFor(heardAt, end + 1_000)).toBe(1_000);
    expect(o.silentFor(end + 500, end + 1_000)).toBe(500);
  });

  it('a failure long after the last one begins a new outage (a loop may see failures but no recovery)', () => {
    const o = new StoreOutage();
    o.down(t0);
    o.down(t0 + TTL * 4);
    // alive as this second outage began, not the first: still presumed
    expect(o.presumedAlive(t0 + TTL * 4 - 1_000, t0 + TTL * 4 + 1)).toBe(true);
    // alive as the first began but silent for TTLs before the second: dead before it
    expect(o.presumedAlive(t0 - 1_000, t0 + TTL * 4 + 1)).toBe(false);
    // ready without an outage under way changes nothing
    const fresh = new StoreOutage();
    fresh.up(t0);
    expect(fresh.lastAt).toBe(0);
  });

  it('nodeAlive: the alive key, else the presumption for a node not fenced as lost', () => {
    const o = new StoreOutage();
    o.down(t0);
    o.up(t0 + 1_000);
    const heard = String(t0 - 1_000);
    expect(o.nodeAlive(true, null, String(t0), t0 + 2_000)).toBe(true);
    expect(o.nodeAlive(false, heard, null, t0 + 2_000)).toBe(true);
    expect(o.nodeAlive(false, heard, String(t0), t0 + 2_000)).toBe(false);
    expect(o.nodeAlive(false, undefined, undefined, t0 + 2_000)).toBe(false);
    expect(new StoreOutage().nodeAlive(false, heard, null, t0 + 2_000)).toBe(false);
  });

  it('hands place.lua the same figures', () => {
    const o = new StoreOutage();
    o.down(t0);
    o.up(t0 + 1_000);
    expect(o.luaArgs(t0 + 2_000)).toEqual([String(t0), String(t0 + 1_000), String(t0 + 2_000), String(TTL)]);
  });
});
