/**
 * Create → first `runCode('1+1')` result of the `code-interpreter-v1` template on warm claims, as
 * the published `@e2b/code-interpreter` SDK sees it. A script, not a timed test: it prints the
 * figures (ms, p50/p90/p99/max over `--n` samples, sequential, each one a warm claim: it waits for
 * the pool to hold a slot before each create) and asserts nothing about them.
 *
 * Against a running local stack whose warm template is the code interpreter, with the SDK pointed
 * at it as a migrating user points it (only `E2B_*` variables; port 49999 through the router):
 * ```
 * npx space template build code-interpreter-v1      # once: ~3 min, 1.7 GB
 * SPACE_WARM_TEMPLATES=code-interpreter-v1 npx space up --warm 1
 * eval "$(npx space e2b env)"
 * npx node benchmarks/code-interpreter.ts --n 20
 * ```
 * Figures: `create` (the SDK's `Sandbox.create()` through SPACE's E2B API), `run` (`runCode('1+1')`
 * to its result, through the router) and `total` (create → result).
 */
import { parseArgs } from 'node:util';
import { Sandbox } from '@e2b/code-interpreter';
import { readLocalState, resolveEndpoint, spaceHome } from '../runtime/cli/local.ts';
import { benchClient } from './api.ts';
import { fmt, summarise } from './stats.ts';

const TEMPLATE = 'code-interpreter-v1';

/** One sample's phases, ms. */
export interface CodeInterpreterSample {
  create: number;
  run: number;
  total: number;
}

async function main(): Promise<void> {
  const { values } = parseArgs({ options: { n: { type: 'string', default: '20' } } });
  const n = Number(values.n);
  if (!Number.isInteger(n) || n < 1) throw new Error(`--n must be a positive integer, got ${values.n}`);
  const home = spaceHome();
  if (!readLocalState(home)) throw new Error(`no running local stack in ${home} (start one with space up)`);
  if (!process.env.E2B_API_URL || !process.env.E2B_SANDBOX_URL)
    throw new Error('point the SDK at the stack first: eval "$(npx space e2b env)"');
  const ep = resolveEndpoint({});
  const client = benchClient(ep);
  const warm = async () =>
    (
      await client.api<{ nodes: { alive: boolean; warm: Record<string, number> }[] }>('GET', '/v1/nodes')
    ).nodes
      .filter((x) => x.alive)
      .reduce((a, x) => a + (x.warm[TEMPLATE] ?? 0), 0);
  const samples: CodeInterpreterSample[] = [];
  for (let i = 0; i < n; i++) {
    const waitUntil = Date.now() + 300_000;
    while ((await warm()) < 1) {
      if (Date.now() > waitUntil)
        throw new Error(`no warm ${TEMPLATE} slot within 5 min (is it a warm template?)`);
      await new Promise((r) => setTimeout(r, 250));
    }
    const t0 = performance.now();
    const sbx = await Sandbox.create();
    const t1 = performance.now();
    const out = await sbx.runCode('1+1');
    const t2 = performance.now();
    if (out.text !== '2')
      throw new Error(`runCode('1+1') answered ${JSON.stringify(out.text)}: ${out.error?.value}`);
    samples.push({ create: t1 - t0, run: t2 - t1, total: t2 - t0 });
    await sbx.kill();
    process.stderr.write(`sample ${i + 1}/${n}: ${fmt(t2 - t0)} ms\n`);
  }
  console.log(`create → first runCode('1+1') result, ${TEMPLATE}, warm claims, n=${n} (ms)`);
  console.log('| figure | p50 | p90 | p99 | max |');
  console.log('|---|---|---|---|---|');
  for (const k of ['create', 'run', 'total'] as const) {
    const s = summarise(samples.map((x) => x[k]));
    console.log(`| ${k} | ${fmt(s.p50)} | ${fmt(s.p90)} | ${fmt(s.p99)} | ${fmt(s.max)} |`);
  }
}

main().catch((err: unknown) => {
  console.error(`code-interpreter bench: ${(err as Error).message}`);
  process.exit(1);
});
