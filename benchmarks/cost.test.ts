import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import {
  type FlatSessionPrice,
  flatSessionCost,
  type HostPrice,
  loadCatalogue,
  parseTrace,
  selfHostedCost,
  traceTotals,
  type WallClockPrice,
  wallClockCost,
} from './cost.ts';
import { defaultTraces } from './suite.ts';

// Hand-worked example used throughout. One session: 600 s active, then 3000 s idle.
//   A = 600 s, W = 3600 s (1 h), A/3600 = 1/6 active hour.
const trace = parseTrace(`# one session
session,state,seconds
s1,active,600
s1,idle,3000
`);
const shape = { vcpus: 1, memoryGiB: 0.5 };
const host: HostPrice = {
  cloud: 'linode',
  instanceType: 'g6-dedicated-2',
  vcpus: 2,
  memoryGiB: 4,
  usdPerHour: 0.054,
  source: 'test',
  date: '2026-09-17',
  via: 'test',
};
const wall: WallClockPrice = {
  name: 'wall',
  usdPerVcpuSecond: 0.000014,
  usdPerGibSecond: 0.0000045,
  source: 'test',
  date: 'test',
  via: 'test',
};
const flat: FlatSessionPrice = {
  name: 'flat',
  usdPerSession: 0.03,
  sessionSeconds: 1200,
  source: 'test',
  date: 'test',
  via: 'test',
};

describe('cost arithmetic, worked by hand', () => {
  it('trace totals with auto-pause after 300 s', () => {
    // resident = 600 active + min(3000, 300) idle = 900 s
    expect(traceTotals(trace, 300)).toEqual({
      sessions: 1,
      activeSec: 600,
      idleSec: 3000,
      wallSec: 3600,
      residentSec: 900,
    });
    // auto-pause 0 = never: resident = the whole 3600 s
    expect(traceTotals(trace, 0).residentSec).toBe(3600);
  });

  it('wall-clock hosted: 3600 s × (1 × 0.000014 + 0.5 × 0.0000045) = $0.0585; ÷ 1/6 h = $0.351 per active hour', () => {
    // 0.000014 + 0.00000225 = 0.00001625 $/s; × 3600 s = 0.0585 $
    const c = wallClockCost(wall, traceTotals(trace, 300), shape);
    expect(c.usd).toBeCloseTo(0.0585, 10);
    expect(c.usdPerActiveHour).toBeCloseTo(0.351, 10);
  });

  it('flat per session: ceil(3600 / 1200) = 3 blocks × $0.03 = $0.09; ÷ 1/6 h = $0.54 per active hour', () => {
    const c = flatSessionCost(flat, trace, traceTotals(trace, 300));
    expect(c.blocks).toBe(3);
    expect(c.usd).toBeCloseTo(0.09, 10);
    expect(c.usdPerActiveHour).toBeCloseTo(0.54, 10);
    // a 1201 s session starts a second block
    const t2 = parseTrace('session,state,seconds\na,active,1201\n');
    expect(flatSessionCost(flat, t2, traceTotals(t2, 300)).blocks).toBe(2);
  });

  it('SPACE on g6-dedicated-2 at 64 MiB per sandbox: CPU-bound at 3 slots, $0.027 per active hour', () => {
    // memory slots = floor((4 × 1024 − 1024) / 64) = floor(3072 / 64) = 48
    // active share = A / resident = 600 / 900 = 2/3 → CPU slots = floor(2 / (1 × 2/3)) = floor(3) = 3
    // slots = min(48, 3) = 3
    // cost = 900 s / 3600 × $0.054/h ÷ 3 = 0.25 × 0.018 = $0.0045; ÷ 1/6 h = $0.027 per active hour
    const c = selfHostedCost(host, traceTotals(trace, 300), shape, {
      densityMiB: 64,
      reserveMiB: 1024,
      autoPauseSec: 300,
      utilisation: 1,
    });
    expect([c.memorySlots, c.cpuSlots, c.slots]).toEqual([48, 3, 3]);
    expect(c.usd).toBeCloseTo(0.0045, 10);
    expect(c.usdPerActiveHour).toBeCloseTo(0.027, 10);
  });

  it('SPACE memory-bound: an idle-heavy trace on the same host, half-full hosts double the cost', () => {
    // one session: 60 s active, 29 idle periods of 120 s (below the 300 s auto-pause): all resident
    // A = 60, resident = 60 + 29 × 120 = 3540 s; active share = 60/3540 → CPU slots = floor(2 × 59) = 118
    // memory slots = floor(3072 / 64) = 48 → slots = 48
    // cost = 3540/3600 × 0.054 ÷ 48 ÷ 0.5 = 0.98333… × 0.054 / 24 = $0.0022125
    // per active hour = 0.0022125 ÷ (60/3600) = $0.13275
    const rows = ['session,state,seconds', 'a,active,60', ...Array.from({ length: 29 }, () => 'a,idle,120')];
    const t = parseTrace(rows.join('\n'));
    const c = selfHostedCost(host, traceTotals(t, 300), shape, {
      densityMiB: 64,
      reserveMiB: 1024,
      autoPauseSec: 300,
      utilisation: 0.5,
    });
    expect([c.memorySlots, c.cpuSlots, c.slots]).toEqual([48, 118, 48]);
    expect(c.usd).toBeCloseTo(0.0022125, 10);
    expect(c.usdPerActiveHour).toBeCloseTo(0.13275, 10);
  });

  it('rejects malformed traces with the line', () => {
    expect(() => parseTrace('session,state,seconds\na,busy,3\n')).toThrow(/line 2/);
    expect(() => parseTrace('a,b,c\n')).toThrow(/first row/);
  });
});

describe('shipped inputs', () => {
  it('every price in the catalogue has a source URL and an ISO date', () => {
    const c = loadCatalogue();
    expect(c.hosts.length).toBeGreaterThan(0);
    for (const h of [...c.hosts, c.hosted.wallClock]) {
      expect(h.source).toMatch(/^https:\/\//);
      expect(h.date).toMatch(/^\d{4}-\d{2}-\d{2}$/);
      expect(h.via.length).toBeGreaterThan(0);
    }
    expect(c.hosted.flatSession.date).toMatch(/^\d{4}-\d{2}-\d{2}$/);
  });

  it('the agent trace mostly waits for a model; the busy one mostly works', () => {
    const share = (file: string) => {
      const t = traceTotals(parseTrace(readFileSync(file, 'utf8')), 0);
      return t.activeSec / t.wallSec;
    };
    const traces = defaultTraces();
    expect(share(traces['agent']!)).toBeLessThan(0.2);
    expect(share(traces['busy']!)).toBeGreaterThan(0.8);
  });
});
