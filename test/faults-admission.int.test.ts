/**
 * Fault cases F8 and F10 (`npm run test:faults`), on a real stack of processes (test/fault-stack.ts)
 * whose node holds at most {@link MAX_SANDBOXES} sandboxes:
 * - f8: a create accepted just before Redis is killed (-9) and kept away past the node alive key's
 *   TTL ends with its sandbox running, not NODE_UNAVAILABLE and destroyed; no node_lost;
 * - f10: a burst larger than the node's room is answered at POST: each create is admitted (202)
 *   and then succeeds, or refused at once with 503 NODE_CAPACITY_EXHAUSTED and `Retry-After`; with
 *   a bounded wait for room (`roomWaitMs`), a create is admitted once room frees, or refused when
 *   the bound passes.
 */
import { request } from 'undici';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { keys, NODE_ALIVE_TTL_MS } from '../runtime/core/redis-keys.ts';
import {
  converged,
  type FaultStack,
  nodeAlive,
  finished as operationEnd,
  report,
  restartParts,
  runCommand,
  sandboxRecord,
  startFaultStack,
  stopFaultStack,
} from './fault-stack.ts';
import { waitFor } from './stack.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
/** The node's `SPACE_MAX_SANDBOXES` in this file: small, so a burst outgrows it quickly. */
const MAX_SANDBOXES = 4;
/** Node-lost grace of this stack's API (the default is 2 min): shorter than the F8 outage. */
const GRACE_MS = 20_000;

/** A create's answer: the records when admitted, the error envelope when refused. */
type Answer = {
  sandbox: { id: string };
  operation: { id: string };
  error: { code: string; message: string; details?: Record<string, unknown> };
};

