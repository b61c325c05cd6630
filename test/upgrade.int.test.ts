/**
 * The upgrade rehearsal (issue 12, part 6): a local stack at the previous release is upgraded in
 * place to this working tree, one service at a time, as a deployment rolls (gateway, agent with
 * re-adoption, router, API), while sandboxes stream commands. Then one release of skew each way:
 * an N-1 agent under an N API, and an N agent under an N-1 API. Every part is a real process
 * (test/fault-stack.ts) started from the source tree of its release.
 *
 * The previous release is {@link PREVIOUS}: the last commit before pause/resume and the router
 * (agent protocol 2; no pause routes, no usage or auto-pause keys in Redis). Its tree is extracted
 * with `git archive` (no worktree is registered) into a folder kept between runs, with this
 * repository's node_modules (the runtime's dependencies did not change in between).
 */
import { execFileSync, spawn } from 'node:child_process';
import { once } from 'node:events';
import { existsSync, mkdirSync, realpathSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { pathToFileURL } from 'node:url';
import { createParser } from 'eventsource-parser';
import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TEST_CACHE_DIR } from './cache-dir.ts';
import { converged, type FaultStack, startFaultStack } from './fault-stack.ts';
import { NO_LEFTOVERS, waitFor } from './stack.ts';

/** The release upgraded from: `a24893a`, the last commit before pause/resume and the router. */
const PREVIOUS = 'a24893a';
const repo = new URL('..', import.meta.url).pathname;

/** The tree of {@link PREVIOUS}, extracted once per commit. */
function previousTree(): string {
  const dir = join(tmpdir(), `space-release-${PREVIOUS}`);
  if (!existsSync(join(dir, '.extracted'))) {
    mkdirSync(dir, { recursive: true });
    try {
      execFileSync('git', ['-C', repo, 'cat-file', '-e', `${PREVIOUS}^{commit}`]);
    } catch {
      throw new Error(`the rehearsal needs commit ${PREVIOUS} in this clone (git fetch --unshallow)`);
    }
    execFileSync('sh', ['-c', `git -C "${repo}" archive ${PREVIOUS} | tar -x -C "${dir}"`]);
    writeFileSync(join(dir, '.extracted'), PREVIOUS);
  }
  // this clone's packages, also when the tree was extracted by a clone since removed (its link
  // then dangles and the old release's services cannot start)
  const link = join(dir, 'node_modules');
  const ours = realpathSync(join(repo, 'node_modules'));
  if (!existsSync(link) || realpathSync(link) !== ours) {
    rmSync(link, { force: true });
    symlinkSync(ours, link);
  }
  return dir;
}

type Event = { event: string; id: string; data: string };

/**
 * Follows a command's stream to its exit event across restarts of whatever serves it: on a drop it
 * reconnects with Last-Event-ID (bounded by `deadline`), keeping every event it got.
 */
async function follow(
  url: string,
  token: string,
  deadline: number,
): Promise<Event[] & { reconnects: number }> {
  const events: Event[] = [];
  let reconnects = 0;
  while (Date.now() < deadline) {
    const last = events.at(-1)?.id;
    try {
      const res = await request(url, {
        headers: { authorization: `Bearer ${token}`, ...(last ? { 'last-event-id': last } : {}) },
        headersTimeout: 10_000,
        bodyTimeout: 30_000,
      });
      if (res.statusCode !== 200) {
        await res.body.dump();
        throw new Error(`HTTP ${res.statusCode}`);
      }
      const parser = createParser({
        onEvent: (e) => events.push({ event: e.event ?? 'message', id: e.id ?? '', data: e.data }),
      });
      const decoder = new TextDecoder();
      for await (const chunk of res.body) parser.feed(decoder.decode(chunk as Buffer, { stream: true }));
    } catch {
      // the agent (or router) restarted under the stream: reconnect where it left off
    }
    if (events.some((e) => e.event === 'exit')) return Object.assign(events, { reconnects });
    reconnects++;
    await sleep(300);
  }
  throw new Error(`stream did not end by the deadline (${events.length} events)`);
}

/** The stdout of a stream's events and its exit code. */
function output(events: Event[]): { stdout: string; exitCode: number | null; ids: number[] } {
  let stdout = '';
  let exitCode: number | null = null;
  for (const e of events) {
    if (e.event === 'stdout')
      stdout += Buffer.from((JSON.parse(e.data) as { data: string }).data, 'base64').toString();
    if (e.event === 'exit') exitCode = (JSON.parse(e.data) as { exitCode: number | null }).exitCode;
  }
  return { stdout, exitCode, ids: events.map((e) => Number(e.id)).filter((n) => !Number.isNaN(n)) };
}

