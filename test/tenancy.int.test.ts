/**
 * Tenancy on one real stack (real Redis, gVisor sandboxes, a router process): two teams, every
 * route tried with the other team's ids and with a key lacking each scope; credential isolation
 * down to the gateway's value source; quotas under a concurrent burst; key revocation and rotation
 * across two API replicas; an audit entry for every mutating call; keys from before teams.
 */
import { createHash } from 'node:crypto';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadApiConfig } from '../runtime/api/config.ts';
import { type RunningApi, startApi } from '../runtime/api/service.ts';
import { keys } from '../runtime/core/redis-keys.ts';
import { ALL_SCOPES, type ApiScope } from '../runtime/core/tenancy.ts';
import { loadSigningKey, mintSessionToken } from '../runtime/core/tokens.ts';
import { redisCredentialSource } from '../runtime/gateway/credential-source.ts';
import { freePort } from './redis-server.ts';
import { type RouterProcess, startRouterProcess } from './router-process.ts';
import {
  clientOf,
  leftovers,
  NO_LEFTOVERS,
  type Stack,
  type StackClient,
  startStack,
  waitFor,
} from './stack.ts';

type Err = { error: { code: string; message: string; details?: Record<string, unknown> } };
type Made = { key: { id: string; team: string; scopes: string[] }; secret: string };

let s: Stack;
let router: RouterProcess;
/** Team A = the default team (bootstrap key); team B = `tb`. */
let A: StackClient;
let B: StackClient;
let sbxA: string;
let opA: string;
let sbxB: string;

async function makeKey(team: string, scopes: readonly ApiScope[], name = 'k'): Promise<Made> {
  const r = await s.call<Made>('POST', '/v1/keys', { name, team, scopes });
  expect(r.status, JSON.stringify(r.body)).toBe(201);
  return r.body;
}

beforeAll(async () => {
  const port = await freePort();
  s = await startStack({ SPACE_ROUTER_URL: `http://127.0.0.1:${port}` });
  router = await startRouterProcess({
    SPACE_ROUTER_PORT: String(port),
    SPACE_REDIS_URL: s.redisUrl,
    SPACE_VERIFY_KEY_FILE: join(s.dir, 'key.pub.pem'),
  });
  A = s;
  expect((await s.call('POST', '/v1/teams', { id: 'tb' })).status).toBe(201);
  B = s.as(
    (
      await makeKey(
        'tb',
        ALL_SCOPES.filter((x) => x !== 'teams:admin'),
        'b-admin',
      )
    ).secret,
  );
  // team A's sandbox and its create operation, to be looked for from team B
  const made = await A.call<{ sandbox: { id: string }; operation: { id: string } }>('POST', '/v1/sandboxes', {
    template: 'base',
    metadata: { who: 'a' },
  });
  sbxA = made.body.sandbox.id;
  opA = made.body.operation.id;
  expect((await A.call<{ state: string }>('GET', `/v1/operations/${opA}?waitMs=60000`)).body.state).toBe(
    'succeeded',
  );
  sbxB = await B.createSandbox({ metadata: { who: 'b' } });
}, 180_000);

afterAll(async () => {
  await router?.stop();
  if (!s) return;
  await s.stop();
  expect(await leftovers(s)).toEqual(NO_LEFTOVERS);
}, 120_000);

