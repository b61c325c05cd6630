#!/usr/bin/env node
/**
 * Creation latency and exec round trip, measured as a client sees them, against a running SPACE
 * (the local stack by default: `npm start` in another terminal; or `--target URL --api-key K`).
 *
 *   npm run bench -- [--n 10] [--exec-n 30] [--scenarios create-warm,create-cold,exec-roundtrip] [--out FILE]
 *
 * Scenarios (sequential, one sandbox at a time, so each figure is one request's latency):
 * - `create-warm-<n>x`: default shape (1 vCPU, 512 MiB — the warm pool's shape); before each
 *   create the benchmark waits until the node reports a ready warm slot, so every create is a claim.
 * - `create-cold-<n>x`: 640 MiB, a shape the warm pool does not hold, so every create boots an
 *   instance (network namespace, overlay, runsc, guest daemon).
 *   Each create is timed from the POST to (a) `ready` — the create operation succeeded (long-poll)
 *   — and (b) first output — the first stdout event of `echo ready` over the data plane.
 * - `exec-roundtrip-<n>x`: one running sandbox; time from POST /commands for `true` to its exit
 *   event on the SSE stream.
 * Prints min / p50 / p90 / max in ms per figure and writes JSON (commit, Node version, CPU model,
 * target, raw samples) to `benchmarks/results/`.
 */
import { execFileSync } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import { cpus } from 'node:os';
import { Command } from 'commander';
import { resolveEndpoint } from '../runtime/cli/local.ts';
import { benchClient } from './api.ts';

interface Opts {
  n: string;
  execN: string;
  scenarios: string;
  target?: string;
  apiKey?: string;
  out?: string;
}

const program = new Command('create-latency')
  .description('Sandbox creation latency (warm pool and cold) and exec round trip against a running SPACE')
  .option('--n <count>', 'creates per create scenario', '10')
  .option('--exec-n <count>', 'commands in the exec scenario', '30')
  .option(
    '--scenarios <list>',
    'comma list of create-warm, create-cold, exec-roundtrip',
    'create-warm,create-cold,exec-roundtrip',
  )
  .option('--target <url>', 'API URL (default: the local stack)')
  .option('--api-key <key>', 'API key (default: the local stack’s)')
  .option('--out <file>', 'JSON results file (default: benchmarks/results/create-latency-<time>.json)')
  .parse();
const opts = program.opts<Opts>();
const ep = resolveEndpoint({ apiUrl: opts.target, apiKey: opts.apiKey });

const { api, waitOp, streamTimes: stream } = benchClient(ep);

async function warmSlots(): Promise<number> {
  const { nodes } = await api<{ nodes: { alive: boolean; warm: Record<string, number> }[] }>(
    'GET',
    '/v1/nodes',
  );
  return nodes.filter((n) => n.alive).reduce((a, n) => a + (n.warm.base ?? 0), 0);
}

async function createOnce(body: Record<string, unknown>) {
  const t0 = performance.now();
  const { sandbox, operation } = await api<{ sandbox: { id: string }; operation: { id: string } }>(
    'POST',
    '/v1/sandboxes',
    { template: 'base', timeoutSec: 300, ...body },
  );
  await waitOp(operation.id);
  const ready = performance.now() - t0;
  const cmd = await api<{ stream: { url: string; token: string } }>(
    'POST',
    `/v1/sandboxes/${sandbox.id}/commands`,
    {
      cmd: 'echo',
      args: ['ready'],
    },
  );
  const { first } = await stream(cmd.stream.url, cmd.stream.token, t0);
  const rec = await api<{ fromWarmPool: boolean }>('GET', `/v1/sandboxes/${sandbox.id}`);
  await api('DELETE', `/v1/sandboxes/${sandbox.id}`);
  return { ready, first, fromWarmPool: rec.fromWarmPool };
}

const pct = (xs: number[], p: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))]!;
};
const fmt = (xs: number[]) =>
  `min ${pct(xs, 0).toFixed(0)}  p50 ${pct(xs, 50).toFixed(0)}  p90 ${pct(xs, 90).toFixed(0)}  max ${Math.max(...xs).toFixed(0)} ms`;

const results: Record<string, Record<string, number[]>> = {};
const n = Number(opts.n);
const scenarios = opts.scenarios.split(',');
const commit = (() => {
  try {
    return execFileSync('git', ['rev-parse', '--short', 'HEAD'], { encoding: 'utf8' }).trim();
  } catch {
    return 'unknown';
  }
})();
const host = {
  commit,
  node: process.version,
  cpu: cpus()[0]?.model ?? 'unknown',
  cpus: cpus().length,
  target: ep.apiUrl,
};
console.log(
  `measuring against ${ep.apiUrl} — commit ${commit}, Node ${process.version}, ${host.cpus}× ${host.cpu}`,
);

if (scenarios.includes('create-warm')) {
  const ready: number[] = [];
  const first: number[] = [];
  let claimed = 0;
  for (let i = 0; i < n; i++) {
    for (let w = 0; w < 300 && (await warmSlots()) < 1; w++) await new Promise((r) => setTimeout(r, 200));
    const r = await createOnce({});
    ready.push(r.ready);
    first.push(r.first);
    if (r.fromWarmPool) claimed++;
  }
  results[`create-warm-${n}x`] = { ready, firstOutput: first };
  console.log(
    `create-warm-${n}x (${claimed}/${n} claimed a warm slot)\n  ready         ${fmt(ready)}\n  first output  ${fmt(first)}`,
  );
}
if (scenarios.includes('create-cold')) {
  const ready: number[] = [];
  const first: number[] = [];
  for (let i = 0; i < n; i++) {
    const r = await createOnce({ memoryMiB: 640 });
    ready.push(r.ready);
    first.push(r.first);
  }
  results[`create-cold-${n}x`] = { ready, firstOutput: first };
  console.log(`create-cold-${n}x\n  ready         ${fmt(ready)}\n  first output  ${fmt(first)}`);
}
if (scenarios.includes('exec-roundtrip')) {
  const m = Number(opts.execN);
  const { sandbox, operation } = await api<{ sandbox: { id: string }; operation: { id: string } }>(
    'POST',
    '/v1/sandboxes',
    {
      template: 'base',
    },
  );
  await waitOp(operation.id);
  const rt: number[] = [];
  for (let i = 0; i < m; i++) {
    const t0 = performance.now();
    const cmd = await api<{ stream: { url: string; token: string } }>(
      'POST',
      `/v1/sandboxes/${sandbox.id}/commands`,
      {
        cmd: 'true',
      },
    );
    rt.push((await stream(cmd.stream.url, cmd.stream.token, t0)).exit);
  }
  await api('DELETE', `/v1/sandboxes/${sandbox.id}`);
  results[`exec-roundtrip-${m}x`] = { roundTrip: rt };
  console.log(`exec-roundtrip-${m}x\n  POST → exit event  ${fmt(rt)}`);
}

const out =
  opts.out ?? `benchmarks/results/create-latency-${new Date().toISOString().replace(/[:.]/g, '-')}.json`;
mkdirSync('benchmarks/results', { recursive: true });
writeFileSync(out, JSON.stringify({ host, at: new Date().toISOString(), results }, null, 2));
console.log(`wrote ${out}`);
