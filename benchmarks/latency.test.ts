import { describe, expect, it } from 'vitest';
import type { BenchClient } from './api.ts';
import { apiStatusError } from './api.ts';
import {
  type CreateMode,
  type CreateSample,
  errorCounts,
  latencyRows,
  measureCreates,
  samplesOf,
  timeCreate,
  waitForPool,
} from './latency.ts';
import { progressFactory } from './progress.ts';

function sample(p: Partial<CreateSample>): CreateSample {
  return {
    concurrency: 1,
    phase: 'warm',
    wave: 0,
    source: 'warm',
    acceptedMs: 1,
    readyMs: 10,
    firstOutputMs: 20,
    ...p,
  };
}

describe('latency classification', () => {
  // a warm-phase wave that outran the pool: two claims, then a boot and a snapshot restore;
  // the cold phase: boots, plus one create the API refused
  const all: CreateSample[] = [
    sample({ readyMs: 12 }),
    sample({ readyMs: 14 }),
    sample({ source: 'boot', readyMs: 900 }),
    sample({ source: 'snapshot', readyMs: 300 }),
    sample({ phase: 'cold', source: 'boot', readyMs: 800 }),
    sample({ phase: 'cold', source: 'boot', readyMs: 1000 }),
    sample({ phase: 'cold', source: null, readyMs: Number.NaN, error: 'POST /v1/sandboxes: 503 capacity' }),
    sample({ concurrency: 8, readyMs: 50 }),
  ];

  it('warm figures count only warm claims, whatever phase they ran in', () => {
    expect(samplesOf(all, 'warm', 1).map((s) => s.readyMs)).toEqual([12, 14]);
  });

  it('cold (boot) figures count only boots — the warm phase’s boot included, no claim, no failure', () => {
    expect(samplesOf(all, 'boot', 1).map((s) => s.readyMs)).toEqual([900, 800, 1000]);
    expect(samplesOf(all, 'snapshot', 1).map((s) => s.readyMs)).toEqual([300]);
  });

  it('rows are per concurrency and class, with the ratio to the floor on ready and first output', () => {
    const rows = latencyRows(all, 100);
    const warmReady = rows.find((r) => r.concurrency === 1 && r.source === 'warm' && r.metric === 'ready')!;
    expect(warmReady.summary).toMatchObject({ n: 2, p50: 12, max: 14 });
    expect(warmReady.p50OverFloor).toBeCloseTo(0.12);
    const bootReady = rows.find((r) => r.concurrency === 1 && r.source === 'boot' && r.metric === 'ready')!;
    expect(bootReady.summary).toMatchObject({ n: 3, p50: 900, max: 1000 });
    expect(rows.find((r) => r.metric === 'accepted')!.p50OverFloor).toBeNaN();
    expect(rows.filter((r) => r.concurrency === 8).map((r) => r.source)).toEqual(['warm', 'warm', 'warm']);
  });

  it('failures are counted per phase, never timed', async () => {
    expect(errorCounts(all)).toEqual([
      { concurrency: 1, phase: 'cold', errors: 1, refused: 0, first: 'POST /v1/sandboxes: 503 capacity' },
    ]);
    // a POST refused for want of room (503 with Retry-After) is counted as such
    const refusal = apiStatusError(
      'POST',
      '/v1/sandboxes',
      503,
      '{"error":{"code":"NODE_CAPACITY_EXHAUSTED","message":"no node has room"}}',
      '2',
    );
    expect(refusal).toMatchObject({ status: 503, code: 'NODE_CAPACITY_EXHAUSTED', retryAfterSec: 2 });
    expect(refusal.message).toContain('refused at once, 503 NODE_CAPACITY_EXHAUSTED (Retry-After 2 s)');
    expect(apiStatusError('GET', '/x', 500, 'oops', undefined)).toMatchObject({
      message: 'GET /x: 500 oops',
      code: null,
      retryAfterSec: null,
    });
    // timeCreate marks a POST refused with Retry-After as refused, and no other failure
    const failing = (err: Error) =>
      ({
        async api() {
          throw err;
        },
      }) as unknown as BenchClient;
    const meta = { concurrency: 4, phase: 'warm', wave: 0 } as const;
    expect(await timeCreate(failing(refusal), {}, meta)).toMatchObject({
      id: null,
      sample: { refused: true },
    });
    const other = await timeCreate(
      failing(apiStatusError('POST', '/v1/sandboxes', 500, 'oops', undefined)),
      {},
      meta,
    );
    expect(other.sample.refused).toBeUndefined();
    const refused = sample({ phase: 'warm', concurrency: 4, error: refusal.message, refused: true });
    expect(errorCounts([refused, refused])).toEqual([
      { concurrency: 4, phase: 'warm', errors: 2, refused: 2, first: refusal.message },
    ]);
  });

  it('waitForPool returns at the wanted count, or when the pool stops growing', async () => {
    let n = 0;
    expect(await waitForPool(async () => ++n, 3, { pollMs: 1 })).toBe(3);
    expect(await waitForPool(async () => 2, 5, { stableMs: 20, pollMs: 5 })).toBe(2);
    // an empty pool is still filling, however long it stays empty: only the timeout ends the wait
    const t0 = Date.now();
    expect(await waitForPool(async () => 0, 5, { stableMs: 20, timeoutMs: 150, pollMs: 5 })).toBe(0);
    expect(Date.now() - t0).toBeGreaterThanOrEqual(150);
  });
});

