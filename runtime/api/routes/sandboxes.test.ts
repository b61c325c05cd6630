/**
 * The sandbox and command routes in process: `buildApp` + `inject` over a real Redis with a fake
 * agent client (test-app.ts). Each route parses, calls its use case and renders; these check the
 * answers, the records the use cases leave and the dispatches they make.
 */
import { afterAll, beforeAll, beforeEach, describe, expect, inject, it } from 'vitest';
import { buildVersion } from '../../core/build-version.ts';
import { ERROR_CODES, type ErrorCode } from '../../core/errors.ts';
import { keys, VERSION_TAG } from '../../core/redis-keys.ts';
import { startTestApi, type TestApi } from '../test-app.ts';

let api: TestApi;
beforeAll(async () => {
  api = await startTestApi(inject('redisUrl'), 12);
});
afterAll(() => api.close());
beforeEach(async () => {
  await api.redis.del(keys.nodeIndex());
  await api.addNode({ id: 'n1' });
});

const auth = () => ({ authorization: `Bearer ${api.key}` });
const call = (method: 'GET' | 'POST' | 'DELETE' | 'PATCH', url: string, payload?: unknown, headers = {}) =>
  api.app.inject({ method, url, headers: { ...auth(), ...headers }, ...(payload ? { payload } : {}) });

describe('health', () => {
  it('/healthz names the build that answers (how a version bump is seen reaching each API)', async () => {
    const res = await api.app.inject({ method: 'GET', url: '/healthz' });
    expect(res.json()).toEqual({ ok: true, version: buildVersion() });
    expect(buildVersion()).toMatch(VERSION_TAG);
  });
});

