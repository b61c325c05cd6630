/**
 * The failover suite (issue 44 item 3): the `space up --ha` stack (runtime/cli/up-ha.ts: Redis
 * primary, replica and three sentinels, two APIs and two routers behind HAProxy, the gateway and
 * one agent), real processes, under the fault workload (test/fault-workload.ts: sandboxes
 * streaming numbered lines, a create/delete loop). Faults: kill -9 of the Redis primary during a
 * create burst, a pause/resume and a delete; the primary cut off from the sentinels (its server
 * runs in a network namespace of this test, the veth to it is taken down); one API and one router
 * killed mid-stream. The killed parts are brought back by the stack itself, as `space up --ha`
 * does (a dead Redis server once the sentinels have promoted another, an API or router after 1 s).
 *
 * Each case: no sandbox lost or orphaned, no operation ended twice or left unended, streams go on
 * with `Last-Event-ID`, records = node inventory = reservations afterwards; and the seconds from
 * the fault to the first create that succeeded. afterAll prints the table (fault, clients' view,
 * s to first successful create, lost).
 */
import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import type { Redis } from 'ioredis';
import { request } from 'undici';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { buildTemplate } from '../runtime/agent/image/templates.ts';
import { type HaStack, startHaStack } from '../runtime/cli/up-ha.ts';
import { httpOk } from '../runtime/cli/up-supervise.ts';
import { AGENT_ROUTES, type AgentSandboxSummary } from '../runtime/core/agent-protocol.ts';
import { redisConnection } from '../runtime/core/redis-connection.ts';
import { loadSigningKey, mintDispatchToken, writeNewKeyPair } from '../runtime/core/tokens.ts';
import { converged, type FaultStack, finished, views } from './fault-stack.ts';
import { Churn, LineStream, type Seen, tally, terminal, tryCall, watchOperation } from './fault-workload.ts';
import { freePort } from './redis-server.ts';
import { TEST_CACHE_DIR, waitFor } from './stack.ts';

const run = promisify(execFile);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const NODE_ID = 'ha-node';

/** One row of the closing table. */
interface Row {
  fault: string;
  clients: string;
  firstCreateS: number;
  lost: string;
}
const rows: Row[] = [];