const LINES = 240;
/** A command that prints numbered lines for ~LINES/10 s. */
const ticker = { cmd: 'sh', args: ['-c', `for i in $(seq 1 ${LINES}); do echo line $i; sleep 0.1; done`] };
const expected = Array.from({ length: LINES }, (_, i) => `line ${i + 1}\n`).join('');

let s: FaultStack;
let old: string;
const sandboxes: string[] = [];

async function exec(id: string, body: Record<string, unknown>) {
  const res = await s.call<{ stream: { url: string; token: string } }>(
    'POST',
    `/v1/sandboxes/${id}/commands`,
    body,
  );
  if (res.status !== 201) throw new Error(`exec: ${res.status} ${JSON.stringify(res.body)}`);
  return res.body.stream;
}

async function create(): Promise<string> {
  const res = await s.call<{ sandbox: { id: string } }>('POST', '/v1/sandboxes', { template: 'base' });
  if (res.status !== 202) throw new Error(`create: ${res.status} ${JSON.stringify(res.body)}`);
  const id = res.body.sandbox.id;
  await waitFor(
    `sandbox ${id} running`,
    async () =>
      (await s.call<{ state: string }>('GET', `/v1/sandboxes/${id}`)).body.state === 'running'
        ? true
        : undefined,
    120_000,
  );
  sandboxes.push(id);
  return id;
}

/** Every sandbox still runs a command to completion with the right output. */
async function allAnswer(): Promise<void> {
  for (const id of sandboxes) {
    const st = await exec(id, { cmd: 'echo', args: [`alive ${id}`] });
    const o = output(await follow(st.url, st.token, Date.now() + 30_000));
    expect(o.stdout, id).toBe(`alive ${id}\n`);
    expect(o.exitCode).toBe(0);
  }
}

/**
 * Builds `base` as the previous release defines it, in the shared cache: its definition differs
 * from today's (R14 added packages), so it has a cache entry of its own, which only a machine that
 * once ran that release had. A fresh CI machine had none, and the old agent served no template.
 * The build (minutes when nothing is cached) is awaited, never waited for synchronously: a blocked
 * event loop kept this test worker from vitest's RPC for over 60 s, and vitest failed the run
 * with "Timeout calling onTaskUpdate" although every test passed.
 * @throws Error when the build exits non-zero or outlasts 15 minutes.
 */
async function buildPreviousBase(tree: string): Promise<void> {
  const mod = pathToFileURL(join(tree, 'runtime/agent/templates.ts')).href;
  const script = `const m = await import(${JSON.stringify(mod)}); await m.buildTemplate('base', { cacheDir: ${JSON.stringify(TEST_CACHE_DIR)} });`;
  const build = spawn(process.execPath, ['--input-type=module', '-e', script], {
    stdio: 'inherit',
    timeout: 900_000,
  });
  const [code, signal] = (await once(build, 'exit')) as [number | null, NodeJS.Signals | null];
  if (code !== 0)
    throw new Error(`building the previous release's base failed (${signal ?? `exit ${code}`})`);
}

beforeAll(async () => {
  old = previousTree();
  await buildPreviousBase(old);
  s = await startFaultStack(
    // upgrades keep sandboxes: SIGTERM drains the agent and leaves them to be re-adopted
    { SPACE_AGENT_ON_SHUTDOWN: 'keep', SPACE_NODE_LOST_GRACE_MS: '120000' },
    { roots: { gateway: old, agent: old, api: old }, apiUsesRouter: true },
  );
}, 900_000);

afterAll(async () => {
  for (const id of sandboxes) await s?.call('DELETE', `/v1/sandboxes/${id}`).catch(() => {});
  if (s) {
    await waitFor(
      'sandboxes gone',
      async () => ((await s.inventory().catch(() => ['?'])).length === 0 ? true : undefined),
      60_000,
    ).catch(() => {});
    await s.stop();
    // nothing left on the host by either release (namespaces, runsc processes, cgroups)
    expect(s.left).toEqual(NO_LEFTOVERS);
  }
}, 180_000);