describe('sandbox routes (buildApp + inject)', () => {
  it('create answers 202 with the creating sandbox and its pending operation, both written', async () => {
    const res = await call('POST', '/v1/sandboxes', { template: 'base', metadata: { a: '1' } });
    expect(res.statusCode).toBe(202);
    const out = res.json();
    expect(out.sandbox).toMatchObject({ template: 'base', state: 'creating', vcpus: 1, memoryMiB: 512 });
    expect(out.operation).toMatchObject({ kind: 'sandbox.create', target: out.sandbox.id, state: 'pending' });
    const got = await call('GET', `/v1/sandboxes/${out.sandbox.id}`);
    expect(got.json()).toMatchObject({ id: out.sandbox.id, metadata: { a: '1' } });
    const list = await call('GET', '/v1/sandboxes?metadata=a%3D1');
    expect(list.json().sandboxes.map((s: { id: string }) => s.id)).toContain(out.sandbox.id);
  });

  it('ports: public by default; `ports.public: false` gets a traffic token; the router’s port token stays in the record', async () => {
    const pub = (await call('POST', '/v1/sandboxes', { template: 'base' })).json().sandbox;
    expect(pub.ports).toEqual({ public: true, trafficToken: null });
    const priv = (await call('POST', '/v1/sandboxes', { template: 'base', ports: { public: false } })).json()
      .sandbox;
    expect(priv.ports.public).toBe(false);
    expect(priv.ports.trafficToken).toMatch(/^[0-9a-f]{48}$/);
    expect((await call('GET', `/v1/sandboxes/${priv.id}`)).json().ports).toEqual(priv.ports);
    const [portToken, trafficToken] = await api.redis.hmget(
      keys.sandbox(priv.id),
      'portToken',
      'trafficToken',
    );
    expect(trafficToken).toBe(priv.ports.trafficToken);
    expect(portToken).toMatch(/^ey/);
    expect(JSON.stringify(priv)).not.toContain(portToken);
    const bad = await call('POST', '/v1/sandboxes', { template: 'base', ports: { public: 'no' } });
    expect(bad.statusCode).toBe(400);
  });

  it('usage: a sandbox nothing was metered for yet is not found; the team report answers', async () => {
    const id = (await call('POST', '/v1/sandboxes', { template: 'base' })).json().sandbox.id;
    const one = await call('GET', `/v1/sandboxes/${id}/usage`);
    expect({ status: one.statusCode, code: one.json().error.code }).toEqual({
      status: 404,
      code: 'SANDBOX_NOT_FOUND',
    });
    const report = await call('GET', '/v1/usage?groupBy=template');
    expect(report.statusCode).toBe(200);
    expect(report.json()).toMatchObject({ groupBy: 'template', resolutionSec: 60 });
  });

  it('refuses what no node could hold before writing anything, each with its code', async () => {
    await api.addNode({ id: 'n1', vcpus: 2, memoryMiB: 2048, driver: 'firecracker' });
    const cases: [unknown, ErrorCode][] = [
      [{ template: 'nope' }, 'TEMPLATE_NOT_FOUND'],
      [{ template: 'base', memoryMiB: 4096 }, 'SHAPE_TOO_LARGE'],
      [{ template: 'base', vcpus: 0.5 }, 'SHAPE_UNSUPPORTED'],
      [{ template: 'base', timeoutSec: 10 ** 8 }, 'BAD_REQUEST'],
      [{ template: 'base', credentials: ['missing'] }, 'CREDENTIAL_NOT_FOUND'],
    ];
    const before = await api.redis.zcard(keys.sandboxIndex());
    for (const [body, code] of cases) {
      const status = ERROR_CODES[code].status;
      const res = await call('POST', '/v1/sandboxes', body);
      expect({ status: res.statusCode, code: res.json().error.code }, JSON.stringify(body)).toEqual({
        status,
        code,
      });
    }
    expect(await api.redis.zcard(keys.sandboxIndex())).toBe(before);
  });

  it('a create no node has room for now is refused at POST: 503 NODE_CAPACITY_EXHAUSTED with Retry-After, nothing written', async () => {
    await api.redis.hset(keys.node('n1'), 'usedVcpusMilli', '4000');
    const before = await api.redis.zcard(keys.sandboxIndex());
    const res = await call('POST', '/v1/sandboxes', { template: 'base' });
    expect({
      status: res.statusCode,
      code: res.json().error.code,
      retryAfter: res.headers['retry-after'],
    }).toEqual({ status: 503, code: 'NODE_CAPACITY_EXHAUSTED', retryAfter: '2' });
    expect(await api.redis.zcard(keys.sandboxIndex())).toBe(before);
  });

  it('an Idempotency-Key answers a retry, and concurrent retries, with the first sandbox; another body is a conflict', async () => {
    const h = { 'idempotency-key': `k-${Date.now()}` };
    const body = { template: 'base', metadata: { run: 'idem' } };
    const answers = await Promise.all(
      Array.from({ length: 6 }, () => call('POST', '/v1/sandboxes', body, h)),
    );
    const ids = new Set(answers.map((r) => r.json().sandbox.id as string));
    const ops = new Set(answers.map((r) => r.json().operation.id as string));
    expect(answers.map((r) => r.statusCode)).toEqual(Array(6).fill(202));
    expect(ids.size).toBe(1);
    expect(ops.size).toBe(1);
    const listed = await call('GET', '/v1/sandboxes?metadata=run%3Didem');
    expect(listed.json().sandboxes).toHaveLength(1);
    // the same body with its keys in another order is the same body
    const again = await call('POST', '/v1/sandboxes', { metadata: { run: 'idem' }, template: 'base' }, h);
    expect(again.json().sandbox.id).toBe([...ids][0]);
    const other = await call('POST', '/v1/sandboxes', { template: 'base', vcpus: 2 }, h);
    expect(other.statusCode).toBe(ERROR_CODES.IDEMPOTENCY_CONFLICT.status);
    expect(other.json().error.code).toBe('IDEMPOTENCY_CONFLICT');
  });

  it('a create refused by a quota leaves its Idempotency-Key free for a body that fits', async () => {
    const held = (await api.deps.sandboxes.reserved('default')).memoryMiB;
    await api.deps.teams.setQuotas('default', { memoryMiB: held + 1024 });
    const h = { 'idempotency-key': `q-${Date.now()}` };
    try {
      const refused = await call('POST', '/v1/sandboxes', { template: 'base', memoryMiB: 2048 }, h);
      expect(refused.json().error.code).toBe('QUOTA_EXCEEDED');
      const fits = await call('POST', '/v1/sandboxes', { template: 'base', memoryMiB: 256 }, h);
      expect(fits.statusCode).toBe(202);
    } finally {
      await api.deps.teams.setQuotas('default', { memoryMiB: null });
    }
  });

  it('delete answers with one operation however often it is asked; pause of a creating sandbox is refused', async () => {
    const id = (await call('POST', '/v1/sandboxes', { template: 'base' })).json().sandbox.id;
    const paused = await call('POST', `/v1/sandboxes/${id}/pause`);
    expect(paused.statusCode).toBe(409);
    expect(paused.json().error.code).toBe('SANDBOX_NOT_RUNNING');
    const first = await call('DELETE', `/v1/sandboxes/${id}`);
    const second = await call('DELETE', `/v1/sandboxes/${id}`);
    expect(first.statusCode).toBe(202);
    expect(first.json().operation).toMatchObject({ kind: 'sandbox.delete', target: id });
    expect(second.json().operation.id).toBe(first.json().operation.id);
    expect((await call('DELETE', '/v1/sandboxes/sbx_aaaaaaaaaaaaaaaaaaaa')).statusCode).toBe(404);
  });

  it('a command on a running sandbox is dispatched to its node and answered with a stream grant', async () => {
    const id = (await call('POST', '/v1/sandboxes', { template: 'base' })).json().sandbox.id;
    const notYet = await call('POST', `/v1/sandboxes/${id}/commands`, { cmd: 'true' });
    expect(notYet.json().error.code).toBe('SANDBOX_NOT_RUNNING');
    await api.redis.hset(keys.sandbox(id), { state: 'running', nodeId: 'n1' });
    const res = await call('POST', `/v1/sandboxes/${id}/commands`, { cmd: 'echo', args: ['hi'] });
    expect(res.statusCode).toBe(201);
    const out = res.json();
    expect(out.command).toMatchObject({ sandboxId: id, pid: 4242 });
    expect(out.stream.url).toBe(
      `http://n1.invalid:8081/v1/sandboxes/${id}/commands/${out.command.id}/events`,
    );
    expect(api.calls.commands.at(-1)).toMatchObject({ sandboxId: id, req: { cmd: 'echo', args: ['hi'] } });
    const both = await call('POST', `/v1/sandboxes/${id}/commands`, { cmd: 'x', args: ['y'], shell: true });
    expect(both.json().error.code).toBe('BAD_REQUEST');
    const token = await call('POST', `/v1/sandboxes/${id}/tokens`, { scopes: ['files'] });
    expect(token.statusCode).toBe(201);
    expect(token.json().url).toBe(`http://n1.invalid:8081/v1/sandboxes/${id}`);
    const egress = await call('PATCH', `/v1/sandboxes/${id}/egress`, {
      mode: 'allow-list',
      allow: ['example.com'],
    });
    expect(egress.statusCode).toBe(200);
    expect(api.calls.egress.at(-1)).toMatchObject({ sandboxId: id, egress: { allow: ['example.com'] } });
  });
});