describe('a wave’s commands and its creates', () => {
  /**
   * A client whose creates become ready after different delays (ms, in order of the POSTs); it
   * records the order of "ready" and "command" events. Only the ordering is under test here; the
   * real API is in bench.int.test.ts.
   */
  function recordingClient(readyAfterMs: number[]): { client: BenchClient; events: string[] } {
    const events: string[] = [];
    let created = 0;
    const ready = async (i: number) => {
      await new Promise((r) => setTimeout(r, readyAfterMs[i]));
      events.push(`ready sbx${i}`);
    };
    const client: BenchClient = {
      async api<T>(method: string, path: string) {
        if (method === 'POST' && path.split('?')[0] === '/v1/sandboxes') {
          const i = created++;
          // ?waitMs=: the API answers once the create has ended; else at once, and waitOp waits
          const waits = path.includes('?waitMs=');
          if (waits) await ready(i);
          events.push(`answer sbx${i}`);
          const state = waits ? 'succeeded' : 'pending';
          return { sandbox: { id: `sbx${i}` }, operation: { id: `op${i}`, state } } as T;
        }
        return { createdFrom: 'warm', fromWarmPool: true } as T;
      },
      async waitReady() {},
      async waitOp(id) {
        events.push(`poll ${id}`);
        await ready(Number(id.slice(2)));
      },
      async streamTimes() {
        throw new Error('not used: commands go through firstOutput');
      },
      async firstOutput(id) {
        events.push(`command ${id}`);
        return 1;
      },
    };
    return { client, events };
  }

  const run = (client: BenchClient, overlap: boolean, mode?: CreateMode, warmupWaves?: number) =>
    measureCreates({
      client,
      concurrency: 3,
      n: 3,
      phase: 'warm',
      body: {},
      overlap,
      mode,
      warmupWaves,
      progress: progressFactory(true),
    });
  const commands = (events: string[]) => events.filter((e) => e.startsWith('command'));

  it('by default no command is posted before the whole wave is ready', async () => {
    const { client, events } = recordingClient([5, 60, 30]);
    const samples = await run(client, false);
    const firstCommand = events.findIndex((e) => e.startsWith('command'));
    expect(events.slice(0, firstCommand).filter((e) => e.startsWith('ready'))).toHaveLength(3);
    expect(commands(events).sort()).toEqual(['command sbx0', 'command sbx1', 'command sbx2']);
    for (const s of samples) {
      expect(s.source).toBe('warm');
      expect(s.readyMs).toBeGreaterThan(0);
      expect(s.firstOutputMs).toBeGreaterThanOrEqual(0);
    }
  });

  it('by default a create is one POST that answers once ready; --poll answers at once, then long-polls', async () => {
    const waited = recordingClient([20, 40, 30]);
    const one = await run(waited.client, false);
    expect(waited.events.some((e) => e.startsWith('poll'))).toBe(false);
    // each answer comes after its own ready
    for (const i of [0, 1, 2])
      expect(waited.events.indexOf(`ready sbx${i}`)).toBeLessThan(waited.events.indexOf(`answer sbx${i}`));
    for (const s of one) {
      expect(s.acceptedMs).toBeNaN(); // not measurable in one request
      expect(s.readyMs).toBeGreaterThanOrEqual(19); // the fastest create's 20 ms (timers run ~1 ms early)
    }

    const polled = recordingClient([20, 40, 30]);
    const two = await run(polled.client, false, 'poll');
    for (const i of [0, 1, 2]) {
      expect(polled.events.indexOf(`answer sbx${i}`)).toBeLessThan(polled.events.indexOf(`poll op${i}`));
      expect(polled.events.indexOf(`poll op${i}`)).toBeLessThan(polled.events.indexOf(`ready sbx${i}`));
    }
    for (const s of two) {
      expect(s.acceptedMs).toBeLessThan(s.readyMs);
      expect(s.readyMs).toBeGreaterThanOrEqual(19); // the fastest create's 20 ms (timers run ~1 ms early)
    }
    // accepted has no row where no sample measured it
    const rows = (xs: CreateSample[]) => latencyRows(xs, Number.NaN).map((r) => r.metric);
    expect(new Set(rows(one))).toEqual(new Set(['ready', 'first output']));
    expect(new Set(rows(two))).toEqual(new Set(['accepted', 'ready', 'first output']));
  });

  it('warm-up waves run in full (creates and commands) before the timed ones, and are not sampled', async () => {
    const { client, events } = recordingClient([20, 40, 30, 20, 40, 30, 20, 40, 30]);
    const samples = await run(client, false, 'wait', 2);
    expect(samples).toHaveLength(3);
    expect(samples.map((s) => s.wave)).toEqual([0, 0, 0]);
    expect(events.filter((e) => e.startsWith('answer'))).toHaveLength(9);
    expect(commands(events)).toHaveLength(9);
    // the timed wave is the last one: its sandboxes are the last three created
    const timed = events.slice(
      events.findIndex((e) => e === 'answer sbx6' || e === 'answer sbx7' || e === 'answer sbx8'),
    );
    expect(commands(timed).sort()).toEqual(['command sbx6', 'command sbx7', 'command sbx8']);
  });

  it('with overlap each command follows its own create, beside the later ones', async () => {
    const { client, events } = recordingClient([5, 60, 30]);
    await run(client, true);
    expect(events.indexOf('command sbx0')).toBeLessThan(events.indexOf('ready sbx1'));
    expect(events.indexOf('ready sbx0')).toBeLessThan(events.indexOf('command sbx0'));
  });
});