/** Every v1 route: method, path (`:id` = a sandbox of the team it is tried against), body, scope. */
function routes(id: string, op: string): { method: string; path: string; body?: unknown; scope: ApiScope }[] {
  return [
    { method: 'POST', path: '/v1/sandboxes', body: { template: 'base' }, scope: 'sandboxes:write' },
    { method: 'GET', path: '/v1/sandboxes', scope: 'sandboxes:read' },
    { method: 'GET', path: `/v1/sandboxes/${id}`, scope: 'sandboxes:read' },
    { method: 'DELETE', path: `/v1/sandboxes/${id}`, scope: 'sandboxes:write' },
    { method: 'POST', path: `/v1/sandboxes/${id}/pause`, body: {}, scope: 'sandboxes:write' },
    { method: 'POST', path: `/v1/sandboxes/${id}/resume`, scope: 'sandboxes:write' },
    { method: 'GET', path: `/v1/sandboxes/${id}/usage`, scope: 'sandboxes:read' },
    { method: 'PATCH', path: `/v1/sandboxes/${id}/egress`, body: { allow: [] }, scope: 'sandboxes:write' },
    {
      method: 'POST',
      path: `/v1/sandboxes/${id}/timeout`,
      body: { timeoutSec: 60 },
      scope: 'sandboxes:write',
    },
    { method: 'POST', path: `/v1/sandboxes/${id}/commands`, body: { cmd: 'true' }, scope: 'sandboxes:write' },
    { method: 'POST', path: `/v1/sandboxes/${id}/tokens`, body: {}, scope: 'sandboxes:write' },
    { method: 'GET', path: `/v1/operations/${op}`, scope: 'sandboxes:read' },
    { method: 'GET', path: '/v1/nodes', scope: 'nodes:read' },
    { method: 'PUT', path: '/v1/nodes/tb/drain', body: {}, scope: 'deployment:admin' },
    { method: 'DELETE', path: '/v1/nodes/tb/drain', scope: 'deployment:admin' },
    { method: 'GET', path: '/v1/templates', scope: 'nodes:read' },
    { method: 'GET', path: '/v1/deployment/target-version', scope: 'nodes:read' },
    {
      method: 'PUT',
      path: '/v1/deployment/target-version',
      body: { version: 'v1' },
      scope: 'deployment:admin',
    },
    { method: 'GET', path: '/v1/deployment/vm-config', scope: 'deployment:admin' },
    { method: 'PUT', path: '/v1/deployment/vm-config', body: { services: {} }, scope: 'deployment:admin' },
    { method: 'GET', path: '/v1/credentials', scope: 'credentials:read' },
    { method: 'GET', path: '/v1/credentials/nope', scope: 'credentials:read' },
    {
      method: 'PUT',
      path: '/v1/credentials/nope',
      body: { domains: ['x.test'], value: 'audited-value-1234' },
      scope: 'credentials:admin',
    },
    { method: 'DELETE', path: '/v1/credentials/nope', scope: 'credentials:admin' },
    { method: 'GET', path: '/v1/usage', scope: 'usage:read' },
    { method: 'GET', path: '/v1/audit', scope: 'audit:read' },
    { method: 'POST', path: '/v1/keys', body: { name: 'x', scopes: [] }, scope: 'keys:admin' },
    { method: 'GET', path: '/v1/keys', scope: 'keys:admin' },
    { method: 'GET', path: '/v1/keys/key_aaaaaaaaaaaaaaaaaaaa', scope: 'keys:admin' },
    { method: 'DELETE', path: '/v1/keys/key_aaaaaaaaaaaaaaaaaaaa', scope: 'keys:admin' },
    { method: 'POST', path: '/v1/keys/key_aaaaaaaaaaaaaaaaaaaa/rotate', body: {}, scope: 'keys:admin' },
    { method: 'POST', path: '/v1/teams', body: { id: 'never' }, scope: 'teams:admin' },
    { method: 'GET', path: '/v1/teams', scope: 'teams:admin' },
    { method: 'GET', path: '/v1/teams/tb', scope: 'sandboxes:read' },
    { method: 'PATCH', path: '/v1/teams/tb', body: { quotas: {} }, scope: 'teams:admin' },
  ];
}

