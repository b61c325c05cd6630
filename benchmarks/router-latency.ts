#!/usr/bin/env node
/**
 * What the router adds to a data-plane request, against a running local stack (`npm start`; reads
 * the router's and the agent's URLs from `$SPACE_HOME/local.json`), measured in the same run.
 *
 *   npm run bench:router -- [--n 200] [--out FILE]
 *
 * Needs: a `space up` stack with its router (not `--no-router`); loopback only.
 * Scenarios, each request sent alternately to the router and straight to the agent (same token,
 * same path), one at a time over kept-alive connections:
 * - `status-<n>x`: GET a finished command's status (small JSON): the per-request overhead
 *   (token check, two Redis reads, one extra hop);
 * - `events-<n>x`: read a finished command's whole SSE stream (1000 lines) to its exit event;
 * - `download-16MiB-<n/10>x`: GET a 16 MiB file.
 * Prints p50/p90 per path and the router/agent ratio of the medians; writes JSON (commit, Node
 * version, CPU model, raw samples) to `benchmarks/results/`.
 */
import { execFileSync } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import { cpus } from 'node:os';
import { Command } from 'commander';
import { Agent, request } from 'undici';
import { readLocalState, resolveEndpoint, spaceHome } from '../runtime/cli/local.ts';
import { benchClient } from './api.ts';

const program = new Command('router-latency')
  .description('Latency the router adds to data-plane requests, against the local stack')
  .option('--n <count>', 'requests per scenario and path', '200')
  .option('--out <file>', 'JSON results file (default: benchmarks/results/router-latency-<time>.json)')
  .parse();
const opts = program.opts<{ n: string; out?: string }>();
const n = Math.max(1, Math.min(10_000, Number(opts.n)));
const local = readLocalState(spaceHome());
if (!local?.routerUrl || !local.agentUrl) {
  console.error('no router in local.json: start the stack with `npm start` (without --no-router)');
  process.exit(1);
}
const ep = resolveEndpoint({});
const dispatcher = new Agent({ keepAliveTimeout: 30_000 });

const { api, waitOp } = benchClient(ep);

/** ms of one GET of `path` on `base` (body read to its end). */
async function timeGet(base: string, path: string, token: string): Promise<number> {
  const t0 = performance.now();
  const res = await request(`${base}${path}`, { dispatcher, headers: { authorization: `Bearer ${token}` } });
  await res.body.dump({ limit: Number.MAX_SAFE_INTEGER });
  if (res.statusCode !== 200) throw new Error(`GET ${base}${path}: ${res.statusCode}`);
  return performance.now() - t0;
}

const pct = (xs: number[], p: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))] ?? Number.NaN;
};

async function main(): Promise<void> {
  const created = await api<{ sandbox: { id: string }; operation: { id: string } }>('POST', '/v1/sandboxes', {
    template: 'base',
  });
  const id = created.sandbox.id;
  try {
    await waitOp(created.operation.id);
    const cmd = await api<{ command: { id: string }; stream: { token: string } }>(
      'POST',
      `/v1/sandboxes/${id}/commands`,
      { cmd: 'sh', args: ['-c', 'seq 1 1000; head -c 16M /dev/urandom > /home/user/16m.bin'] },
    );
    const files = await api<{ token: string }>('POST', `/v1/sandboxes/${id}/tokens`, { scopes: ['files'] });
    const status = `/v1/sandboxes/${id}/commands/${cmd.command.id}`;
    for (let i = 0; i < 600; i++) {
      const r = await request(`${local!.routerUrl}${status}`, {
        headers: { authorization: `Bearer ${cmd.stream.token}` },
      });
      if (!((await r.body.json()) as { running: boolean }).running) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    const scenarios = [
      { name: `status-${n}x`, path: status, token: cmd.stream.token, count: n },
      { name: `events-${n}x`, path: `${status}/events`, token: cmd.stream.token, count: n },
      {
        name: `download-16MiB-${Math.ceil(n / 10)}x`,
        path: `/v1/sandboxes/${id}/files?path=/home/user/16m.bin`,
        token: files.token,
        count: Math.ceil(n / 10),
      },
    ];
    const results: Record<string, { router: number[]; agent: number[] }> = {};
    for (const sc of scenarios) {
      const r: number[] = [];
      const a: number[] = [];
      // warm both paths' connections first
      await timeGet(local!.routerUrl!, sc.path, sc.token);
      await timeGet(local!.agentUrl!, sc.path, sc.token);
      for (let i = 0; i < sc.count; i++) {
        r.push(await timeGet(local!.routerUrl!, sc.path, sc.token));
        a.push(await timeGet(local!.agentUrl!, sc.path, sc.token));
      }
      results[sc.name] = { router: r, agent: a };
      const f = (xs: number[]) => `p50 ${pct(xs, 50).toFixed(2)} ms  p90 ${pct(xs, 90).toFixed(2)} ms`;
      console.log(
        `${sc.name.padEnd(22)} router ${f(r)} | agent ${f(a)} | router/agent p50 ${(pct(r, 50) / pct(a, 50)).toFixed(2)}`,
      );
    }
    const commit = (() => {
      try {
        return execFileSync('git', ['rev-parse', 'HEAD'], { encoding: 'utf8' }).trim();
      } catch {
        return 'unknown';
      }
    })();
    const out =
      opts.out ??
      new URL(
        `./results/router-latency-${new Date().toISOString().replace(/[:.]/g, '-')}.json`,
        import.meta.url,
      ).pathname;
    mkdirSync(new URL('./results/', import.meta.url).pathname, { recursive: true });
    writeFileSync(
      out,
      JSON.stringify(
        { commit, node: process.version, cpu: cpus()[0]?.model, cpus: cpus().length, n, results },
        null,
        2,
      ),
    );
    console.log(`wrote ${out}`);
  } finally {
    await api('DELETE', `/v1/sandboxes/${id}`).catch(() => {});
    await dispatcher.close();
  }
}

await main();