describe('failover', () => {
  let dir: string;
  let ha: HaStack;
  /** The test's view of the stack, in the shape the fault workload helpers take. */
  let s: FaultStack;
  let redis: Redis;
  /** The port of each API and router behind the fronts. */
  let memberPorts: Record<string, number> = {};
  const ns = `space-ha-${process.pid}`;
  const vethHost = `vh${process.pid}`.slice(0, 15);
  const vethNs = `vn${process.pid}`.slice(0, 15);
  const octet = 1 + (process.pid % 250);
  const hostIp = `10.254.${octet}.1`;
  const nsIp = `10.254.${octet}.2`;

  beforeAll(async () => {
    await buildTemplate('base', { cacheDir: TEST_CACHE_DIR });
    dir = await mkdtemp(join(tmpdir(), 'space-failover-'));
    // redis-0 (the first primary) runs in its own network namespace behind a veth pair: taking
    // the host's end down cuts it off from the sentinels, the replica and every service
    await run('ip', ['netns', 'add', ns]);
    await run('ip', ['link', 'add', vethHost, 'type', 'veth', 'peer', 'name', vethNs]);
    await run('ip', ['link', 'set', vethNs, 'netns', ns]);
    await run('ip', ['addr', 'add', `${hostIp}/30`, 'dev', vethHost]);
    await run('ip', ['link', 'set', vethHost, 'up']);
    await run('ip', ['-n', ns, 'addr', 'add', `${nsIp}/30`, 'dev', vethNs]);
    await run('ip', ['-n', ns, 'link', 'set', vethNs, 'up']);
    await run('ip', ['-n', ns, 'link', 'set', 'lo', 'up']);
    await writeNewKeyPair(join(dir, 'key.pem'), join(dir, 'key.pub.pem'));
    const free: number[] = [];
    while (free.length < 16) {
      const p = await freePort();
      if (!free.includes(p)) free.push(p);
    }
    const [api, router, agent, a0, a1, r0, r1, d0, d1, s0, s1, s2, dns, http, tls, deadDns] = free;
    memberPorts = { 'api-0': a0!, 'api-1': a1!, 'router-0': r0!, 'router-1': r1! };
    const gatewaySocket = join(dir, 'gateway.sock');
    ha = await startHaStack({
      home: dir,
      keys: { signing: join(dir, 'key.pem'), verify: join(dir, 'key.pub.pem'), apiKey: join(dir, 'api-key') },
      ports: {
        api: api!,
        router: router!,
        agent: agent!,
        apis: [a0!, a1!],
        routers: [r0!, r1!],
        redis: [d0!, d1!],
        sentinels: [s0!, s1!, s2!],
      },
      cacheDir: TEST_CACHE_DIR,
      warm: 0,
      nodeId: NODE_ID,
      redisPlacement: (i) =>
        i === 0
          ? { bind: [nsIp], announceIp: nsIp, wrap: ['ip', 'netns', 'exec', ns] }
          : { bind: ['127.0.0.1', hostIp], announceIp: hostIp },
      env: {
        api: { SPACE_REAPER_INTERVAL_MS: '200', SPACE_LOG_LEVEL: process.env.SPACE_TEST_LOG_LEVEL ?? 'info' },
        agent: {
          SPACE_NETWORK_POOL: `10.${100 + Math.floor(Math.random() * 98)}.0.0/16`,
          SPACE_HEARTBEAT_INTERVAL_MS: '1000',
          SPACE_GATEWAY_DNS_PORT: String(dns),
          SPACE_GATEWAY_HTTP_PORT: String(http),
          SPACE_GATEWAY_TLS_PORT: String(tls),
        },
        gateway: {
          SPACE_GATEWAY_BIND_HOST: '0.0.0.0',
          SPACE_GATEWAY_DNS_PORT: String(dns),
          SPACE_GATEWAY_HTTP_PORT: String(http),
          SPACE_GATEWAY_TLS_PORT: String(tls),
          SPACE_GATEWAY_CONTROL_SOCKET: gatewaySocket,
          SPACE_GATEWAY_UPSTREAM_DNS: `127.0.0.1:${deadDns}`,
        },
      },
      note: (line) => console.log(line),
      onDied: (name, how) => console.log(`failover: ${name} ${how}`),
    });
    redis = redisConnection(ha.redisUrl, { maxRetriesPerRequest: 50 });
    redis.on('error', () => {});
    const signingKey = await loadSigningKey(join(dir, 'key.pem'));
    const apiKey = readFileSync(join(dir, 'api-key'), 'utf8').trim();
    s = {
      dir,
      nodeId: NODE_ID,
      apiUrl: ha.apiUrl,
      agentUrl: ha.agentUrl,
      routerUrl: ha.routerUrl,
      apiKey,
      redis,
      async call(method: string, path: string, body?: unknown) {
        const res = await tryCall(s, method, path, body, 30_000);
        if (res.status === 0) throw new Error(`${method} ${path}: ${res.code}`);
        return { status: res.status, body: res.body as never };
      },
      async inventory() {
        const token = await mintDispatchToken(signingKey, NODE_ID);
        const res = await request(new URL(AGENT_ROUTES.sandboxes, ha.agentUrl), {
          headers: { authorization: `Bearer ${token}` },
          headersTimeout: 5000,
          bodyTimeout: 5000,
        });
        const body = (await res.body.json()) as { sandboxes: AgentSandboxSummary[] };
        return body.sandboxes.map((x) => x.id).sort();
      },
    } as unknown as FaultStack;
  }, 600_000);

  afterAll(async () => {
    if (rows.length) {
      const lines = [
        '| fault | clients’ view | s to first successful create | lost |',
        '|---|---|---|---|',
        ...rows.map((r) => `| ${r.fault} | ${r.clients} | ${r.firstCreateS.toFixed(1)} | ${r.lost} |`),
      ];
      console.log(`failover table\n${lines.join('\n')}`);
    }
    redis?.disconnect();
    await run('ip', ['link', 'set', vethHost, 'up']).catch(() => {});
    await ha?.stop();
    await run('ip', ['link', 'del', vethHost]).catch(() => {});
    await run('ip', ['netns', 'del', ns]).catch(() => {});
    if (dir && !process.env.SPACE_TEST_KEEP_LOGS) await rm(dir, { recursive: true, force: true });
  }, 300_000);

  afterEach(async () => {
    // a failed case must not leave the primary cut off, nor its sandboxes, for the next
    await run('ip', ['link', 'set', vethHost, 'up']).catch(() => {});
    const left = new Set([
      ...(await s.inventory().catch(() => [])),
      ...((await views(s).catch(() => null))?.records ?? []),
    ]);
    await Promise.all(
      [...left].map(async (id) => {
        const del = await tryCall<{ operation: { id: string } }>(s, 'DELETE', `/v1/sandboxes/${id}`);
        if (del.status === 202 && del.body)
          await finished(s, del.body.operation.id, { tolerant: true }).catch(() => {});
      }),
    );
  }, 300_000);

  /** The data server the sentinels name as primary now. */
  async function primary(): Promise<string> {
    return waitFor('a primary', async () => (await ha.redis.primary()) ?? undefined, 30_000);
  }

  /** SIGKILL to a process by pid, as a crash would: the stack sees it die on its own. */
  function crash(name: string): void {
    const server = ha.redis.servers.find((x) => x.name === name);
    const pid = server ? server.proc?.pid : ha.children.get(name)?.proc.pid;
    if (!pid) throw new Error(`${name} is not running`);
    process.kill(pid, 'SIGKILL');
  }

  /** Waits until the sentinels name another primary than `old`, and the topology is whole again. */
  async function replaced(old: string): Promise<string> {
    const now = await waitFor(
      `the sentinels to replace ${old}`,
      async () => {
        const p = await ha.redis.primary();
        return p && p !== old ? p : undefined;
      },
      60_000,
    );
    await ha.redis.agreed({ timeoutMs: 90_000, minReplicas: 1 });
    return now;
  }

  /** Makes `name` the primary (SENTINEL FAILOVER when another is), for a case that needs it there. */
  async function makePrimary(name: string): Promise<void> {
    if ((await primary()) === name) return;
    const sentinel = ha.redis.servers.find((x) => x.kind === 'sentinel')!;
    const pw = readFileSync(join(dir, 'redis-ha', 'password'), 'utf8').trim();
    await run('redis-cli', [
      '-h',
      sentinel.host,
      '-p',
      String(sentinel.port),
      '-a',
      pw,
      '--no-auth-warning',
      'SENTINEL',
      'FAILOVER',
      ha.redis.primaryName,
    ]);
    await waitFor(
      `${name} to be primary`,
      async () => ((await ha.redis.primary()) === name ? true : undefined),
      60_000,
    );
    await ha.redis.agreed({ timeoutMs: 90_000, minReplicas: 1 });
  }

  /** A created `base` sandbox (through the front, retried while the stack recovers); its id. */
  async function create(): Promise<string> {
    for (let i = 0; i < 60; i++) {
      const res = await tryCall<{ sandbox: { id: string }; operation: { id: string } }>(
        s,
        'POST',
        '/v1/sandboxes',
        {
          template: 'base',
          vcpus: 0.5,
          memoryMiB: 128,
        },
      );
      if (res.status === 202 && res.body) {
        const op = await finished(s, res.body.operation.id, { tolerant: true });
        if (op.state === 'succeeded') return res.body.sandbox.id;
      }
      await sleep(1000);
    }
    throw new Error('no create succeeded');
  }

  /** Starts a command printing a numbered line every 100 ms; its stream (through the router front). */
  async function lines(id: string): Promise<{ url: string; token: string }> {
    const res = await s.call<{ stream: { url: string; token: string } }>(
      'POST',
      `/v1/sandboxes/${id}/commands`,
      {
        cmd: 'sh',
        args: ['-c', 'i=0; while :; do echo $i; i=$((i+1)); sleep 0.1; done'],
      },
    );
    expect(res.status).toBe(201);
    expect(res.body.stream.url.startsWith(ha.routerUrl)).toBe(true);
    return res.body.stream;
  }

  /**
   * Creates from `at` on until one succeeds (one try at a time, bounded); returns the seconds from
   * `at` to that success and what the failed tries saw. The sandbox is deleted afterwards.
   */
  async function firstCreate(at: number): Promise<{ s: number; saw: Seen[]; id: string }> {
    const saw: Seen[] = [];
    for (let i = 0; i < 240; i++) {
      const res = await tryCall<{ sandbox: { id: string }; operation: { id: string } }>(
        s,
        'POST',
        '/v1/sandboxes',
        {
          template: 'base',
          vcpus: 0.5,
          memoryMiB: 128,
        },
      );
      if (res.status === 202 && res.body) {
        const op = await finished(s, res.body.operation.id, { tolerant: true });
        if (op.state === 'succeeded') return { s: (Date.now() - at) / 1000, saw, id: res.body.sandbox.id };
        // an accepted create whose operation failed: what the client saw, as the operation's code
        saw.push({ status: 0, code: `create failed ${op.error?.code ?? ''}`.trim() });
      } else saw.push(res);
      const last = saw.at(-1);
      if (last && (saw.length === 1 || saw.at(-2)?.code !== last.code))
        console.log(
          `failover first-create try ${i} at +${((Date.now() - at) / 1000).toFixed(1)} s: ${last.status} ${last.code}`,
        );
      await sleep(250);
    }
    throw new Error(`no create succeeded after the fault: ${JSON.stringify(tally(saw))}`);
  }

  /** Fires `n` creates at once; each accepted one is watched to its end. */
  function burst(n: number) {
    const accepted: { id: string; watch: ReturnType<typeof watchOperation> }[] = [];
    const refused: Seen[] = [];
    const done = Promise.all(
      Array.from({ length: n }, async () => {
        const res = await tryCall<{ sandbox: { id: string }; operation: { id: string } }>(
          s,
          'POST',
          '/v1/sandboxes',
          {
            template: 'base',
            vcpus: 0.5,
            memoryMiB: 128,
          },
        );
        if (res.status === 202 && res.body)
          accepted.push({
            id: res.body.sandbox.id,
            watch: watchOperation(s, res.body.operation.id, { timeoutMs: 180_000 }),
          });
        else refused.push(res);
      }),
    );
    return { accepted, refused, done };
  }

  /**
   * The workload around one fault: 3 sandboxes streaming lines through the router front and a
   * create/delete loop. `inject` makes the fault and returns when it began plus its own
   * operations to check (each must end exactly once) and what its own calls saw. Then: the first
   * successful create, 10 more lines on every stream, no operation stuck or ended twice, the
   * three views agree, and nothing the clients were told exists is missing.
   */
  async function haCase(
    fault: string,
    inject: (began: (at: number) => void) => Promise<{
      at: number;
      /** Every stream must have been dropped and resumed (the fault cut them all). */
      everyStreamResumes?: boolean;
      ops?: ReturnType<typeof watchOperation>[];
      saw?: Seen[];
      made?: string[];
    }>,
  ): Promise<void> {
    const ids = await Promise.all([create(), create(), create()]);
    const streams = await Promise.all(ids.map(async (id) => new LineStream({ id, stream: await lines(id) })));
    const churn = new Churn(s);
    await Promise.all(streams.map((x) => x.more(10, 60_000)));
    // the creates that time recovery start the moment the fault does, beside the fault's own steps
    let timing: ReturnType<typeof firstCreate> | null = null;
    const injected = await inject((at) => {
      timing = firstCreate(at);
      timing.catch(() => {});
    });
    const first = await (timing ?? firstCreate(injected.at));
    await Promise.all(streams.map((x) => x.more(10, 120_000)));
    await churn.stop();
    await Promise.all(streams.map((x) => x.stop()));
    for (const w of injected.ops ?? []) await w.done;
    const problems = [
      ...churn.problems(),
      ...(injected.ops ?? []).flatMap((w, i) => {
        const t = terminal(w.states);
        return t.length === 1 ? [] : [`op ${i}: ${w.states.join('→') || 'never seen'}`];
      }),
    ];
    const gaps = streams.filter((x) => x.check() !== -1).map((x) => x.id);
    const agreed = await converged(s, 120_000);
    const live = [...ids, first.id, ...(injected.made ?? [])];
    const missing = live.filter((id) => !agreed.includes(id));
    const saw = tally([
      ...churn.refused,
      ...churn.rounds.flatMap((r) => r.ops.flatMap((o) => o.watch.refused)),
      ...(injected.ops ?? []).flatMap((w) => w.refused),
      ...streams.flatMap((x) => x.refused),
      ...first.saw,
      ...(injected.saw ?? []),
    ]);
    const lost = [
      ...missing.map((id) => `sandbox ${id}`),
      ...gaps.map((id) => `lines of ${id}`),
      ...problems,
    ];
    rows.push({
      fault,
      clients:
        Object.entries(saw)
          .map(([k, v]) => `${k} ×${v}`)
          .join(', ') || 'nothing',
      firstCreateS: first.s,
      lost: lost.join('; ') || 'nothing',
    });
    console.log(
      `failover ${fault} ${JSON.stringify({ firstCreateS: first.s, saw, resumes: streams.map((x) => x.resumes), churnRounds: churn.rounds.length, lost })}`,
    );
    expect(lost).toEqual([]);
    // what clients may see during a failover: a refusal to retry (503 with Retry-After, 429) or a
    // dropped connection (status 0); a 500, or a create refused as if the node were gone, is a fault
    expect(Object.keys(saw).filter((k) => !/^(0|429|503) /.test(k))).toEqual([]);
    for (const x of streams) expect(x.ended).toBe(false);
    if (injected.everyStreamResumes) for (const x of streams) expect(x.resumes).toBeGreaterThan(0);
    // everything still live is known to the node and reserved, and nothing else is
    for (const id of agreed) {
      const rec = await s.call<{ state: string }>('GET', `/v1/sandboxes/${id}`);
      expect(rec.body.state).toBe('running');
    }
    await Promise.all(
      agreed.map(async (id) => {
        const del = await s.call<{ operation: { id: string } }>('DELETE', `/v1/sandboxes/${id}`);
        expect((await finished(s, del.body.operation.id, { tolerant: true })).state).toBe('succeeded');
      }),
    );
    expect(await converged(s, 60_000)).toEqual([]);
  }

  it('redis primary kill -9 during a create burst', async () => {
    await haCase('Redis primary kill -9 during a create burst', async (began) => {
      const old = await primary();
      const b = burst(6);
      await sleep(300);
      const at = Date.now();
      crash(old);
      began(at);
      await b.done;
      await replaced(old);
      // every create the API accepted ends once, succeeded
      for (const x of b.accepted) await x.watch.done;
      for (const x of b.accepted) expect(x.watch.states.at(-1), x.watch.states.join('→')).toBe('succeeded');
      return { at, ops: b.accepted.map((x) => x.watch), saw: b.refused, made: b.accepted.map((x) => x.id) };
    });
  });

  it('redis primary kill -9 during a pause and a resume', async () => {
    await haCase('Redis primary kill -9 during pause/resume', async (began) => {
      const id = await create();
      const ops: ReturnType<typeof watchOperation>[] = [];
      const saw: Seen[] = [];
      const old = await primary();
      const pause = await tryCall<{ operation: { id: string } }>(s, 'POST', `/v1/sandboxes/${id}/pause`, {});
      expect(pause.status).toBe(202);
      const at = Date.now();
      crash(old);
      began(at);
      ops.push(watchOperation(s, pause.body!.operation.id, { timeoutMs: 180_000 }));
      await ops[0]!.done;
      expect(ops[0]!.states.at(-1)).toBe('succeeded');
      await replaced(old);
      // and the resume, with the other server killed now
      const second = await primary();
      let resume: Awaited<ReturnType<typeof tryCall<{ operation: { id: string } }>>> | null = null;
      for (let i = 0; i < 60 && resume?.status !== 202; i++) {
        resume = await tryCall<{ operation: { id: string } }>(s, 'POST', `/v1/sandboxes/${id}/resume`, {});
        if (resume.status !== 202) {
          saw.push(resume);
          await sleep(500);
        }
      }
      expect(resume?.status).toBe(202);
      crash(second);
      ops.push(watchOperation(s, resume!.body!.operation.id, { timeoutMs: 180_000 }));
      await ops[1]!.done;
      expect(ops[1]!.states.at(-1)).toBe('succeeded');
      await replaced(second);
      // the resumed sandbox runs commands
      const cmd = await s.call<{ stream: { url: string } }>('POST', `/v1/sandboxes/${id}/commands`, {
        cmd: 'true',
      });
      expect(cmd.status).toBe(201);
      return { at, ops, saw, made: [id] };
    });
  });

  it('redis primary kill -9 during a delete', async () => {
    await haCase('Redis primary kill -9 during a delete', async (began) => {
      const id = await create();
      const old = await primary();
      const del = await tryCall<{ operation: { id: string } }>(s, 'DELETE', `/v1/sandboxes/${id}`);
      expect(del.status).toBe(202);
      const at = Date.now();
      crash(old);
      began(at);
      const w = watchOperation(s, del.body!.operation.id, { timeoutMs: 180_000 });
      await w.done;
      expect(w.states.at(-1)).toBe('succeeded');
      await replaced(old);
      // gone from the node too
      await waitFor('the deleted sandbox to leave the node', async () =>
        (await s.inventory()).includes(id) ? undefined : true,
      );
      return { at, ops: [w] };
    });
  });

  it('redis primary partitioned from the sentinels (its network namespace cut off)', async () => {
    await makePrimary('redis-0');
    await haCase('Redis primary partitioned away (netns link down)', async (began) => {
      const b = burst(4);
      await sleep(300);
      const at = Date.now();
      await run('ip', ['link', 'set', vethHost, 'down']);
      began(at);
      await b.done;
      await waitFor(
        'the sentinels to promote redis-1',
        async () => ((await ha.redis.primary()) === 'redis-1' ? true : undefined),
        60_000,
      );
      // the link comes back: the old primary rejoins as a replica of redis-1
      await sleep(2000);
      await run('ip', ['link', 'set', vethHost, 'up']);
      await ha.redis.agreed({ timeoutMs: 90_000, minReplicas: 1 });
      for (const x of b.accepted) await x.watch.done;
      for (const x of b.accepted) expect(x.watch.states.at(-1), x.watch.states.join('→')).toBe('succeeded');
      return { at, ops: b.accepted.map((x) => x.watch), saw: b.refused, made: b.accepted.map((x) => x.id) };
    });
  });

  it('one API and one router kill -9 mid-stream', async () => {
    await haCase('an API and a router kill -9 mid-stream (each router in turn)', async (began) => {
      const at = Date.now();
      crash('api-0');
      crash('router-0');
      began(at);
      // both come back by themselves (the fronts served from the others meanwhile)
      const back = async (names: string[]) => {
        await waitFor(
          `${names.join(' and ')} to serve again`,
          async () => {
            const ready = await Promise.all(
              names.map((n) => httpOk(`http://127.0.0.1:${memberPorts[n]}/readyz`)),
            );
            return ready.every(Boolean) ? true : undefined;
          },
          60_000,
        );
        // and HAProxy to count them in again (two checks one second apart)
        await sleep(3000);
      };
      await back(['api-0', 'router-0']);
      // HAProxy spreads the streams over both routers: killing the other one too (once the first
      // serves again) drops every stream at least once
      crash('router-1');
      await back(['router-1']);
      return { at, everyStreamResumes: true };
    });
  });
});
