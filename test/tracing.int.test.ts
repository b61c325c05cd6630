/**
 * Tracing end to end: one create's spans form one trace across the API request, the operation
 * queued in Redis, the dispatch and the agent (W3C traceparent over HTTP and in the operation
 * record), and a command's across the API, the router (its own process) and the agent's stream,
 * also when the E2B SDK's envd protocol starts it, written by the SPACE_TRACE_FILE exporter.
 */
import { randomBytes } from 'node:crypto';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createClient } from '@connectrpc/connect';
import { createConnectTransport } from '@connectrpc/connect-node';
import { trace } from '@opentelemetry/api';
import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  startTracing,
  TRACE_FILE_FLUSH_MS,
  type TraceFileSpan,
  type Tracing,
} from '../runtime/core/tracing.ts';
import { Process } from '../runtime/router/envd/gen/process/process_pb.js';
import { freePort } from './redis-server.ts';
import { type RouterProcess, startRouterProcess } from './router-process.ts';
import { readEvents, type Stack, startStack } from './stack.ts';

describe('tracing', () => {
  let s: Stack;
  let router: RouterProcess;
  let dir: string;
  let tracing: Tracing | null;
  const file = () => join(dir, 'spans.jsonl');
  const routerFile = () => join(dir, 'router-spans.jsonl');
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'space-trace-'));
    expect(startTracing('space-test', {})).toBeNull(); // nothing configured: nothing registered
    tracing = startTracing('space-test', { SPACE_TRACE_FILE: file() });
    const port = await freePort();
    s = await startStack({ SPACE_WARM_POOL_SIZE: '1', SPACE_ROUTER_URL: `http://127.0.0.1:${port}` });
    router = await startRouterProcess({
      SPACE_ROUTER_PORT: String(port),
      SPACE_REDIS_URL: s.redisUrl,
      SPACE_VERIFY_KEY_FILE: join(s.dir, 'key.pub.pem'),
      SPACE_TRACE_FILE: routerFile(),
    });
  });
  /** A W3C Trace Context `traceparent`: version 00, a new trace id and parent id, flags (01 = sampled). */
  const parent = (flags: '00' | '01') =>
    `00-${randomBytes(16).toString('hex')}-${randomBytes(8).toString('hex')}-${flags}`;
  /** The spans of trace `traceId` in both processes' files. */
  const spansOf = async (traceId: string) =>
    (await Promise.all([file(), routerFile()].map((f) => readFile(f, 'utf8').catch(() => ''))))
      .join('\n')
      .split('\n')
      .filter((l) => l.trim())
      .map((l) => JSON.parse(l) as TraceFileSpan)
      .filter((x) => x.traceId === traceId);
  /** As {@link spansOf}, once every `wanted` name is there (spans are written in batches) or 5 s passed. */
  const spansOnce = async (traceId: string, wanted: string[]) => {
    let spans = await spansOf(traceId);
    for (let i = 0; i < 50 && !wanted.every((n) => spans.some((x) => x.name === n)); i++) {
      await new Promise((r) => setTimeout(r, TRACE_FILE_FLUSH_MS));
      spans = await spansOf(traceId);
    }
    return spans;
  };
  /**
   * Runs `run` as an unsampled caller, then as a sampled one. Gives the sampled trace's spans once
   * every `wanted` name is there, the sampled caller's own span id (its hops' parent), what each run
   * returned, and the unsampled trace's spans: read after the sampled ones arrived, so both went
   * through the same batches and an unsampled span would be there by now.
   */
  const loudAndQuiet = async <T>(run: (traceparent: string) => Promise<T>, wanted: string[]) => {
    const quiet = parent('00');
    const loud = parent('01');
    const quietResult = await run(quiet);
    const loudResult = await run(loud);
    const [, loudTrace, loudParentId] = loud.split('-');
    const spans = await spansOnce(loudTrace!, wanted);
    const quietSpans = await spansOf(quiet.split('-')[1]!);
    return { spans, loudParentId: loudParentId!, quietSpans, results: [quietResult, loudResult] };
  };
  afterAll(async () => {
    await router?.stop();
    await s?.stop();
    await tracing?.shutdown();
    trace.disable();
    await rm(dir, { recursive: true, force: true });
  });

  it('a create is one trace: request → operation → dispatch → agent claim or boot', async () => {
    expect(tracing?.exporters).toEqual([`file:${file()}`]);
    // with an env, so the claim has a guest init to trace (a fresh guest's env is empty: an empty
    // one is not sent)
    const id = await s.createSandbox({ env: { TRACED: '1' } });
    const read = async () =>
      (await readFile(file(), 'utf8').catch(() => ''))
        .split('\n')
        .filter((l) => l.trim())
        .map((l) => JSON.parse(l) as TraceFileSpan);
    // a span is written (in a batch) after it ends, and a warm claim's guest init and egress step
    // end after the create answered
    const done = (xs: TraceFileSpan[]) =>
      ['agent.sandboxes.create', 'agent.guest.init', 'agent.egress.apply', 'redis.operation.finish'].every(
        (n) => xs.some((x) => x.name === n),
      );
    let spans = await read();
    for (let i = 0; i < 100 && !done(spans); i++) {
      await new Promise((r) => setTimeout(r, 100));
      spans = await read();
    }
    const agent = spans.find(
      (x) => x.name === 'agent.sandboxes.create' && x.attributes['space.sandbox.id'] === id,
    );
    expect(agent).toBeDefined();
    const inTrace = spans.filter((x) => x.traceId === agent!.traceId);
    const byId = new Map(inTrace.map((x) => [x.spanId, x]));
    // walk up from the agent's span to the root: every hop is there, in this order
    const chain: string[] = [];
    for (
      let cur: TraceFileSpan | undefined = agent;
      cur;
      cur = cur.parentId ? byId.get(cur.parentId) : undefined
    )
      chain.push(cur.name);
    expect(chain).toEqual([
      'agent.sandboxes.create',
      'api.dispatch',
      'operation.sandbox.create',
      'redis.sandbox.create', // the operation carries the context it was written in
      'api.sandboxes.create',
    ]);
    // the claim's own steps hang under the agent's span, each with a duration
    const steps = inTrace.filter((x) => x.parentId === agent!.spanId).map((x) => x.name);
    expect(steps).toEqual(expect.arrayContaining(['agent.guest.init', 'agent.egress.apply']));
    for (const x of inTrace) expect(x.durationMs).toBeGreaterThanOrEqual(0);
    expect(inTrace.find((x) => x.name === 'api.sandboxes.create')!.parentId).toBeUndefined();
    // the worker's Redis scripts: placing, moving and metering the sandbox inside the operation's
    // span; its start and finish, outside the handler, in the context the operation was queued in
    const named = (n: string) => inTrace.filter((x) => x.name === n);
    const operation = named('operation.sandbox.create')[0]!;
    const queuedIn = named('redis.sandbox.create')[0]!;
    for (const n of ['redis.sandbox.place', 'redis.sandbox.transition', 'redis.usage.report']) {
      expect(named(n).length, n).toBeGreaterThan(0);
      for (const x of named(n)) expect(x.parentId, n).toBe(operation.spanId);
    }
    for (const n of ['redis.operation.start', 'redis.operation.finish']) {
      expect(
        named(n).map((x) => x.parentId),
        n,
      ).toEqual([queuedIn.spanId]);
    }
    // the start script ran before the handler did
    const start = named('redis.operation.start')[0]!;
    expect(start.startMs + start.durationMs).toBeLessThanOrEqual(operation.startMs + 1);
    // timers and sweeps (expiry, auto-pause, the warm pool) take the same scripts: no trace of their own
    expect(spans.filter((x) => x.name.startsWith('redis.') && !x.parentId)).toEqual([]);
  });

  it('the caller’s traceparent decides: an unsampled create and its command record nothing', async () => {
    const run = async (traceparent: string) => {
      const made = await s.call<{ sandbox: { id: string }; operation: { state: string } }>(
        'POST',
        '/v1/sandboxes?waitMs=30000',
        { template: 'base', env: { TRACED: '1' } },
        { traceparent },
      );
      expect(made.body.operation.state).toBe('succeeded');
      const id = made.body.sandbox.id;
      const cmd = await s.call('POST', `/v1/sandboxes/${id}/commands`, { cmd: 'true' }, { traceparent });
      expect(cmd.status).toBe(201);
      return id;
    };
    const wanted = [
      'api.sandboxes.create',
      'operation.sandbox.create',
      'api.dispatch',
      'agent.sandboxes.create',
      'agent.egress.apply',
      'api.commands.start',
      'agent.commands.start',
    ];
    const { spans, quietSpans, results } = await loudAndQuiet(run, wanted);
    // a sampled caller's create and command join its trace, hop by hop
    expect(spans.map((x) => x.name)).toEqual(expect.arrayContaining(wanted));
    // the unsampled one ended first and went through the same batches: none of its spans
    expect(quietSpans).toEqual([]);
    for (const id of results) await s.call('DELETE', `/v1/sandboxes/${id}`);
  });

  it('a command’s stream through the router joins its caller’s trace, hop by hop', async () => {
    const id = await s.createSandbox();
    const run = async (traceparent: string) => {
      const cmd = await s.call<{ stream: { url: string; token: string } }>(
        'POST',
        `/v1/sandboxes/${id}/commands`,
        { cmd: 'echo', args: ['traced'] },
        { traceparent },
      );
      expect(cmd.status).toBe(201);
      expect(cmd.body.stream.url.startsWith(router.url)).toBe(true);
      const events = await readEvents(cmd.body.stream.url, cmd.body.stream.token, {
        headers: { traceparent },
      });
      expect(events.map((e) => e.event)).toContain('exit');
    };
    const wanted = [
      'api.commands.start',
      'agent.commands.start',
      'agent.guest.spawn',
      'router.token.verify',
      'router.forward',
      'agent.stream.open',
    ];
    const { spans, loudParentId, quietSpans } = await loudAndQuiet(run, wanted);
    const named = (n: string) => spans.find((x) => x.name === n);
    for (const n of wanted) expect(named(n), n).toBeDefined();
    // the router's spans are the client's children (its own process), the agent's stream the router's
    expect(named('router.forward')!.service).toBe('space-router');
    expect(named('router.forward')!.parentId).toBe(loudParentId);
    expect(named('router.token.verify')!.parentId).toBe(loudParentId);
    expect(named('router.forward')!.attributes['space.route']).toBe('command.events');
    expect(named('agent.stream.open')!.parentId).toBe(named('router.forward')!.spanId);
    expect(named('agent.guest.spawn')!.parentId).toBe(named('agent.commands.start')!.spanId);
    expect(named('agent.stream.open')!.attributes['space.sandbox.id']).toBe(id);
    // the unsampled caller's command and stream went through the same batches: no span of it anywhere
    expect(quietSpans).toEqual([]);
    await s.call('DELETE', `/v1/sandboxes/${id}`);
  });

  it('an E2B SDK command through the router’s envd layer joins its caller’s trace, hop by hop', async () => {
    const id = await s.createSandbox();
    // the envd access token as the E2B control plane hands it out (GET /sandboxes/:id)
    const detail = await request(`${s.apiUrl}/sandboxes/${id}`, { headers: { 'x-api-key': s.apiKey } });
    const { envdAccessToken } = (await detail.body.json()) as { envdAccessToken: string };
    const envd = createClient(Process, createConnectTransport({ baseUrl: router.url, httpVersion: '1.1' }));
    const run = async (traceparent: string) => {
      const headers = {
        'e2b-sandbox-id': id,
        'x-access-token': envdAccessToken,
        authorization: `Basic ${Buffer.from('user:').toString('base64')}`,
        traceparent,
      };
      const events: string[] = [];
      let stdout = '';
      for await (const res of envd.start({ process: { cmd: '/bin/echo', args: ['traced'] } }, { headers })) {
        const e = res.event?.event;
        if (!e?.case) continue;
        events.push(e.case);
        if (e.case === 'data' && e.value.output.case === 'stdout')
          stdout += Buffer.from(e.value.output.value);
      }
      expect(events).toContain('end');
      expect(stdout).toBe('traced\n');
    };
    const wanted = [
      'router.token.verify',
      'router.forward',
      'agent.commands.start',
      'agent.guest.spawn',
      'agent.stream.open',
    ];
    const { spans, loudParentId, quietSpans } = await loudAndQuiet(run, wanted);
    const named = (n: string) => spans.filter((x) => x.name === n);
    for (const n of wanted) expect(named(n).length, n).toBeGreaterThan(0);
    // the check and each agent call are the caller's children, in the router's own process
    expect(named('router.token.verify')[0]!.parentId).toBe(loudParentId);
    expect(named('router.token.verify')[0]!.attributes['space.route']).toBe('process.Process/Start');
    for (const f of named('router.forward')) {
      expect(f.service).toBe('space-router');
      expect(f.parentId).toBe(loudParentId);
      expect(f.attributes['space.route']).toBe('process.Process/Start');
      expect(f.attributes['space.sandbox.id']).toBe(id);
    }
    // the command's start and its stream on the agent are children of the router's calls
    const forwards = new Set(named('router.forward').map((f) => f.spanId));
    expect(forwards.has(named('agent.commands.start')[0]!.parentId!)).toBe(true);
    expect(forwards.has(named('agent.stream.open')[0]!.parentId!)).toBe(true);
    expect(named('agent.guest.spawn')[0]!.parentId).toBe(named('agent.commands.start')[0]!.spanId);
    // an unsampled caller's call went through the same batches: no span of it anywhere
    expect(quietSpans).toEqual([]);
    await s.call('DELETE', `/v1/sandboxes/${id}`);
  });

  it('a failed hop is marked with its error code', async () => {
    const res = await s.call('POST', '/v1/sandboxes', { template: 'no-such-template' });
    expect(res.status).toBe(404);
    // spans are appended in batches (TRACE_FILE_FLUSH_MS): wait for the failed one
    const failedSpans = async () =>
      (await readFile(file(), 'utf8'))
        .trim()
        .split('\n')
        .map((l) => JSON.parse(l) as TraceFileSpan)
        .filter((x) => x.name === 'api.sandboxes.create' && x.status === 'error');
    let failed = await failedSpans();
    for (let i = 0; i < 50 && failed.length === 0; i++) {
      await new Promise((r) => setTimeout(r, TRACE_FILE_FLUSH_MS));
      failed = await failedSpans();
    }
    expect(failed.at(-1)?.attributes['error.code']).toBe('TEMPLATE_NOT_FOUND');
  });
});
