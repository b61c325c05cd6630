/**
 * The code-interpreter-v1 template end to end with the published `@e2b/code-interpreter` SDK
 * (templates/code-interpreter/server.py over Debian's Jupyter kernels, in a real gVisor sandbox):
 * state across calls, an exception's traceback, a matplotlib chart as PNG, a DataFrame as HTML,
 * JSON, a 30 s execution's stdout streamed as printed, per-call env vars, an execution timeout
 * that interrupts the kernel, two contexts kept apart, a context restart and removal, and pause +
 * resume between two calls with the kernel's state intact.
 *
 * The SDK runs as a migrating user runs it: `Sandbox.create()` with only `E2B_API_URL`,
 * `E2B_API_KEY`, `E2B_SANDBOX_URL` (and `E2B_DOMAIN`) set (template `code-interpreter-v1`, the SDK's default,
 * claimed from a warm slot); its Jupyter calls reach port 49999 through the router (the
 * `E2b-Sandbox-Port` header of that mode).
 *
 * Needs the template built: `space template build code-interpreter-v1` (~3 min, 1.7 GB); the
 * suite builds it when it is missing.
 */

import { Sandbox, TimeoutError } from '@e2b/code-interpreter';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildTemplate } from '../runtime/agent/image/templates.ts';
import { type E2bStack, startE2bStack } from './e2b-stack.ts';
import { leftovers, NO_LEFTOVERS, type Stack, TEST_CACHE_DIR, waitFor } from './stack.ts';

const TEMPLATE = 'code-interpreter-v1';
let s: Stack;

let e2b: E2bStack;

beforeAll(async () => {
  await buildTemplate(TEMPLATE, { cacheDir: TEST_CACHE_DIR });
  e2b = await startE2bStack({ SPACE_WARM_TEMPLATES: TEMPLATE, SPACE_WARM_POOL_SIZE: '1' });
  s = e2b.s;
  await waitFor(
    'a warm code interpreter',
    async () => (s.agent.warm.counts()[TEMPLATE] === 1 ? true : undefined),
    300_000,
  );
}, 900_000);
afterAll(async () => {
  await e2b?.stopRouter();
  if (!s) return;
  await s.stop();
  expect(await leftovers(s)).toEqual(NO_LEFTOVERS);
});

