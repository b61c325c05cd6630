import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { trace } from '@opentelemetry/api';
import { afterEach, describe, expect, it } from 'vitest';
import { inSpan, startTracing, TRACE_FILE_FLUSH_MS, type TraceFileSpan, type Tracing } from './tracing.ts';

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

  it('appends nested spans to what the file held; a file that cannot be opened yet is opened for a later batch', async () => {
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
    await tracing!.shutdown(); // writes what is still buffered
    const text = await readFile(path, 'utf8');
    expect(text.startsWith('kept line\n')).toBe(true);
    const spans = await spansIn(path);
    expect(spans.map((s) => s.name).sort()).toEqual(['inner', 'outer', 'second batch']);
    const outer = spans.find((s) => s.name === 'outer')!;
    const inner = spans.find((s) => s.name === 'inner')!;
    expect(inner.parentId).toBe(outer.spanId);
    expect(inner.traceId).toBe(outer.traceId);
    expect(outer).toMatchObject({ service: 'space-unit', status: 'ok', attributes: { 'space.k': 'v' } });
  });
});