describe(`upgrade rehearsal: ${PREVIOUS} → working tree, in place`, () => {
  it('rolls gateway, agent (re-adoption), router, API one at a time while commands stream; nothing is lost', async () => {
    const a = await create();
    const b = await create();
    const deadline = Date.now() + 150_000;
    // streams that run through the whole roll
    const streams = await Promise.all([a, b].map((id) => exec(id, ticker)));
    const following = streams.map((st) => follow(st.url, st.token, deadline));

    // 1. gateway (a deployment rolls it first; the agent re-registers its sandboxes with it)
    await s.stopPart('gateway');
    s.setRoot('gateway', repo);
    await s.start('gateway');
    // 2. agent: SIGTERM keeps the sandboxes; the new agent re-adopts them
    await sleep(1000);
    await s.stopPart('agent');
    s.setRoot('agent', repo);
    await s.start('agent');
    expect(await converged(s)).toEqual([a, b].sort());
    // 3. router: new in this release; it serves the data plane for records the old API wrote
    await s.start('router');
    // 4. API, now handing out router URLs
    await s.stopPart('api');
    s.setRoot('api', repo);
    await s.start('api');

    const results = await Promise.all(following);
    // the roll really cut the streams (the agent serving them restarted), and they came back
    expect(Math.max(...results.map((r) => r.reconnects))).toBeGreaterThan(0);
    for (const r of results) {
      const o = output(r);
      expect(o.stdout).toBe(expected);
      expect(o.exitCode).toBe(0);
      // event ids only grow: nothing repeated across the reconnects
      expect(new Set(o.ids).size).toBe(o.ids.length);
    }
    expect(await converged(s)).toEqual([a, b].sort());
    // records the old API wrote read back through the new one
    for (const id of [a, b]) {
      const rec = await s.call<{ state: string; id: string }>('GET', `/v1/sandboxes/${id}`);
      expect(rec.status).toBe(200);
      expect(rec.body.state).toBe('running');
    }
    await allAnswer();
    // the new API hands out the router's URLs; the router carries the stream
    expect((await exec(a, { cmd: 'true' })).url.startsWith(`${s.routerUrl}/`)).toBe(true);
    // the VM upgrade channel: the target version VMs' space-version-sync timers read
    expect((await s.call('GET', '/v1/deployment/target-version')).body).toEqual({ version: null });
    expect((await s.call('PUT', '/v1/deployment/target-version', { version: '0.2.0' })).status).toBe(200);
    expect(await s.redis.get('space:deploy:target-version')).toBe('0.2.0');
    expect((await s.call('PUT', '/v1/deployment/target-version', { version: '0.2; reboot' })).status).toBe(
      400,
    );
    expect((await s.call('GET', '/v1/deployment/target-version')).body).toEqual({ version: '0.2.0' });
  }, 300_000);

  it('N-1 agent under an N API: commands work; a pause the old agent cannot do is refused cleanly and the sandbox keeps running', async () => {
    await s.stopPart('agent');
    s.setRoot('agent', old);
    await s.start('agent');
    await converged(s);
    await allAnswer();
    const id = sandboxes[0]!;
    const res = await s.call<{ operation: { id: string } }>('POST', `/v1/sandboxes/${id}/pause`, {});
    // an operation that fails with a clear reason; never a sandbox left broken
    expect(res.status).toBe(202);
    const op = await waitFor(
      'the pause to settle',
      async () => {
        const o = await s.call<{ state: string; error: { code: string; message: string } | null }>(
          'GET',
          `/v1/operations/${res.body.operation.id}`,
        );
        return ['succeeded', 'failed'].includes(o.body.state) ? o.body : undefined;
      },
      60_000,
    );
    expect(op.state, JSON.stringify(op)).toBe('failed');
    expect(op.error?.code).toBe('NODE_UNSUPPORTED');
    const rec = await s.call<{ state: string }>('GET', `/v1/sandboxes/${id}`);
    expect(rec.body.state).toBe('running');
    await allAnswer();
  }, 300_000);

  it('N agent under an N-1 API: creates, commands and kills work; nothing is lost', async () => {
    await s.stopPart('agent');
    s.setRoot('agent', repo);
    await s.start('agent');
    await s.stopPart('api');
    s.setRoot('api', old);
    await s.start('api');
    await converged(s);
    const c = await create();
    await allAnswer();
    const del = await s.call<{ operation: { id: string } }>('DELETE', `/v1/sandboxes/${c}`);
    expect(del.status).toBeLessThan(300);
    // the delete is an operation: node, records and reservations agree on `c` until it has run
    const done = await waitFor(
      'the delete to settle',
      async () => {
        const o = await s.call<{ state: string }>('GET', `/v1/operations/${del.body.operation.id}`);
        return ['succeeded', 'failed'].includes(o.body.state) ? o.body : undefined;
      },
      60_000,
    );
    expect(done.state, JSON.stringify(done)).toBe('succeeded');
    sandboxes.splice(sandboxes.indexOf(c), 1);
    expect(await converged(s)).toEqual([...sandboxes].sort());
    // back to N for the cleanup
    await s.stopPart('api');
    s.setRoot('api', repo);
    await s.start('api');
  }, 300_000);
});
