/**
 * `space bench pause-resume` (also `npm run bench:pause`): pause and resume latency as a client sees
 * them, beside the driver's own bare cost measured in the same run (local gVisor nodes only).
 *
 * Figures (ms, each sample one request, sequential):
 * - `pause-frozen`, `resume-frozen`, `pause-hibernated`, `resume-hibernated`: POST …/pause or
 *   …/resume until its operation succeeded (long-poll).
 * - `traffic-frozen`, `traffic-hibernated`: a sandbox paused that way gets `POST /commands`
 *   (`echo x`); time from the POST to the first stdout event — the resume-on-traffic a client
 *   pays, with no client change.
 * - `traffic-running` (floor of the two above): the same command on a running sandbox.
 * - `op-noop` (floor of the operation path): a resume of a running sandbox — an operation that
 *   has nothing to do.
 * - Driver floors (`--no-floor` skips; needs root, runs on this host): the gVisor driver's own
 *   `pause`, `resume` (to /health), `snapshot` and snapshot `restore`, from `gvisor-lib.ts`.
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
  type PlotPoint,
  type RunInfo,
  renderSvg,
} from './report.ts';
import { summarise } from './stats.ts';

/** Samples (ms) by figure name, in the order first measured. */
export type PauseResumeSamples = Record<string, number[]>;

/** Measures the API figures (see the module doc) on two sandboxes it creates and deletes. */
export async function measurePauseResume(
  client: BenchClient,
  o: { n: number; progress: ProgressFactory },
): Promise<PauseResumeSamples> {
  const { api, waitOp } = client;
  /** ms from POST /commands (`echo x`) until the first stdout event. */
  const firstOutput = (id: string) => client.firstOutput(id, 'x');
  const samples: PauseResumeSamples = {};
  const add = (k: string, v: number) => {
    samples[k] = [...(samples[k] ?? []), v];
  };
  /** ms from the POST to the operation's success. */
  const timedOp = async (path: string, body?: unknown) => {
    const t0 = performance.now();
    const { operation } = await api<{ operation: { id: string } }>('POST', path, body);
    await waitOp(operation.id);
    return performance.now() - t0;
  };
  const created: string[] = [];
  try {
    for (const mode of ['frozen', 'hibernated'] as const) {
      const bar = o.progress.phase(`pause-resume ${mode}`, o.n);
      const { sandbox, operation } = await api<{ sandbox: { id: string }; operation: { id: string } }>(
        'POST',
        '/v1/sandboxes',
        { template: 'base', autoPauseSec: 0 },
      );
      created.push(sandbox.id);
      await waitOp(operation.id);
      const path = `/v1/sandboxes/${sandbox.id}`;
      for (let i = 0; i < o.n; i++) {
        add(`pause-${mode}`, await timedOp(`${path}/pause`, { mode }));
        add(`resume-${mode}`, await timedOp(`${path}/resume`));
        await timedOp(`${path}/pause`, { mode });
        add(`traffic-${mode}`, await firstOutput(sandbox.id));
        add('traffic-running', await firstOutput(sandbox.id));
        add('op-noop', await timedOp(`${path}/resume`));
        bar.tick();
      }
      bar.stop();
    }
  } finally {
    for (const id of created) await api('DELETE', `/v1/sandboxes/${id}`).catch(() => {});
  }
  return samples;
}

/**
 * The gVisor driver's own pause, resume, snapshot and restore on this host (`floor-driver-*`, ms),
 * `n` samples each. Needs root; builds/reuses template `base` in `cacheDir`.
 */
export async function pauseResumeFloor(n: number, cacheDir: string): Promise<PauseResumeSamples> {
  const [{ SandboxNetworks }, { measureGvisor }] = await Promise.all([
    import('../runtime/agent/host/network.ts'),
    import('./gvisor-lib.ts'),
  ]);
  const f = await measureGvisor({
    platform: await gvisorPlatform(),
    runs: n,
    stateDir: await mkdtemp(join(tmpdir(), 'space-bench-pause-')),
    image: await baseDirectoryImage(cacheDir),
    nets: new SandboxNetworks({ pool: '10.79.3.0/24' }),
    loops: false,
    idPrefix: 'pr',
  });
  return {
    'floor-driver-pause': f.pause,
    'floor-driver-resume': f.resume,
    'floor-driver-snapshot': f.snapshot,
    'floor-driver-restore': f.restoreCreate,
  };
}

/** The table, JSON document and plot of a pause-resume run. */
export async function pauseResumeOutput(
  samples: PauseResumeSamples,
  params: { n: number; floor: boolean },
  run: RunInfo,
): Promise<BenchOutput> {
  const figs = Object.entries(samples).map(([name, xs]) => ({ name, unit: 'ms', samples: xs }));
  const doc: BenchDocument = {
    schema: BENCH_SCHEMA,
    command: 'pause-resume',
    run,
    params,
    samples,
    summary: Object.fromEntries(figs.map((f) => [f.name, summarise(f.samples)])),
    assumptions: [
      'Sequential, one request at a time; an operation is timed from its POST to its success (long-poll).',
      'traffic-* is the resume a client pays on its first command to a paused sandbox (POST /commands → first stdout event).',
      params.floor
        ? 'floor-driver-* are the gVisor driver’s own calls on this host, measured in this run.'
        : 'Driver floor not measured (--no-floor).',
    ],
  };
  const points: PlotPoint[] = figs.flatMap((f) => f.samples.map((value) => ({ series: f.name, value })));
  return {
    doc,
    markdown: composeMarkdown(`space bench pause-resume — n=${params.n}`, figureTable(figs), doc),
    svg: await renderSvg(distributionSpec('Pause / resume (ms, log scale)', 'ms', points, true)),
  };
}
