import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { trace } from '@opentelemetry/api';
import { afterEach, describe, expect, it, vi } from 'vitest';
import {
  inChildSpan,
  inSpan,
  recordSpan,
  spanClockMs,
  startTracing,
  TRACE_FILE_FLUSH_MS,
  type TraceFileSpan,
  type Tracing,
  traceContextFrom,
} from './tracing.ts';

const spansIn = async (path: string): Promise<TraceFileSpan[]> =>
  (await readFile(path, 'utf8'))
    .split('\n')
    .filter((l) => l.startsWith('{"name"'))
    .map((l) => JSON.parse(l) as TraceFileSpan);

describe('SPACE_TRACE_FILE exporter (a real file)', () => {
  let dir = '';
  let tracing: Tracing | null = null;
  afterEach(async () => {
    await tracing?.shutdown();
    trace.disable();
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  it('appends nested spans to what the file held; a file that cannot be opened yet is opened for a later batch; steps record only in a sampled trace', async () => {
    // one provider per process: the module's tracer stays bound to the first one registered
    dir = await mkdtemp(join(tmpdir(), 'space-tracing-'));
    const path = join(dir, 'later', 'spans.jsonl');
    tracing = startTracing('space-unit', { SPACE_TRACE_FILE: path });
    await inSpan('lost', {}, async () => {});
    await sleep(5 * TRACE_FILE_FLUSH_MS); // its batch fails: the directory is not there
    await mkdir(join(dir, 'later'));
    await writeFile(path, 'kept line\n');
    await inSpan('outer', { 'space.k': 'v' }, () => inSpan('inner', {}, async () => {}));
    await inSpan('second batch', {}, async () => {});
    // steps that timers also take: a span only inside a sampled trace
    const remote = (flags: string) =>
      traceContextFrom({ traceparent: `00-${'ab'.repeat(16)}-${'cd'.repeat(8)}-${flags}` });
    expect(await inChildSpan('orphan step', {}, async () => 7)).toBe(7);
    await inSpan('parent', {}, () => inChildSpan('child step', {}, async () => {}));
    await inChildSpan('unsampled step', {}, async () => {}, remote('00'));
    await inChildSpan('remote step', {}, async () => {}, remote('01'));
    const t = performance.now();
    recordSpan('late step', {}, t - 5, t, remote('01'));
    recordSpan('late unsampled step', {}, t - 5, t, remote('00'));
    recordSpan('late orphan step', {}, t - 5, t, traceContextFrom({}));
    // back-to-back spans a fraction of a millisecond long: each starts where the one before ended
    for (let i = 0; i < 10; i++) {
      await inSpan(`tick ${i}`, {}, async () => {
        for (const until = performance.now() + 0.2; performance.now() < until; );
      });
    }
    await tracing!.shutdown(); // writes what is still buffered
    const text = await readFile(path, 'utf8');
    expect(text.startsWith('kept line\n')).toBe(true);
    const spans = await spansIn(path);
    const ticks = spans.filter((s) => s.name.startsWith('tick ')).sort((a, b) => a.startMs - b.startMs);
    expect(ticks.map((s) => s.name)).toEqual(Array.from({ length: 10 }, (_, i) => `tick ${i}`));
    for (const [i, s] of ticks.entries()) {
      expect(s.durationMs).toBeGreaterThanOrEqual(0.2);
      // whole-millisecond starts (Date.now()) put a tick before the end of the one before it
      if (i > 0) expect(s.startMs).toBeGreaterThan(ticks[i - 1]!.startMs + ticks[i - 1]!.durationMs - 0.001);
    }
    expect(
      spans
        .filter((s) => !s.name.startsWith('tick '))
        .map((s) => s.name)
        .sort(),
    ).toEqual(['child step', 'inner', 'late step', 'outer', 'parent', 'remote step', 'second batch']);
    const byName = (n: string) => spans.find((s) => s.name === n)!;
    expect(byName('child step').parentId).toBe(byName('parent').spanId);
    expect(byName('remote step').parentId).toBe('cd'.repeat(8));
    expect(byName('late step')).toMatchObject({ traceId: 'ab'.repeat(16), parentId: 'cd'.repeat(8) });
    expect(byName('late step').durationMs).toBeCloseTo(5, 0);
    const outer = spans.find((s) => s.name === 'outer')!;
    const inner = spans.find((s) => s.name === 'inner')!;
    expect(inner.parentId).toBe(outer.spanId);
    expect(inner.traceId).toBe(outer.traceId);
    expect(outer).toMatchObject({ service: 'space-unit', status: 'ok', attributes: { 'space.k': 'v' } });
  });
});

describe('spanClockMs', () => {
  afterEach(() => vi.restoreAllMocks());

  it('counts on from the wall clock with sub-ms digits, never backwards, and follows the wall clock when it steps', () => {
    let last = spanClockMs();
    let fractional = 0;
    for (let i = 0; i < 2000; i++) {
      const wall = Date.now();
      const t = spanClockMs();
      expect(t).toBeGreaterThanOrEqual(last);
      expect(t).toBeGreaterThan(wall - 1);
      expect(t).toBeLessThan(Date.now() + 2);
      if (!Number.isInteger(t)) fractional++;
      last = t;
    }
    expect(fractional).toBeGreaterThan(1000);
    // a performance.now() value of 3 ms ago reads 3 ms before now
    const p = performance.now();
    expect(spanClockMs(p) - spanClockMs(p - 3)).toBeCloseTo(3, 6);
    // the wall clock stepped 50 ms ahead (NTP): the next reading follows it
    const real = Date.now.bind(Date);
    vi.spyOn(Date, 'now').mockImplementation(() => real() + 50);
    const wall = Date.now();
    const t = spanClockMs();
    expect(t).toBeGreaterThan(wall - 1);
    expect(t).toBeLessThan(Date.now() + 2);
  });
});
