/**
 * `space bench exec`: command round trip and output stream throughput on one running sandbox, as a
 * client sees them (through the data plane the API hands out: the router on a local stack).
 * - `roundTripMs` (`exec-roundtrip-<n>x`): POST /commands `true` → its exit event on the stream, ms;
 * - `stream` (`exec-stream-<mib>MiB-<m>x`): a command writing `<mib>` MiB to stdout
 *   (`head -c <mib>M /dev/zero`); MiB/s = stdout bytes received ÷ (exit event − first stdout event);
 * - `floorMs` (`floor-runsc-exec`, gVisor on a local stack; `--no-floor` skips): the driver's bare
 *   cost of running a command in a running sandbox, `runsc exec <id> /bin/true` into a bare idle
 *   container of the same template, measured in the same run (benchmarks/gvisor-lib.ts).
 */
import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { BenchClient } from './api.ts';
import { baseDirectoryImage, gvisorPlatform } from './floor.ts';
import type { ProgressFactory } from './progress.ts';
import {
  BENCH_SCHEMA,
  type BenchDocument,
  type BenchOutput,
  composeMarkdown,
  distributionSpec,
  figureTable,
  type RunInfo,
  renderSvg,
} from './report.ts';
import { summarise } from './stats.ts';

/** Raw samples of one exec run. */
export interface ExecSamples {
  /** ms per round trip. */
  roundTripMs: number[];
  /** One entry per stream run: bytes received and the ms from first stdout event to exit. */
  stream: { bytes: number; ms: number }[];
  /** The driver floor, ms per bare `runsc exec` (absent: not measured). */
  floorMs?: number[];
}

/** MiB/s of one stream sample (bytes ÷ 2^20 ÷ seconds). Pure. */
export function mibPerSecond(s: { bytes: number; ms: number }): number {
  return s.bytes / 1_048_576 / (s.ms / 1000);
}

/** Runs the exec benchmark on a sandbox it creates and deletes. */
export async function measureExec(
  client: BenchClient,
  o: { n: number; streams: number; streamMiB: number; progress: ProgressFactory },
): Promise<ExecSamples> {
  const { sandbox, operation } = await client.api<{ sandbox: { id: string }; operation: { id: string } }>(
    'POST',
    '/v1/sandboxes',
    { template: 'base', timeoutSec: 600 },
  );
  const out: ExecSamples = { roundTripMs: [], stream: [] };
  try {
    await client.waitOp(operation.id);
    const command = async (body: Record<string, unknown>) =>
      client.api<{ stream: { url: string; token: string } }>(
        'POST',
        `/v1/sandboxes/${sandbox.id}/commands`,
        body,
      );
    let bar = o.progress.phase('exec round trip', o.n);
    for (let i = 0; i < o.n; i++) {
      const t0 = performance.now();
      const c = await command({ cmd: 'true' });
      out.roundTripMs.push((await client.streamTimes(c.stream.url, c.stream.token, t0)).exit);
      bar.tick();
    }
    bar.stop();
    bar = o.progress.phase(`exec stream ${o.streamMiB} MiB`, o.streams);
    for (let i = 0; i < o.streams; i++) {
      const t0 = performance.now();
      const c = await command({ cmd: 'head', args: ['-c', `${o.streamMiB}M`, '/dev/zero'] });
      const r = await client.streamTimes(c.stream.url, c.stream.token, t0);
      if (r.stdoutBytes !== o.streamMiB * 1_048_576) {
        throw new Error(`stream run ${i}: got ${r.stdoutBytes} bytes of ${o.streamMiB * 1_048_576}`);
      }
      out.stream.push({ bytes: r.stdoutBytes, ms: r.exit - r.first });
      bar.tick();
    }
    bar.stop();
    return out;
  } finally {
    await client.api('DELETE', `/v1/sandboxes/${sandbox.id}`).catch(() => {});
  }
}

/**
 * The gVisor driver's exec floor on this host, `n` samples (ms): see {@link runscExecFloor}.
 * Needs root and the template `base` built in `cacheDir`.
 */
export async function execFloor(n: number, cacheDir: string, onSample?: () => void): Promise<number[]> {
  const { runscExecFloor } = await import('./gvisor-lib.ts');
  return runscExecFloor({
    image: await baseDirectoryImage(cacheDir),
    runs: n,
    stateDir: await mkdtemp(join(tmpdir(), 'space-bench-exec-')),
    platform: await gvisorPlatform(),
    runscBinary: process.env['SPACE_RUNSC_BINARY'] ?? 'runsc',
    onSample,
  });
}

/** Round trip p50 ÷ floor p50, or null without floor samples. Pure. */
export function floorRatio(s: ExecSamples): number | null {
  if (!s.floorMs?.length || s.roundTripMs.length === 0) return null;
  return summarise(s.roundTripMs).p50 / summarise(s.floorMs).p50;
}

/** The table, JSON document and plot of an exec run. */
export async function execOutput(
  s: ExecSamples,
  params: { n: number; streams: number; streamMiB: number; floor: boolean },
  run: RunInfo,
): Promise<BenchOutput> {
  const rt = summarise(s.roundTripMs);
  const tp = summarise(s.stream.map(mibPerSecond));
  const ratio = floorRatio(s);
  const table = figureTable([
    { name: `exec-roundtrip-${params.n}x`, unit: 'ms', samples: s.roundTripMs },
    {
      name: `exec-stream-${params.streamMiB}MiB-${params.streams}x`,
      unit: 'MiB/s',
      samples: s.stream.map(mibPerSecond),
    },
    ...(s.floorMs ? [{ name: `floor-runsc-exec-${s.floorMs.length}x`, unit: 'ms', samples: s.floorMs }] : []),
  ]);
  const doc: BenchDocument = {
    schema: BENCH_SCHEMA,
    command: 'exec',
    run,
    params,
    samples: s,
    summary: {
      roundTripMs: rt,
      streamMiBPerSecond: tp,
      ...(s.floorMs ? { floorMs: summarise(s.floorMs), roundTripOverFloor: ratio } : {}),
    },
    assumptions: [
      'Round trip: POST /commands `true` until its exit event arrives on the SSE stream (data plane as the API hands it out).',
      `Stream: \`head -c ${params.streamMiB}M /dev/zero\`; MiB/s = stdout bytes received ÷ time from the first stdout event to the exit event (the command's own run time included).`,
      'Percentiles are nearest-rank; for throughput a low percentile is the slow end.',
      s.floorMs
        ? 'Floor: `runsc exec <id> /bin/true` into a bare idle gVisor container of template base on this host (no guest daemon, no network), one at a time, in this run.'
        : 'Driver floor not measured (--no-floor, a remote target, or a driver without one).',
    ],
  };
  const spec = {
    title: 'exec',
    vconcat: [
      distributionSpec('Round trip (ms)', 'ms', [
        ...s.roundTripMs.map((v) => ({ series: 'round trip', value: v })),
        ...(s.floorMs ?? []).map((v) => ({ series: 'floor: bare runsc exec', value: v })),
      ]),
      distributionSpec(
        'Stream throughput (MiB/s)',
        'MiB/s',
        s.stream.map((v) => ({ series: 'stdout stream', value: mibPerSecond(v) })),
      ),
    ],
  };
  const notes = ratio === null ? [] : [`Round trip p50 ÷ floor p50: ${ratio.toFixed(1)}×.`];
  return {
    doc,
    markdown: composeMarkdown('space bench exec', table, doc, notes),
    svg: await renderSvg(spec),
  };
}