describe('faults: admission', { timeout: 240_000 }, () => {
  let s: FaultStack;

  /** POST /v1/sandboxes with the query `query`; status, body and Retry-After (s, or null). */
  async function post(query = ''): Promise<{ status: number; body: Answer; retryAfter: number | null }> {
    const res = await request(new URL(`/v1/sandboxes${query}`, s.apiUrl), {
      method: 'POST',
      headers: { authorization: `Bearer ${s.apiKey}`, 'content-type': 'application/json' },
      body: JSON.stringify({ template: 'base', vcpus: 0.25, memoryMiB: 128 }),
      headersTimeout: 120_000,
      bodyTimeout: 120_000,
    });
    const text = await res.body.text();
    const ra = res.headers['retry-after'];
    return {
      status: res.statusCode,
      body: (text ? JSON.parse(text) : {}) as Answer,
      retryAfter: typeof ra === 'string' ? Number(ra) : null,
    };
  }

  // Redis or the API may be down for a restart: a failed poll is tried again
  const finished = (opId: string) => operationEnd(s, opId, { tolerant: true });

  async function remove(id: string): Promise<void> {
    const res = await s.call<{ operation: { id: string } }>('DELETE', `/v1/sandboxes/${id}`);
    expect(res.status).toBe(202);
    expect((await finished(res.body.operation.id)).state).toBe('succeeded');
  }

  /** Runs `echo f8-ok` in the sandbox; resolves with its stdout. */
  async function exec(id: string): Promise<string> {
    const r = await runCommand(s, id, 'echo', ['f8-ok']);
    expect(r.status).toBe(201);
    expect(r.exitCode).toBe(0);
    return r.stdout;
  }

  beforeAll(async () => {
    s = await startFaultStack({
      SPACE_MAX_SANDBOXES: String(MAX_SANDBOXES),
      SPACE_NODE_LOST_GRACE_MS: String(GRACE_MS),
    });
  });
  afterEach(() => restartParts(s));
  afterAll(() => stopFaultStack(s));

  it('f8-redis-outage-keeps-create: a create accepted just before a Redis outage past the alive TTL ends running', async () => {
    await nodeAlive(s);
    const accepted = await post();
    expect(accepted.status).toBe(202);
    const id = accepted.body.sandbox.id;
    const opId = accepted.body.operation.id;
    // the worker has taken the create (it is on its way to the node) before Redis goes
    await waitFor(
      'the create to run',
      async () => ((await s.redis.hget(keys.operation(opId), 'state')) === 'running' ? true : undefined),
      10_000,
    );
    await s.kill('redis');
    const t0 = Date.now();
    // past the node's alive key's TTL (and the node-lost grace): the key has expired when Redis
    // comes back on its data, through no fault of the node
    const outageMs = Math.max(NODE_ALIVE_TTL_MS, GRACE_MS) + 2_000;
    await sleep(outageMs);
    // the node's first heartbeat after an outage comes up to its interval late (5 s by default,
    // this stack's 1 s, plus its reconnect): hold the agent a few seconds so the API's worker, which
    // runs the interrupted create again as soon as Redis answers, sees the node before it heartbeats
    s.signal('agent', 'SIGSTOP');
    await s.start('redis');
    const back = Date.now();
    await sleep(4_000);
    s.signal('agent', 'SIGCONT');
    const op = await finished(opId);
    const rec = await sandboxRecord(s, id);
    report('F8', {
      outageMs: back - t0,
      op: op.state,
      code: op.error?.code ?? null,
      endedAfterRedisBackMs: Date.now() - back,
      record: rec.state,
      killReason: rec.killReason,
    });
    expect(op.error).toBeNull();
    expect(op.state).toBe('succeeded');
    expect(rec).toMatchObject({ state: 'running', killReason: null });
    expect(await exec(id)).toContain('f8-ok');
    expect(await s.redis.hget(keys.node(s.nodeId), 'lostAt')).toBeNull();
    expect(await converged(s)).toEqual([id]);
    await remove(id);
    expect(await converged(s)).toEqual([]);
  });

  it('f10-burst-refused-at-post: a burst past the node’s room is refused at POST, or waits a bound the client chose', async () => {
    await nodeAlive(s);
    const burst = 20;
    const concurrency = 10;
    const answers: Awaited<ReturnType<typeof post>>[] = [];
    let next = 0;
    await Promise.all(
      Array.from({ length: concurrency }, async () => {
        while (next < burst) {
          next++;
          answers.push(await post());
        }
      }),
    );
    const admitted = answers.filter((a) => a.status === 202);
    const refused = answers.filter((a) => a.status !== 202);
    const ends = await Promise.all(admitted.map((a) => finished(a.body.operation.id)));
    const failedCodes = ends.filter((o) => o.state === 'failed').map((o) => o.error?.code);
    report('F10', {
      burst,
      concurrency,
      admitted: admitted.length,
      refused: refused.map((r) => `${r.status} ${r.body.error?.code} retry-after=${r.retryAfter}`),
      failedAfter202: failedCodes,
    });
    // every 202 ends running; every refusal is the retryable capacity answer, given at POST
    expect(failedCodes).toEqual([]);
    expect(admitted.length).toBeGreaterThan(0);
    expect(admitted.length).toBeLessThanOrEqual(MAX_SANDBOXES);
    expect(refused.length).toBe(burst - admitted.length);
    for (const r of refused) {
      expect(r.status).toBe(503);
      expect(r.body.error.code).toBe('NODE_CAPACITY_EXHAUSTED');
      expect(r.retryAfter).toBeGreaterThan(0);
    }
    // operators see the refusals too
    const metrics = await (await request(new URL('/metrics', s.apiUrl))).body.text();
    const line = metrics
      .split('\n')
      .find((l) => l.startsWith('space_api_creates_refused_total{code="NODE_CAPACITY_EXHAUSTED"}'));
    expect(Number(line?.split(' ').pop())).toBe(refused.length);
    const ids = admitted.map((a) => a.body.sandbox.id).sort();
    // fill what room is left (creates that fit do fit)
    while (ids.length < MAX_SANDBOXES) {
      const more = await post();
      expect(more.status).toBe(202);
      expect((await finished(more.body.operation.id)).state).toBe('succeeded');
      ids.push(more.body.sandbox.id);
    }
    expect(await converged(s)).toEqual([...ids].sort());

    // a bounded wait for room that passes: refused when the bound has passed, nothing written
    const t0 = Date.now();
    const late = await post('?roomWaitMs=1500');
    const waited = Date.now() - t0;
    expect(late.status).toBe(503);
    expect(late.body.error.code).toBe('NODE_CAPACITY_EXHAUSTED');
    expect(late.retryAfter).toBeGreaterThan(0);
    expect(waited).toBeGreaterThanOrEqual(1500);

    // a bounded wait during which room frees: admitted once a sandbox is deleted, then runs
    const queued = post('?roomWaitMs=30000');
    await sleep(1000);
    const gone = ids.shift()!;
    await remove(gone);
    const got = await queued;
    expect(got.status).toBe(202);
    expect((await finished(got.body.operation.id)).state).toBe('succeeded');
    ids.push(got.body.sandbox.id);
    expect(await converged(s)).toEqual([...ids].sort());
    for (const id of ids) await remove(id);
    expect(await converged(s)).toEqual([]);
  });
});