describe('two teams on one stack', () => {
  it('the route table above covers every v1 route of the OpenAPI document', async () => {
    const doc = await s.call<{ paths: Record<string, Record<string, unknown>> }>('GET', '/openapi.json');
    const documented = Object.entries(doc.body.paths)
      .filter(([p]) => p.startsWith('/v1/'))
      .flatMap(([p, ops]) => Object.keys(ops).map((m) => `${m.toUpperCase()} ${p}`));
    const covered = new Set(
      routes('{id}', '{id}').map(
        (r) =>
          `${r.method} ${r.path.replace(/\/(key_a+|nope|tb)(?=\/|$)/, (_m, x: string) =>
            x === 'nope' ? '/{name}' : '/{id}',
          )}`,
      ),
    );
    expect(documented.filter((d) => !covered.has(d))).toEqual([]);
  });

  it("every route given the other team's ids answers as for ids that do not exist", async () => {
    const missing = 'sbxaaaaaaaaaaaaaaaaaaaa';
    for (const r of routes(sbxA, opA).filter((x) => x.path.includes(sbxA) || x.path.includes(opA))) {
      const theirs = await B.call<Err>(r.method, r.path, r.body);
      const none = await B.call<Err>(
        r.method,
        r.path.replace(sbxA, missing).replace(opA, 'op_aaaaaaaaaaaaaaaaaaaa'),
        r.body,
      );
      const what = `${r.method} ${r.path}`;
      expect(theirs.status, what).toBe(404);
      expect(theirs.body.error.code, what).toBe(
        r.path.includes(opA) ? 'OPERATION_NOT_FOUND' : 'SANDBOX_NOT_FOUND',
      );
      // never a hint it exists: the same answer as for an id nobody has
      expect(theirs.body.error.message.replace(sbxA, 'X').replace(opA, 'X'), what).toBe(
        none.body.error.message.replace(missing, 'X').replace('op_aaaaaaaaaaaaaaaaaaaa', 'X'),
      );
    }
    // a long-poll on another team's operation is not waited on
    const t0 = Date.now();
    expect((await B.call('GET', `/v1/operations/${opA}?waitMs=5000`)).status).toBe(404);
    expect(Date.now() - t0).toBeLessThan(2000);
    // listing shows only the team's own
    const listB = await B.call<{ sandboxes: { id: string }[] }>('GET', '/v1/sandboxes');
    expect(listB.body.sandboxes.map((x) => x.id)).toEqual([sbxB]);
    const listA = await A.call<{ sandboxes: { id: string }[] }>('GET', '/v1/sandboxes');
    expect(listA.body.sandboxes.map((x) => x.id)).not.toContain(sbxB);
    // A's sandbox is untouched
    const still = await A.call<{ state: string; timeoutSec: number }>('GET', `/v1/sandboxes/${sbxA}`);
    expect(still.body.state).toMatch(/running|paused|pausing|resuming/);
  });

  it("E2B routes map X-API-KEY onto the key's team", async () => {
    const e2b = (key: string, method: string, path: string, body?: unknown) =>
      request(new URL(path, s.apiUrl), {
        method: method as 'GET',
        headers: { 'x-api-key': key, ...(body ? { 'content-type': 'application/json' } : {}) },
        body: body ? JSON.stringify(body) : undefined,
      }).then(async (r) => ({ status: r.statusCode, text: await r.body.text() }));
    for (const [m, p, b] of [
      ['GET', `/sandboxes/${sbxA}`],
      ['DELETE', `/sandboxes/${sbxA}`],
      ['POST', `/sandboxes/${sbxA}/timeout`, { timeout: 30 }],
      ['POST', `/sandboxes/${sbxA}/pause`],
      ['POST', `/sandboxes/${sbxA}/connect`, { timeout: 30 }],
    ] as const) {
      expect((await e2b(B.apiKey, m, p, b)).status, `${m} ${p}`).toBe(404);
    }
    // a route SPACE does not serve answers the same for their sandbox as for one nobody has
    const metrics = await e2b(B.apiKey, 'GET', `/sandboxes/${sbxA}/metrics`);
    const none = await e2b(B.apiKey, 'GET', '/sandboxes/sbxaaaaaaaaaaaaaaaaaaaa/metrics');
    expect(metrics.status).toBe(501);
    expect(metrics.text.replace(sbxA, '<id>')).toBe(none.text.replace('sbxaaaaaaaaaaaaaaaaaaaa', '<id>'));
    const listed = await e2b(B.apiKey, 'GET', '/v2/sandboxes');
    expect(listed.status).toBe(200);
    const ids = (JSON.parse(listed.text) as { sandboxID: string }[]).map((x) => x.sandboxID);
    expect(ids).toContain(sbxB);
    expect(ids).not.toContain(sbxA);
    // its own: found
    expect((await e2b(B.apiKey, 'GET', `/sandboxes/${sbxB}`)).status).toBe(200);
    // a read-only key may not create through E2B either
    const ro = await makeKey('tb', ['sandboxes:read']);
    const denied = await e2b(ro.secret, 'POST', '/sandboxes', { templateID: 'base' });
    expect(denied.status).toBe(403);
  });

  it('an E2B create and kill are one audit entry each (the E2B route), not two', async () => {
    const e2b = (method: string, path: string, body?: unknown) =>
      request(new URL(path, s.apiUrl), {
        method: method as 'GET',
        headers: {
          'x-api-key': B.apiKey,
          // a client cannot mark its own call as an inner one to go unaudited
          'x-space-inner-call': 'guess',
          ...(body ? { 'content-type': 'application/json' } : {}),
        },
        body: body ? JSON.stringify(body) : undefined,
      }).then(async (r) => ({ status: r.statusCode, text: await r.body.text() }));
    const made = await e2b('POST', '/sandboxes', { templateID: 'base', timeout: 60 });
    expect(made.status, made.text).toBe(201);
    const id = (JSON.parse(made.text) as { sandboxID: string }).sandboxID;
    expect((await e2b('DELETE', `/sandboxes/${id}`)).status).toBe(204);
    const log = await B.call<{ entries: { action: string; target: string; result: string }[] }>(
      'GET',
      '/v1/audit?limit=1000',
    );
    expect(
      log.body.entries
        .filter((e) => e.target === id)
        .map((e) => `${e.action} ${e.result}`)
        .sort(),
    ).toEqual(['DELETE /sandboxes/:id ok', 'POST /sandboxes ok']);
  });

  it('a key lacking a scope gets 403 SCOPE_DENIED naming it, on every route that needs it', async () => {
    for (const scope of ALL_SCOPES) {
      const k = s.as(
        (
          await makeKey(
            'default',
            ALL_SCOPES.filter((x) => x !== scope),
            `no-${scope}`,
          )
        ).secret,
      );
      for (const r of routes(sbxA, opA).filter((x) => x.scope === scope)) {
        const res = await k.call<Err>(r.method, r.path, r.body);
        expect(res.status, `${r.method} ${r.path} without ${scope}`).toBe(403);
        expect(res.body.error.code).toBe('SCOPE_DENIED');
        expect(res.body.error.details?.scope).toBe(scope);
      }
    }
    // and nothing happened: A's sandbox still exists, the target version was not set
    expect((await A.call('GET', `/v1/sandboxes/${sbxA}`)).status).toBe(200);
    expect((await A.call<{ version: null }>('GET', '/v1/deployment/target-version')).body.version).toBeNull();
  });

  it('keys: a team admin grants only its own scopes, only in its team; another team’s key ids are not found', async () => {
    const escalate = await B.call<Err>('POST', '/v1/keys', { name: 'x', scopes: ['teams:admin'] });
    expect(escalate.status).toBe(403);
    const otherTeam = await B.call<Err>('POST', '/v1/keys', { name: 'x', team: 'default' });
    expect(otherTeam.body.error.code).toBe('SCOPE_DENIED');
    const aKeys = await A.call<{ keys: { id: string }[] }>('GET', '/v1/keys');
    const aKey = aKeys.body.keys[0]!.id;
    for (const [m, p] of [
      ['GET', `/v1/keys/${aKey}`],
      ['DELETE', `/v1/keys/${aKey}`],
      ['POST', `/v1/keys/${aKey}/rotate`],
    ] as const) {
      const r = await B.call<Err>(m, p, m === 'POST' ? {} : undefined);
      expect(r.body.error.code, `${m} ${p}`).toBe('API_KEY_NOT_FOUND');
    }
    const bKeys = await B.call<{ keys: { team: string }[] }>('GET', '/v1/keys');
    expect(bKeys.body.keys.every((k) => k.team === 'tb')).toBe(true);
    // a new key with no scopes named gets the everyday ones, no administration
    const plain = await B.call<Made>('POST', '/v1/keys', { name: 'plain' });
    expect(plain.body.key.scopes).not.toContain('credentials:admin');
    expect(plain.body.key.scopes).not.toContain('keys:admin');
    expect(plain.body.key.team).toBe('tb');
  });

  it("credentials are the team's own: B cannot read, overwrite, delete or grant A's; B's sandbox gets B's value", async () => {
    expect(
      (await A.call('PUT', '/v1/credentials/shared', { domains: ['api.a.test'], value: 'A-SECRET' })).status,
    ).toBe(200);
    expect(
      (await A.call('PUT', '/v1/credentials/a-only', { domains: ['api.a.test'], value: 'A-ONLY-VALUE-1234' }))
        .status,
    ).toBe(200);
    // B with the everyday scopes cannot register at all
    const plainB = s.as((await makeKey('tb', ['sandboxes:write', 'credentials:read'])).secret);
    const refused = await plainB.call<Err>('PUT', '/v1/credentials/shared', {
      domains: ['api.a.test'],
      value: 'B-OTHER-VALUE-1234',
    });
    expect(refused.body.error.code).toBe('SCOPE_DENIED');
    // B's admin registers its own "shared": A's is untouched
    expect(
      (await B.call('PUT', '/v1/credentials/shared', { domains: ['api.b.test'], value: 'B-SECRET' })).status,
    ).toBe(200);
    const aShared = await A.call<{ domains: string[] }>('GET', '/v1/credentials/shared');
    expect(aShared.body.domains).toEqual(['api.a.test']);
    expect(await s.redis.hget(keys.credential('default', 'shared'), 'value')).toBe('A-SECRET');
    // B sees only its own
    const listB = await B.call<{ credentials: { name: string }[] }>('GET', '/v1/credentials');
    expect(listB.body.credentials.map((c) => c.name)).toEqual(['shared']);
    expect((await B.call<Err>('GET', '/v1/credentials/a-only')).body.error.code).toBe('CREDENTIAL_NOT_FOUND');
    expect((await B.call<Err>('DELETE', '/v1/credentials/a-only')).body.error.code).toBe(
      'CREDENTIAL_NOT_FOUND',
    );
    expect(await s.redis.exists(keys.credential('default', 'a-only'))).toBe(1);
    // B cannot grant A's credential to its sandbox
    const grantA = await B.call<Err>('POST', '/v1/sandboxes', { template: 'base', credentials: ['a-only'] });
    expect(grantA.status).toBe(404);
    expect(grantA.body.error.code).toBe('CREDENTIAL_NOT_FOUND');
    // B's sandbox granted "shared" holds a placeholder of B's credential; the gateway's value
    // source (what it injects on the way out) answers B's value for it, never A's
    const id = await B.createSandbox({ credentials: ['shared'] });
    const grants = JSON.parse((await s.redis.hget(keys.sandbox(id), 'grants')) ?? '[]') as {
      name: string;
      placeholder: string;
      team?: string;
      generation?: string;
    }[];
    expect(grants).toHaveLength(1);
    expect(grants[0]!.team).toBe('tb');
    const source = redisCredentialSource(s.redis, { ttlMs: 0 });
    const got = await source.fetch([
      {
        name: 'shared',
        placeholder: grants[0]!.placeholder,
        domains: ['api.b.test'],
        header: 'authorization',
        format: 'Bearer {value}',
        team: 'tb',
        ...(grants[0]!.generation ? { generation: grants[0]!.generation } : {}),
      },
    ]);
    expect(got.get('shared')?.value).toBe('B-SECRET');
    // the same grant with team A's name in the cache of the same gateway process: still apart
    const gotA = await source.fetch([
      {
        name: 'shared',
        placeholder: grants[0]!.placeholder,
        domains: ['api.a.test'],
        header: 'authorization',
        format: 'Bearer {value}',
      },
    ]);
    expect(gotA.get('shared')?.value).toBe('A-SECRET');
    // the sandbox itself holds only the placeholder
    const env = await B.exec(id, { cmd: 'printenv', args: ['SHARED'] });
    expect(env.stdout.toString().trim()).toBe(grants[0]!.placeholder);
    expect(env.stdout.toString()).not.toMatch(/SECRET/);
    expect((await B.call('DELETE', `/v1/sandboxes/${id}`)).status).toBe(202);
  });

  it("session tokens carry the team; the router refuses a token whose team is not the sandbox's", async () => {
    const own = await B.token(sbxB, ['files']);
    expect(own.url.startsWith(`http://127.0.0.1:`)).toBe(true);
    const ok = await request(`${own.url}/fs/stat?path=/tmp`, {
      headers: { authorization: `Bearer ${own.token}` },
    });
    expect(ok.statusCode).toBe(200);
    await ok.body.dump();
    // a correctly signed token for A's sandbox and session, but naming team B
    const sessionA = (await s.redis.hget(keys.sandbox(sbxA), 'sessionId')) ?? '';
    const key = await loadSigningKey(join(s.dir, 'key.pem'));
    const forged = await mintSessionToken(key, {
      sandboxId: sbxA,
      sessionId: sessionA,
      team: 'tb',
      scopes: ['files'],
      ttlSec: 60,
    });
    const base = own.url.replace(sbxB, sbxA);
    const res = await request(`${base}/fs/stat?path=/tmp`, {
      headers: { authorization: `Bearer ${forged.token}` },
    });
    const body = (await res.body.json()) as Err;
    expect(res.statusCode).toBe(404);
    expect(body.error.code).toBe('SANDBOX_NOT_FOUND');
    // the same token naming A's team is served (the check is the team, nothing else)
    const right = await mintSessionToken(key, {
      sandboxId: sbxA,
      sessionId: sessionA,
      team: 'default',
      scopes: ['files'],
      ttlSec: 60,
    });
    const served = await request(`${base}/fs/stat?path=/tmp`, {
      headers: { authorization: `Bearer ${right.token}` },
    });
    await served.body.dump();
    expect(served.statusCode).toBe(200);
  });

  it('open streams: a team holds at most its quota, through the router and on the agent directly; a dead lease stops counting', async () => {
    expect((await s.call('PATCH', '/v1/teams/tb', { quotas: { streams: 2 } })).status).toBe(200);
    // the limit travels in the session token: this one is minted under the new quota
    const started = await B.call<{ command: { id: string }; stream: { url: string; token: string } }>(
      'POST',
      `/v1/sandboxes/${sbxB}/commands`,
      { cmd: 'sleep', args: ['60'] },
    );
    expect(started.status).toBe(201);
    const { url, token } = started.body.stream;
    const direct = url.replace(/^https?:\/\/[^/]+/, s.agent.url.replace(/\/$/, ''));
    expect(direct).not.toBe(url);
    const auth = { authorization: `Bearer ${token}` };
    const open: Awaited<ReturnType<typeof request>>[] = [];
    const streamsB = keys.teamStreams('tb');
    try {
      // one through the router, one on the agent directly: both count
      for (const u of [url, direct]) {
        const r = await request(u, { headers: auth });
        expect(r.statusCode).toBe(200);
        open.push(r);
      }
      expect(await s.redis.zcard(streamsB)).toBe(2);
      for (const u of [url, direct]) {
        const refused = await request(u, { headers: auth });
        const body = (await refused.body.json()) as Err;
        expect(refused.statusCode).toBe(429);
        expect(body.error.code).toBe('RATE_LIMITED');
        expect(body.error.details).toMatchObject({ quota: 'streams', limit: 2, current: 2 });
      }
      // another team's streams are its own: A opens one while B is full
      const a = await A.call<{ stream: { url: string; token: string } }>(
        'POST',
        `/v1/sandboxes/${sbxA}/commands`,
        {
          cmd: 'true',
        },
      );
      const ra = await request(a.body.stream.url, {
        headers: { authorization: `Bearer ${a.body.stream.token}` },
      });
      expect(ra.statusCode).toBe(200);
      await ra.body.dump();
      /** Closes the oldest open stream, waits until `left` leases remain, opens one on `u`. */
      const closeOneThenOpen = async (left: number, u: string) => {
        open.shift()?.body.destroy();
        await waitFor('the closed stream to leave the count', async () =>
          (await s.redis.zcard(streamsB)) === left ? true : undefined,
        );
        const r = await request(u, { headers: auth });
        expect(r.statusCode).toBe(200);
        open.push(r);
      };
      // a closed stream frees its place at once
      await closeOneThenOpen(1, url);
      // leases: one a dead agent left behind (expired) does not count, a live one does
      await s.redis.zadd(streamsB, Date.now() - 1000, 'dead-agent-stream');
      await closeOneThenOpen(2, direct);
      expect(await s.redis.zscore(streamsB, 'dead-agent-stream')).toBeNull();
      await s.redis.zadd(streamsB, Date.now() + 60_000, 'live-elsewhere');
      const overLive = await request(url, { headers: auth });
      expect(overLive.statusCode).toBe(429);
      await overLive.body.dump();
    } finally {
      for (const r of open) r.body.destroy();
      await s.redis.zrem(streamsB, 'live-elsewhere');
      await request(url.replace(/events$/, 'signal'), {
        method: 'POST',
        headers: { ...auth, 'content-type': 'application/json' },
        body: JSON.stringify({ signal: 'SIGKILL' }),
      }).then((r) => r.body.dump());
      expect((await s.call('PATCH', '/v1/teams/tb', { quotas: { streams: null } })).status).toBe(200);
    }
    await waitFor('every stream of B to leave the count', async () =>
      (await s.redis.zcard(streamsB)) === 0 ? true : undefined,
    );
  });

  it('usage is per team', async () => {
    await sleep(1100);
    const ub = await B.call<{ groups: { key: string }[] }>('GET', '/v1/usage?groupBy=sandbox');
    expect(ub.status).toBe(200);
    const keysB = ub.body.groups.map((g) => g.key);
    expect(keysB).toContain(sbxB);
    expect(keysB).not.toContain(sbxA);
    const ua = await A.call<{ groups: { key: string }[] }>('GET', '/v1/usage?groupBy=sandbox');
    expect(ua.body.groups.map((g) => g.key)).not.toContain(sbxB);
  });

  it('quotas: a concurrent burst admits exactly the quota and leaves nothing of the refused', async () => {
    expect((await s.call('POST', '/v1/teams', { id: 'tq', quotas: { sandboxes: 3 } })).status).toBe(201);
    const Q = s.as((await makeKey('tq', ['sandboxes:write', 'sandboxes:read'])).secret);
    const instancesBefore = s.instanceIds.size;
    const burst = await Promise.all(
      Array.from({ length: 10 }, () =>
        Q.call<Err & { sandbox: { id: string } }>('POST', '/v1/sandboxes', { template: 'base' }),
      ),
    );
    const admitted = burst.filter((r) => r.status === 202);
    const refused = burst.filter((r) => r.status !== 202);
    expect(admitted).toHaveLength(3);
    expect(refused).toHaveLength(7);
    for (const r of refused) {
      expect(r.status).toBe(403);
      expect(r.body.error.code).toBe('QUOTA_EXCEEDED');
      expect(r.body.error.details).toMatchObject({ quota: 'sandboxes', limit: 3 });
    }
    // nothing leaked: three records of the team, three reserved, three in the rate window
    const list = await Q.call<{ sandboxes: { id: string }[] }>('GET', '/v1/sandboxes');
    expect(list.body.sandboxes).toHaveLength(3);
    let records = 0;
    for (const id of await s.redis.zrange(keys.sandboxIndex(), 0, -1)) {
      if ((await s.redis.hget(keys.sandbox(id), 'team')) === 'tq') records++;
    }
    expect(records).toBe(3);
    expect(await s.redis.hget(keys.teamUsage('tq'), 'sandboxes')).toBe('3');
    expect(await s.redis.zcard(keys.teamCreates('tq'))).toBe(3);
    const team = await Q.call<{ reserved: { sandboxes: number; memoryMiB: number } }>('GET', '/v1/teams/tq');
    expect(team.body.reserved).toMatchObject({ sandboxes: 3, memoryMiB: 3 * 512 });
    // they run; ended, they give their room back, exactly once
    const ops = await Promise.all(
      admitted.map((r) =>
        Q.call<{ state: string }>(
          'GET',
          `/v1/operations/${(r.body as unknown as { operation: { id: string } }).operation.id}?waitMs=60000`,
        ),
      ),
    );
    expect(ops.map((o) => o.body.state)).toEqual(['succeeded', 'succeeded', 'succeeded']);
    expect(s.instanceIds.size - instancesBefore).toBeLessThanOrEqual(3);
    for (const r of admitted) {
      const del = await Q.call<{ operation: { id: string } }>('DELETE', `/v1/sandboxes/${r.body.sandbox.id}`);
      await Q.call('GET', `/v1/operations/${del.body.operation.id}?waitMs=30000`);
    }
    expect(await s.redis.hmget(keys.teamUsage('tq'), 'sandboxes', 'vcpusMilli', 'memoryMiB')).toEqual([
      '0',
      '0',
      '0',
    ]);
    // memory: two of 512 MiB fit 1024, the third is refused with the limit in details
    expect(
      (await s.call('PATCH', '/v1/teams/tq', { quotas: { sandboxes: null, memoryMiB: 1024 } })).status,
    ).toBe(200);
    const mem = await Promise.all(
      Array.from({ length: 3 }, () =>
        Q.call<Err>('POST', '/v1/sandboxes', { template: 'base', memoryMiB: 512 }),
      ),
    );
    expect(mem.filter((r) => r.status === 202)).toHaveLength(2);
    const memRefused = mem.find((r) => r.status !== 202)!;
    expect(memRefused.body.error).toMatchObject({
      code: 'QUOTA_EXCEEDED',
      details: { quota: 'memoryMiB', limit: 1024 },
    });
    // creates per minute: a rate (429) counted over the last 60 s — two were made above already
    expect(
      (await s.call('PATCH', '/v1/teams/tq', { quotas: { memoryMiB: null, createsPerMinute: 7 } })).status,
    ).toBe(200);
    const rate = await Promise.all(
      Array.from({ length: 4 }, () => Q.call<Err>('POST', '/v1/sandboxes', { template: 'base' })),
    );
    expect(rate.filter((r) => r.status === 202)).toHaveLength(2);
    const limited = rate.find((r) => r.status === 429)!;
    expect(limited.body.error).toMatchObject({
      code: 'RATE_LIMITED',
      details: { quota: 'createsPerMinute', limit: 7 },
    });
    for (const id of (
      await Q.call<{ sandboxes: { id: string }[] }>('GET', '/v1/sandboxes?state=creating,running')
    ).body.sandboxes) {
      await Q.call('DELETE', `/v1/sandboxes/${id.id}`);
    }
  });

  it('revocation and rotation take effect on the next request on every API replica', async () => {
    const second: RunningApi = await startApi(
      loadApiConfig({
        SPACE_REDIS_URL: s.redisUrl,
        SPACE_SIGNING_KEY_FILE: join(s.dir, 'key.pem'),
        SPACE_API_PORT: '0',
        SPACE_LOG_LEVEL: 'silent',
      }),
    );
    try {
      const one = s;
      const k = await makeKey('tb', ['sandboxes:read'], 'to-revoke');
      const on = (url: string, key: string) => clientOf(url, key).call<Err>('GET', '/v1/sandboxes');
      expect((await on(second.url, k.secret)).status).toBe(200);
      expect((await on(one.apiUrl, k.secret)).status).toBe(200);
      const seen = await B.call<{ lastUsedAt: string | null }>('GET', `/v1/keys/${k.key.id}`);
      expect(seen.body.lastUsedAt).not.toBeNull();
      expect((await clientOf(second.url, B.apiKey).call('DELETE', `/v1/keys/${k.key.id}`)).status).toBe(200);
      for (const url of [one.apiUrl, second.url]) {
        const r = await on(url, k.secret);
        expect(r.status).toBe(401);
        expect(r.body.error.code).toBe('UNAUTHENTICATED');
      }
      // rotation: both work during the overlap, on both replicas; then only the successor
      const r = await makeKey('tb', ['sandboxes:read'], 'to-rotate');
      const rotated = await clientOf(second.url, B.apiKey).call<Made & { previous: { expiresAt: string } }>(
        'POST',
        `/v1/keys/${r.key.id}/rotate`,
        { overlapSec: 2 },
      );
      expect(rotated.status).toBe(201);
      expect(rotated.body.key.scopes).toEqual(['sandboxes:read']);
      for (const url of [one.apiUrl, second.url]) {
        expect((await on(url, r.secret)).status).toBe(200);
        expect((await on(url, rotated.body.secret)).status).toBe(200);
      }
      await sleep(Date.parse(rotated.body.previous.expiresAt) - Date.now() + 100);
      for (const url of [one.apiUrl, second.url]) {
        const old = await on(url, r.secret);
        expect(old.status).toBe(401);
        expect(old.body.error).toMatchObject({
          code: 'API_KEY_EXPIRED',
          details: { rotatedTo: rotated.body.key.id },
        });
        expect((await on(url, rotated.body.secret)).status).toBe(200);
      }
    } finally {
      await second.close();
    }
  });

  it('a key made before teams keeps working: it joins the default team with every scope', async () => {
    const secret = 'space_legacylegacylegacylegacylegacylegacy1';
    const sha = createHash('sha256').update(secret).digest('hex');
    await s.redis.hset(keys.apiKey(sha), { name: 'old', createdAt: String(Date.now()) });
    const old = s.as(secret);
    const got = await old.call<{ id: string }>('GET', `/v1/sandboxes/${sbxA}`);
    expect(got.status).toBe(200);
    const h = await s.redis.hgetall(keys.apiKey(sha));
    expect(h.team).toBe('default');
    expect(h.scopes?.split(' ').sort()).toEqual([...ALL_SCOPES].sort());
    const listed = await A.call<{ keys: { id: string; name: string }[] }>('GET', '/v1/keys');
    expect(listed.body.keys.find((k) => k.id === h.id)?.name).toBe('old');
    // a sandbox record from before teams belongs to the default team
    await s.redis.hdel(keys.sandbox(sbxA), 'team');
    expect((await A.call('GET', `/v1/sandboxes/${sbxA}`)).status).toBe(200);
    expect((await B.call('GET', `/v1/sandboxes/${sbxA}`)).status).toBe(404);
    await s.redis.hset(keys.sandbox(sbxA), 'team', 'default');
  });

  it('every mutating call is in its team’s audit log (who, what, target, result), and only there', async () => {
    const mark = Date.now();
    const id = await B.createSandbox();
    expect((await B.call('POST', `/v1/sandboxes/${id}/timeout`, { timeoutSec: 120 })).status).toBe(200);
    expect((await B.call('DELETE', `/v1/sandboxes/${id}`)).status).toBe(202);
    expect(
      (await B.call('PUT', '/v1/credentials/audited', { domains: ['x.test'], value: 'audited-value-1234' }))
        .status,
    ).toBe(200);
    expect((await B.call('DELETE', '/v1/credentials/audited')).status).toBe(204);
    const ro = s.as((await makeKey('tb', ['sandboxes:read'])).secret);
    expect((await ro.call('DELETE', `/v1/sandboxes/${sbxB}`)).status).toBe(403);
    const log = await B.call<{
      entries: {
        at: string;
        keyId: string;
        action: string;
        target: string;
        result: string;
        status: number;
        code: string | null;
        team: string;
      }[];
    }>('GET', '/v1/audit?limit=1000');
    expect(log.status).toBe(200);
    const recent = log.body.entries.filter((e) => Date.parse(e.at) >= mark - 1000);
    const find = (action: string, target: string) =>
      recent.find((e) => e.action === action && e.target === target);
    expect(find('POST /v1/sandboxes', id)).toMatchObject({ result: 'ok', status: 202, team: 'tb' });
    expect(find('POST /v1/sandboxes/:id/timeout', id)).toMatchObject({ result: 'ok' });
    expect(find('DELETE /v1/sandboxes/:id', id)).toMatchObject({ result: 'ok', status: 202 });
    expect(find('PUT /v1/credentials/:name', 'audited')).toMatchObject({ result: 'ok' });
    expect(find('DELETE /v1/credentials/:name', 'audited')).toMatchObject({ result: 'ok', status: 204 });
    expect(find('DELETE /v1/sandboxes/:id', sbxB)).toMatchObject({
      result: 'denied',
      status: 403,
      code: 'SCOPE_DENIED',
    });
    // the denied calls of the scope test: one entry per mutating route
    const all = (
      await A.call<{ entries: { action: string; result: string; code: string | null }[] }>(
        'GET',
        '/v1/audit?limit=1000',
      )
    ).body.entries;
    for (const r of routes(':id', ':id').filter((x) => x.method !== 'GET')) {
      const action = `${r.method} ${r.path.replace(/key_a+|nope/, (m) => (m === 'nope' ? ':name' : ':id')).replace('/tb', '/:id')}`;
      expect(
        all.some((e) => e.action === action && e.code === 'SCOPE_DENIED'),
        `a denied ${action} is audited`,
      ).toBe(true);
    }
    // team B's entries are not in team A's log, nor A's in B's
    expect(all.some((e) => (e as { target?: string }).target === id)).toBe(false);
    expect((await B.call<Err>('GET', '/v1/audit?team=default')).body.error.code).toBe('SCOPE_DENIED');
  });
});
