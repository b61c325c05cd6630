#!/usr/bin/env node
/**
 * Pause and resume latency as a client sees them, against a running SPACE (the local stack by
 * default: `npm start` in another terminal; or `--target URL --api-key K`), beside the driver's
 * own bare cost measured in the same run (local gVisor nodes only).
 *
 *   npm run bench:pause -- [--n 5] [--no-floor] [--out FILE]
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
 * Prints min / p50 / max per figure and writes JSON (commit, Node, CPU, target, samples) to
 * `benchmarks/results/`.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, writeFileSync } from 'node:fs';
import { mkdtemp } from 'node:fs/promises';
import { cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Command } from 'commander';
import { directoryImage } from '../runtime/agent/images.ts';
import { SandboxNetworks } from '../runtime/agent/network.ts';
import { buildTemplate } from '../runtime/agent/templates.ts';
import { resolveEndpoint } from '../runtime/cli/local.ts';
import { TEST_CACHE_DIR } from '../test/cache-dir.ts';
import { benchClient } from './api.ts';
import { measureGvisor, median } from './gvisor-lib.ts';

interface Opts {
  n: string;
  floor: boolean;
  target?: string;
  apiKey?: string;
  out?: string;
}

const opts = new Command('pause-resume')
  .description('Pause/resume and resume-on-traffic latency against a running SPACE, beside the driver floor')
  .option('--n <count>', 'samples per figure', '5')
  .option('--no-floor', 'skip the driver floor (remote targets, or no root)')
  .option('--target <url>', 'API URL (default: the local stack)')
  .option('--api-key <key>', 'API key (default: the local stack’s)')
  .option('--out <file>', 'JSON results file (default: benchmarks/results/pause-resume-<time>.json)')
  .parse()
  .opts<Opts>();
const ep = resolveEndpoint({ apiUrl: opts.target, apiKey: opts.apiKey });
const n = Number(opts.n);
if (!Number.isInteger(n) || n < 1) throw new Error('--n takes a positive integer');

const { api, waitOp, waitReady, streamTimes } = benchClient(ep);

/** ms from the POST to the operation's success. */
async function timedOp(path: string, body?: unknown): Promise<number> {
  const t0 = performance.now();
  const { operation } = await api<{ operation: { id: string } }>('POST', path, body);
  await waitOp(operation.id);
  return performance.now() - t0;
}

/** ms from POST /commands (`echo x`) until the first stdout event. */
async function firstOutput(id: string): Promise<number> {
  const t0 = performance.now();
  const res = await api<{ stream: { url: string; token: string } }>('POST', `/v1/sandboxes/${id}/commands`, {
    cmd: 'echo',
    args: ['x'],
  });
  return (await streamTimes(res.stream.url, res.stream.token, t0)).first;
}

const samples: Record<string, number[]> = {};
function add(k: string, v: number): void {
  samples[k] = [...(samples[k] ?? []), v];
}

const created: string[] = [];
await waitReady('base');
try {
  for (const mode of ['frozen', 'hibernated'] as const) {
    const { sandbox, operation } = await api<{ sandbox: { id: string }; operation: { id: string } }>(
      'POST',
      '/v1/sandboxes',
      { template: 'base', autoPauseSec: 0 },
    );
    created.push(sandbox.id);
    await waitOp(operation.id);
    const path = `/v1/sandboxes/${sandbox.id}`;
    for (let i = 0; i < n; i++) {
      add(`pause-${mode}`, await timedOp(`${path}/pause`, { mode }));
      add(`resume-${mode}`, await timedOp(`${path}/resume`));
      await timedOp(`${path}/pause`, { mode });
      add(`traffic-${mode}`, await firstOutput(sandbox.id));
      add('traffic-running', await firstOutput(sandbox.id));
      add('op-noop', await timedOp(`${path}/resume`));
      process.stderr.write(`${mode} ${i + 1}/${n}\n`);
    }
  }
} finally {
  for (const id of created) await api('DELETE', `/v1/sandboxes/${id}`).catch(() => {});
}

if (opts.floor) {
  process.stderr.write('driver floor (gVisor, this host)…\n');
  const nodeBinary = [
    fileURLToPath(new URL('../node_modules/node/bin/node', import.meta.url)),
    process.execPath,
  ].find((p) => existsSync(p))!;
  await buildTemplate('base', { cacheDir: TEST_CACHE_DIR });
  const image = await directoryImage('base', TEST_CACHE_DIR, {
    nodeBinary,
    tiniBinary: '/usr/bin/tini-static',
  });
  const f = await measureGvisor({
    platform: 'ptrace',
    runs: n,
    stateDir: await mkdtemp(join(tmpdir(), 'space-bench-pause-')),
    image,
    nets: new SandboxNetworks({ pool: '10.79.3.0/24' }),
    loops: false,
    idPrefix: 'pr',
  });
  samples['floor-driver-pause'] = f.pause;
  samples['floor-driver-resume'] = f.resume;
  samples['floor-driver-snapshot'] = f.snapshot;
  samples['floor-driver-restore'] = f.restoreCreate;
}

const fmt = (x: number) => x.toFixed(1).padStart(9);
console.log(
  `${'figure'.padEnd(24)}${'min'.padStart(9)}${'p50'.padStart(9)}${'max'.padStart(9)}  (ms, n=${n})`,
);
for (const [k, xs] of Object.entries(samples)) {
  console.log(`${k.padEnd(24)}${fmt(Math.min(...xs))}${fmt(median(xs))}${fmt(Math.max(...xs))}`);
}
const commit = (() => {
  try {
    return execFileSync('git', ['rev-parse', '--short', 'HEAD'], { encoding: 'utf8' }).trim();
  } catch {
    return 'unknown';
  }
})();
const out =
  opts.out ?? `benchmarks/results/pause-resume-${new Date().toISOString().replace(/[:.]/g, '-')}.json`;
mkdirSync(join(out, '..'), { recursive: true });
writeFileSync(
  out,
  JSON.stringify(
    {
      commit,
      node: process.version,
      cpu: cpus()[0]?.model,
      cpus: cpus().length,
      target: ep.apiUrl,
      n,
      samples,
    },
    null,
    2,
  ),
);
console.log(`results: ${out}`);
