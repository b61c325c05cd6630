/**
 * Create → first `runCode('1+1')` result of the `code-interpreter-v1` template on warm claims, as
 * the published `@e2b/code-interpreter` SDK sees it. A script, not a timed test: it prints the
 * figures (ms, p50/p90/p99/max over `--n` samples, sequential, each one a warm claim: it waits for
 * the pool to hold a slot before each create) and asserts nothing about them.
 *
 * Against a running local stack whose warm template is the code interpreter:
 * ```
 * npx space template build code-interpreter-v1      # once: ~3 min, 1.7 GB
 * SPACE_WARM_TEMPLATES=code-interpreter-v1 npx space up --warm 1
 * npx node benchmarks/code-interpreter.ts --n 20
 * ```
 * Figures: `create` (the SDK's `Sandbox.create()` through SPACE's E2B API), `connect` (the direct
 * port hook below: reading the sandbox's address and `Sandbox.connect` with it; goes away once the
 * router exposes port 49999), `run` (`runCode('1+1')` to its result) and `total` (create → result).
 *
 * DIRECT_PORT_HOOK: port 49999 is reached at the sandbox's own address, read from the agent's
 * record (`$SPACE_HOME/agent/sandboxes/<id>/sandbox.json`, `instance.guest.host`), so this runs
 * on the stack's host as root. After issue 45 item 1 it is `Sandbox.create()` with E2B_* only.
 */
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { Sandbox } from '@e2b/code-interpreter';
import { readLocalState, resolveEndpoint, spaceHome } from '../runtime/cli/local.ts';
import { benchClient } from './api.ts';
import { fmt, summarise } from './stats.ts';

const TEMPLATE = 'code-interpreter-v1';

/** One sample's phases, ms. */
export interface CodeInterpreterSample {
  create: number;
  connect: number;
  run: number;
  total: number;
}

/** The sandbox's address as its node's agent recorded it (the direct port hook). */
async function sandboxAddress(agentStateDir: string, id: string): Promise<string> {
  const rec = JSON.parse(await readFile(join(agentStateDir, 'sandboxes', id, 'sandbox.json'), 'utf8')) as {
    instance: { guest: { host: string } };
  };
  return rec.instance.guest.host;
}

async function main(): Promise<void> {
  const { values } = parseArgs({ options: { n: { type: 'string', default: '20' } } });
  const n = Number(values.n);
  if (!Number.isInteger(n) || n < 1) throw new Error(`--n must be a positive integer, got ${values.n}`);
  const home = spaceHome();
  if (!readLocalState(home)) throw new Error(`no running local stack in ${home} (start one with space up)`);
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
    const made = await Sandbox.create({
      apiUrl: ep.apiUrl,
      apiKey: ep.apiKey,
      sandboxUrl: 'http://127.0.0.1:9',
    });
    const t1 = performance.now();
    const host = await sandboxAddress(join(home, 'agent'), made.sandboxId);
    const sbx = await Sandbox.connect(made.sandboxId, {
      apiUrl: ep.apiUrl,
      apiKey: ep.apiKey,
      sandboxUrl: `http://${host}:49999`,
    });
    const t2 = performance.now();
    const out = await sbx.runCode('1+1');
    const t3 = performance.now();
    if (out.text !== '2')
      throw new Error(`runCode('1+1') answered ${JSON.stringify(out.text)}: ${out.error?.value}`);
    samples.push({ create: t1 - t0, connect: t2 - t1, run: t3 - t2, total: t3 - t0 });
    await made.kill();
    process.stderr.write(`sample ${i + 1}/${n}: ${fmt(t3 - t0)} ms\n`);
  }
  console.log(`create → first runCode('1+1') result, ${TEMPLATE}, warm claims, n=${n} (ms)`);
  console.log('| figure | p50 | p90 | p99 | max |');
  console.log('|---|---|---|---|---|');
  for (const k of ['create', 'connect', 'run', 'total'] as const) {
    const s = summarise(samples.map((x) => x[k]));
    console.log(`| ${k} | ${fmt(s.p50)} | ${fmt(s.p90)} | ${fmt(s.p99)} | ${fmt(s.max)} |`);
  }
}

main().catch((err: unknown) => {
  console.error(`code-interpreter bench: ${(err as Error).message}`);
  process.exit(1);
});