describe('@e2b/code-interpreter against the code-interpreter-v1 template', () => {
  let sbx: Sandbox;
  beforeAll(async () => {
    sbx = await Sandbox.create();
    expect(
      (await s.call<{ createdFrom: string }>('GET', `/v1/sandboxes/${sbx.sandboxId}`)).body.createdFrom,
    ).toBe('warm');
  }, 120_000);

  it('keeps state across calls; a code error is the execution error with its traceback', async () => {
    const first = await sbx.runCode('x = 41\nprint("set")');
    expect(first.logs.stdout).toEqual(['set\n']);
    expect(first.error).toBeUndefined();
    const second = await sbx.runCode('x + 1');
    expect(second.text).toBe('42');
    expect(second.executionCount).toBe((first.executionCount ?? 0) + 1);
    const failed = await sbx.runCode('def f():\n    return 1 / 0\nf()');
    expect(failed.error?.name).toBe('ZeroDivisionError');
    expect(failed.error?.value).toBe('division by zero');
    expect(failed.error?.traceback).toContain('return 1 / 0');
    expect(failed.error?.traceback).not.toContain('\u001b['); // no terminal colours
    const unknown = await sbx.runCode('undefined_name');
    expect(unknown.error?.name).toBe('NameError');
  }, 120_000);

  it('rich results: a matplotlib chart as PNG, a DataFrame as HTML, JSON, stderr', async () => {
    const chart = await sbx.runCode(
      'import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [3, 1, 2])\nplt.title("t")\nplt.show()',
    );
    const png = chart.results.find((r) => r.png)?.png;
    expect(png).toBeDefined();
    expect(Buffer.from(png!, 'base64').subarray(0, 8)).toEqual(
      Buffer.from([137, 80, 78, 71, 13, 10, 26, 10]),
    );
    const table = await sbx.runCode('import pandas as pd\npd.DataFrame({"a": [1, 2], "b": ["x", "y"]})');
    expect(table.results[0]?.isMainResult).toBe(true);
    expect(table.results[0]?.html).toContain('<table');
    expect(table.results[0]?.html).toContain('<td>x</td>');
    expect(table.text).toContain('a  b');
    const json = await sbx.runCode('from IPython.display import JSON, display\ndisplay(JSON({"k": [1, 2]}))');
    expect(json.results[0]?.json).toEqual({ k: [1, 2] });
    const err = await sbx.runCode('import sys\nprint("warn", file=sys.stderr)');
    expect(err.logs.stderr).toEqual(['warn\n']);
  }, 120_000);

  it('a 30 s execution streams its stdout as it prints, not at the end', async () => {
    const arrived: { line: string; at: number }[] = [];
    const t0 = Date.now();
    const run = await sbx.runCode(
      'import time\nfor i in range(30):\n    print(i, flush=True)\n    time.sleep(1)',
      {
        onStdout: (m) => {
          arrived.push({ line: m.line, at: Date.now() - t0 });
        },
        timeoutMs: 120_000,
      },
    );
    const done = Date.now() - t0;
    const want = Array.from({ length: 30 }, (_, i) => `${i}\n`).join('');
    expect(run.logs.stdout.join('')).toBe(want);
    expect(arrived.map((a) => a.line).join('')).toBe(want);
    // each line came while the code still ran: the first ~29 s before the end, the middle one
    // ~14 s before (bounds far from those, as a loaded host delays both ends alike)
    expect(done - arrived[0]!.at).toBeGreaterThan(20_000);
    expect(done - arrived.find((a) => a.line === '15\n')!.at).toBeGreaterThan(7_000);
  }, 180_000);

  it('per-call env vars are set for that call only', async () => {
    const code = 'import os\nos.environ.get("SPACE_CI_VAR", "unset")';
    expect((await sbx.runCode(code, { envs: { SPACE_CI_VAR: 'on' } })).text).toBe('on');
    expect((await sbx.runCode(code)).text).toBe('unset');
  }, 60_000);

  it('an execution timeout interrupts the kernel: the next call runs, state kept', async () => {
    await sbx.runCode('kept = "yes"');
    await expect(sbx.runCode('import time\ntime.sleep(300)', { timeoutMs: 3_000 })).rejects.toBeInstanceOf(
      TimeoutError,
    );
    const next = await sbx.runCode('kept', { timeoutMs: 30_000 });
    expect(next.text).toBe('yes');
  }, 60_000);

  it('contexts: kept apart, listed, restarted (state gone), removed', async () => {
    const ctx = await sbx.createCodeContext({ cwd: '/tmp' });
    expect(ctx).toMatchObject({ language: 'python', cwd: '/tmp' });
    await sbx.runCode('only_here = 1', { context: ctx });
    expect((await sbx.runCode('only_here', { context: ctx })).text).toBe('1');
    expect((await sbx.runCode('only_here')).error?.name).toBe('NameError');
    expect((await sbx.runCode('import os\nos.getcwd()', { context: ctx })).text).toBe('/tmp');
    expect((await sbx.listCodeContexts()).map((c) => c.id)).toContain(ctx.id);
    await sbx.restartCodeContext(ctx);
    expect((await sbx.runCode('only_here', { context: ctx })).error?.name).toBe('NameError');
    expect((await sbx.runCode('x')).text).toBe('41'); // the default context was not restarted
    await sbx.removeCodeContext(ctx.id);
    expect((await sbx.listCodeContexts()).map((c) => c.id)).not.toContain(ctx.id);
    await expect(sbx.runCode('1', { context: ctx })).rejects.toThrow(/not found/);
  }, 120_000);

  it('pause and resume between two calls keep the kernel and its state', async () => {
    await sbx.runCode('survivor = [1, 2, 3]');
    expect(await sbx.pause()).toBe(true);
    const again = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 120_000 });
    expect((await again.runCode('sum(survivor)')).text).toBe('6');
  }, 180_000);
});
