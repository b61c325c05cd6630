/**
 * The E2B routes in process: `buildApp` + `inject` over a real Redis, with the operation worker
 * running against a fake agent client (test-app.ts). The routes call SPACE's use cases and wait on
 * their operations; these follow one sandbox through create, pause, connect and kill, and check
 * that a body the v1 schema refuses is refused here too.
 */
import { afterAll, beforeAll, describe, expect, inject, it, vi } from 'vitest';
import { ensureRunning } from '../../core/lifecycle-requests.ts';
import { keys } from '../../core/redis-keys.ts';
import { startTestApi, type TestApi } from '../test-app.ts';
import { E2B_UNSERVED } from './routes.ts';

let api: TestApi;
beforeAll(async () => {
  api = await startTestApi(inject('redisUrl'), 14, { worker: true });
  await api.addNode({ id: 'n1' });
});
afterAll(() => api.close());

const call = (method: 'GET' | 'POST' | 'DELETE' | 'PUT', url: string, payload?: unknown) =>
  api.app.inject({ method, url, headers: { 'x-api-key': api.key }, ...(payload ? { payload } : {}) });

describe('e2b routes (buildApp + inject, worker on a fake agent)', () => {
  it('creates, pauses, resumes on connect and kills, each answered when done', async () => {
    const created = await call('POST', '/v2/sandboxes', {
      templateID: 'base',
      timeout: 60,
      metadata: { k: 'v' },
    });
    expect(created.statusCode).toBe(201);
    const id = created.json().sandboxID as string;
    expect(created.json().envdAccessToken).toEqual(expect.any(String));
    expect(api.calls.creates.map((c) => c.sandboxId)).toContain(id);
    expect((await api.deps.sandboxes.get(id))?.state).toBe('running');

    expect((await call('POST', `/sandboxes/${id}/pause`)).statusCode).toBe(204);
    expect((await api.deps.sandboxes.get(id))?.state).toBe('paused');
    expect(api.calls.pauses.map((p) => p.sandboxId)).toContain(id);

    const connected = await call('POST', `/sandboxes/${id}/connect`, { timeout: 60 });
    expect(connected.statusCode).toBe(201);
    expect(api.calls.resumes).toContain(id);
    // the same envd token as at create
    expect(connected.json().envdAccessToken).toBe(created.json().envdAccessToken);

    const net = await call('PUT', `/sandboxes/${id}/network`, {
      allowOut: ['example.com'],
      denyOut: ['0.0.0.0/0'],
    });
    expect(net.statusCode).toBe(204);
    expect(api.calls.egress.at(-1)).toMatchObject({
      sandboxId: id,
      egress: { mode: 'allow-list', allow: ['example.com'] },
    });
    // a policy PATCH /v1/…/egress would refuse is refused here too, and nothing reaches the node
    const pushed = api.calls.egress.length;
    const long = await call('PUT', `/sandboxes/${id}/network`, {
      allowOut: [`${'a'.repeat(1025)}.com`],
      denyOut: ['0.0.0.0/0'],
    });
    expect({ status: long.statusCode, message: long.json().message }).toEqual({
      status: 400,
      message: expect.stringMatching(/^body\/allow/),
    });
    expect(api.calls.egress.length).toBe(pushed);

    expect((await call('DELETE', `/sandboxes/${id}`)).statusCode).toBe(204);
    expect((await api.deps.sandboxes.get(id))?.state).toBe('killed');
    expect((await call('GET', `/sandboxes/${id}`)).statusCode).toBe(404);
  });

  it('refuses in E2B terms what SPACE’s v1 schemas and pre-check refuse, writing nothing', async () => {
    const before = await api.redis.zcard(keys.sandboxIndex());
    const cases: [unknown, RegExp][] = [
      [{ templateID: 'base', envVars: { '1BAD': 'x' } }, /body\/env/],
      [{ templateID: 'base', metadata: { k: 'v'.repeat(257) } }, /body\/metadata/],
      [{ templateID: 'Not_A_Template' }, /body\/template/],
      [{ templateID: 'missing' }, /template "missing" not found/],
    ];
    for (const [body, message] of cases) {
      const res = await call('POST', '/v2/sandboxes', body);
      expect({ status: res.statusCode, body: res.json() }, JSON.stringify(body)).toMatchObject({
        status: 400,
        body: { code: 400, message: expect.stringMatching(message) },
      });
    }
    expect(await api.redis.zcard(keys.sandboxIndex())).toBe(before);
  });

  it('an E2B route SPACE does not serve is 501 NOT_IMPLEMENTED and an unknown path 404, whatever the auth', async () => {
    const auths: Record<string, Record<string, string>> = {
      none: {},
      'wrong key': { 'x-api-key': 'e2b_0000' },
      'good key': { 'x-api-key': api.key },
    };
    for (const [method, url] of E2B_UNSERVED) {
      const path = url.replace(/:[A-Za-z]+/g, 'x1').replace('*', 'a/b');
      for (const [who, headers] of Object.entries(auths)) {
        const res = await api.app.inject({ method: method as 'GET', url: path, headers });
        expect([res.statusCode, res.json()], `${method} ${path}, ${who}`).toEqual([
          501,
          { code: 501, message: expect.stringContaining('not served'), spaceCode: 'NOT_IMPLEMENTED' },
        ]);
      }
    }
    for (const url of ['/nope', '/sandboxes/x1/nope', '/v2/sandboxes/x1/nope', '/v9/sandboxes']) {
      for (const [who, headers] of Object.entries(auths)) {
        const res = await api.app.inject({ method: 'POST', url, headers });
        const body =
          who === 'none'
            ? { error: { code: 'NOT_FOUND', message: expect.any(String) } }
            : { code: 404, message: `no route POST ${url}`, spaceCode: 'NOT_FOUND' };
        expect([res.statusCode, res.json()], `${url}, ${who}`).toEqual([404, body]);
      }
      // a SPACE client (Bearer) gets SPACE's envelope
      const bearer = await api.app.inject({
        method: 'GET',
        url,
        headers: { authorization: `Bearer ${api.key}` },
      });
      expect([bearer.statusCode, bearer.json().error.code]).toEqual([404, 'NOT_FOUND']);
    }
    // a served route still needs its key
    expect((await api.app.inject({ method: 'GET', url: '/v2/sandboxes' })).statusCode).toBe(401);
  });

  it("lifecycle onTimeout 'pause': the deadline pauses (reason timeout, metered paused) instead of killing; connect restarts the lifetime", async () => {
    const created = await call('POST', '/v2/sandboxes', {
      templateID: 'base',
      timeout: 1,
      autoPause: true,
      autoResume: { enabled: false },
    });
    expect(created.statusCode).toBe(201);
    const id = created.json().sandboxID as string;
    expect((await call('GET', `/sandboxes/${id}`)).json().lifecycle).toEqual({
      onTimeout: 'pause',
      autoResume: false,
    });
    // the reaper (every 500 ms) finds the deadline and queues a pause; bounded wait
    await vi.waitFor(async () => expect((await api.deps.sandboxes.get(id))?.state).toBe('paused'), {
      timeout: 15_000,
      interval: 100,
    });
    const paused = await api.deps.sandboxes.get(id);
    expect(paused?.pause?.reason).toBe('timeout');
    expect(api.calls.deletes).not.toContain(id);
    expect((await call('GET', `/sandboxes/${id}`)).json().state).toBe('paused');
    // paused time is metered as paused
    await vi.waitFor(
      async () => {
        const usage = await api.app.inject({
          method: 'GET',
          url: `/v1/sandboxes/${id}/usage`,
          headers: { authorization: `Bearer ${api.key}` },
        });
        expect(usage.json().seconds.paused).toBeGreaterThan(0);
      },
      { timeout: 5_000, interval: 100 },
    );
    // autoResume off: traffic (the router's reason) may not resume it; a command through the API may
    await expect(
      ensureRunning(api.deps.redis, id, { timeoutMs: 1_000, reason: 'traffic' }),
    ).rejects.toMatchObject({
      code: 'SANDBOX_PAUSED',
      details: { autoResume: false },
    });
    expect((await api.deps.sandboxes.get(id))?.state).toBe('paused');
    // connect resumes it with a whole new lifetime (not the ~0 s it had left), then it pauses again
    const connected = await call('POST', `/sandboxes/${id}/connect`, { timeout: 60 });
    expect(connected.statusCode).toBe(201);
    const running = await api.deps.sandboxes.get(id);
    expect(running?.state).toBe('running');
    expect(running!.expiresAtMs - Date.now()).toBeGreaterThan(50_000);
    expect((await call('DELETE', `/sandboxes/${id}`)).statusCode).toBe(204);
  }, 30_000);

  it("without lifecycle the deadline kills (onTimeout 'kill' is the default) and traffic resumes a paused sandbox", async () => {
    const created = await call('POST', '/v2/sandboxes', { templateID: 'base', timeout: 1 });
    const id = created.json().sandboxID as string;
    expect((await call('GET', `/sandboxes/${id}`)).json().lifecycle).toEqual({
      onTimeout: 'kill',
      autoResume: true,
    });
    await vi.waitFor(async () => expect((await api.deps.sandboxes.get(id))?.state).toBe('killed'), {
      timeout: 15_000,
      interval: 100,
    });
    expect((await api.deps.sandboxes.get(id))?.killReason).toBe('timeout');
    const other = (await call('POST', '/v2/sandboxes', { templateID: 'base', timeout: 60 })).json()
      .sandboxID as string;
    expect((await call('POST', `/sandboxes/${other}/pause`)).statusCode).toBe(204);
    await ensureRunning(api.deps.redis, other, { timeoutMs: 10_000, reason: 'traffic' });
    expect((await api.deps.sandboxes.get(other))?.state).toBe('running');
    expect((await call('DELETE', `/sandboxes/${other}`)).statusCode).toBe(204);
  });

  it('refuses a filesystem-only pause, resume or lifecycle (memory: false) instead of doing a memory pause', async () => {
    const before = await api.redis.zcard(keys.sandboxIndex());
    const refused: [unknown, number, string][] = [
      [{ templateID: 'base', autoPauseMemory: false }, 400, 'BAD_REQUEST'],
      [{ templateID: 'base', autoPause: true, autoPauseMemory: false }, 501, 'NOT_IMPLEMENTED'],
      [
        { templateID: 'base', autoPause: true, autoPauseMemory: false, autoResume: { enabled: true } },
        400,
        'BAD_REQUEST',
      ],
    ];
    for (const [body, status, code] of refused) {
      const res = await call('POST', '/v2/sandboxes', body);
      expect([res.statusCode, res.json().spaceCode], JSON.stringify(body)).toEqual([status, code]);
    }
    expect(await api.redis.zcard(keys.sandboxIndex())).toBe(before);
    const id = (await call('POST', '/v2/sandboxes', { templateID: 'base', timeout: 60 })).json()
      .sandboxID as string;
    const pauses = api.calls.pauses.length;
    const fsOnly = await call('POST', `/sandboxes/${id}/pause`, { memory: false });
    expect([fsOnly.statusCode, fsOnly.json().spaceCode]).toEqual([501, 'NOT_IMPLEMENTED']);
    expect(fsOnly.json().message).toMatch(/keepMemory: false/);
    expect([(await api.deps.sandboxes.get(id))?.state, api.calls.pauses.length]).toEqual(['running', pauses]);
    expect((await call('POST', `/sandboxes/${id}/pause`, { memory: true })).statusCode).toBe(204);
    const reboot = await call('POST', `/v2/sandboxes/${id}/connect`, { timeout: 60, memory: false });
    expect([reboot.statusCode, reboot.json().spaceCode]).toEqual([501, 'NOT_IMPLEMENTED']);
    expect((await api.deps.sandboxes.get(id))?.state).toBe('paused');
    expect((await call('DELETE', `/sandboxes/${id}`)).statusCode).toBe(204);
  });

  it("SPACE's own create takes onTimeout and autoResume, validated, and shows them", async () => {
    const v1 = (payload: unknown) =>
      api.app.inject({
        method: 'POST',
        url: '/v1/sandboxes?waitMs=10000',
        headers: { authorization: `Bearer ${api.key}` },
        payload: payload as object,
      });
    const made = await v1({ template: 'base', onTimeout: 'pause', autoResume: false });
    expect(made.statusCode).toBe(202);
    // traffic does not resume it, so idleness does not pause it (unless asked)
    expect(made.json().sandbox).toMatchObject({ onTimeout: 'pause', autoResume: false, autoPauseSec: 0 });
    const plain = await v1({ template: 'base' });
    expect(plain.json().sandbox).toMatchObject({ onTimeout: 'kill', autoResume: true });
    expect(plain.json().sandbox.autoPauseSec).toBe(api.deps.config.defaultAutoPauseSec);
    const asked = await v1({ template: 'base', autoResume: false, autoPauseSec: 60 });
    expect(asked.json().sandbox).toMatchObject({ autoResume: false, autoPauseSec: 60 });
    for (const bad of [{ onTimeout: 'sleep' }, { autoResume: 'yes' }]) {
      const res = await v1({ template: 'base', ...bad });
      expect([res.statusCode, res.json().error.code], JSON.stringify(bad)).toEqual([400, 'BAD_REQUEST']);
    }
    for (const s of [made.json().sandbox.id, plain.json().sandbox.id, asked.json().sandbox.id]) {
      await api.app.inject({
        method: 'DELETE',
        url: `/v1/sandboxes/${s}`,
        headers: { authorization: `Bearer ${api.key}` },
      });
    }
  });
});
