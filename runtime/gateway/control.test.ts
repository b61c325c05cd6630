import { pino } from 'pino';
import { afterAll, describe, expect, it } from 'vitest';
import { createGatewayMetrics } from './audit.ts';
import { buildControlApp, MAX_BATCH_REGISTRATIONS } from './control.ts';
import { Registry } from './registry.ts';

/** A control app over `registry` (default a new one), logging to `log` (default nowhere). */
const controlApp = (registry: Registry = newRegistry(), log = pino({ level: 'silent' })) =>
  buildControlApp({ registry, metrics: createGatewayMetrics(), log });
function newRegistry(): Registry {
  return new Registry({ maxConnections: 10, dnsQueriesPerSec: 10 });
}

const registry = newRegistry();
const app = await controlApp(registry);
afterAll(() => app.close());

const grant = {
  name: 'gh',
  placeholder: 'space_ph_abcdefghijklmnopqrstuvwxyz234567',
  domains: ['API.github.test'],
  header: 'Authorization',
  format: 'Bearer {value}',
  value: 'real-secret-value',
};

describe('control API', () => {
  it('registers, replaces, lists (without secrets) and deletes', async () => {
    let res = await app.inject({
      method: 'PUT',
      url: '/v1/sandboxes/10.199.0.2',
      payload: { sandboxId: 's1', policy: { allow: ['PyPI.org.'] }, credentials: [grant] },
    });
    expect(res.statusCode).toBe(200);
    expect(res.json()).toEqual({
      address: '10.199.0.2',
      sandboxId: 's1',
      replaced: false,
      changed: true,
      closed: 0,
      registryId: registry.id,
    });
    expect(registry.lookup('10.199.0.2')?.policy.allow).toEqual(['pypi.org']);
    expect(registry.lookup('10.199.0.2')?.credentials[0]?.domains).toEqual(['api.github.test']);

    res = await app.inject({
      method: 'PUT',
      url: '/v1/sandboxes/10.199.0.2',
      payload: { sandboxId: 's1', policy: {} },
    });
    expect(res.json()).toMatchObject({ replaced: true, changed: true });
    const changedAt = registry.lookup('10.199.0.2')!.updatedAt;
    // the same again (an agent older than `registryId` does this every pass): nothing changes
    res = await app.inject({
      method: 'PUT',
      url: '/v1/sandboxes/10.199.0.2',
      payload: { sandboxId: 's1', policy: {} },
    });
    expect(res.json()).toMatchObject({ replaced: true, changed: false, closed: 0 });
    expect(registry.lookup('10.199.0.2')!.updatedAt).toBe(changedAt);

    res = await app.inject({ method: 'GET', url: '/v1/sandboxes' });
    expect(res.json().sandboxes).toHaveLength(1);
    expect(res.body).not.toContain('real-secret-value');

    expect((await app.inject({ method: 'DELETE', url: '/v1/sandboxes/10.199.0.2' })).statusCode).toBe(204);
    const gone = await app.inject({ method: 'DELETE', url: '/v1/sandboxes/10.199.0.2' });
    expect(gone.statusCode).toBe(404);
    expect(gone.json().error.code).toBe('SANDBOX_NOT_FOUND');
  });

  it.each([
    ['a bad address', '/v1/sandboxes/not-an-ip', { sandboxId: 's1', policy: {} }],
    [
      'an IP-literal allow entry',
      '/v1/sandboxes/10.199.0.2',
      { sandboxId: 's1', policy: { allow: ['1.2.3.4'] } },
    ],
    ['an unknown mode', '/v1/sandboxes/10.199.0.2', { sandboxId: 's1', policy: { mode: 'open' } }],
    ['no sandbox id', '/v1/sandboxes/10.199.0.2', { policy: {} }],
    [
      'a grant without {value}',
      '/v1/sandboxes/10.199.0.2',
      { sandboxId: 's1', policy: {}, credentials: [{ ...grant, format: 'Bearer' }] },
    ],
  ])('refuses %s with BAD_REQUEST (and never echoes a secret)', async (_why, url, payload) => {
    const res = await app.inject({ method: 'PUT', url, payload });
    expect(res.statusCode).toBe(400);
    expect(res.json().error.code).toBe('BAD_REQUEST');
    expect(res.body).not.toContain('real-secret-value');
  });

  it("names its registry in /healthz and every registration's answer; a restart has another", async () => {
    const health = await app.inject({ method: 'GET', url: '/healthz' });
    expect(health.json()).toEqual({ ok: true, registryId: registry.id });
    expect(registry.id).toMatch(/^[0-9a-f-]{36}$/);
    const put = await app.inject({
      method: 'PUT',
      url: '/v1/sandboxes/10.199.0.9',
      payload: { sandboxId: 's9', policy: {} },
    });
    expect(put.json().registryId).toBe(registry.id);
    // a restarted gateway's registry (in memory only) holds nothing and answers another id
    const restarted = newRegistry();
    const app2 = await controlApp(restarted);
    try {
      expect((await app2.inject({ method: 'GET', url: '/healthz' })).json().registryId).toBe(restarted.id);
      expect(restarted.id).not.toBe(registry.id);
    } finally {
      await app2.close();
    }
    await app.inject({ method: 'DELETE', url: '/v1/sandboxes/10.199.0.9' });
  });

  it('registers many in one call, in order; an entry refused on its own leaves the others', async () => {
    const res = await app.inject({
      method: 'PUT',
      url: '/v1/sandboxes',
      payload: {
        registrations: [
          { address: '10.199.1.2', sandboxId: 'b1', policy: { allow: ['PyPI.org.'] }, credentials: [grant] },
          { address: 'not-an-ip', sandboxId: 'b2', policy: {} },
          { address: '10.199.1.4', sandboxId: 'b3', policy: { allow: ['1.2.3.4'] } },
          { address: '10.199.1.5', sandboxId: 'b4', policy: { mode: 'deny-all' } },
          { address: '10.199.1.2', sandboxId: 'b1', policy: { allow: ['pypi.org'] }, credentials: [grant] },
        ],
      },
    });
    expect(res.statusCode).toBe(200);
    const body = res.json();
    expect(body.registryId).toBe(registry.id);
    expect(body.results).toHaveLength(5);
    expect(body.results[0]).toEqual({
      address: '10.199.1.2',
      sandboxId: 'b1',
      replaced: false,
      changed: true,
      closed: 0,
    });
    expect(body.results[1]).toMatchObject({ address: 'not-an-ip', error: { code: 'BAD_REQUEST' } });
    expect(body.results[2]).toMatchObject({ address: '10.199.1.4', error: { code: 'BAD_REQUEST' } });
    expect(body.results[3]).toMatchObject({ address: '10.199.1.5', sandboxId: 'b4', replaced: false });
    // the same registration again, later in the same batch: applied in order, so it changes nothing
    expect(body.results[4]).toMatchObject({ replaced: true, changed: false });
    expect(registry.lookup('10.199.1.2')?.policy.allow).toEqual(['pypi.org']);
    expect(registry.lookup('10.199.1.4')).toBeUndefined();
    expect(registry.lookup('10.199.1.5')?.policy.mode).toBe('deny-all');
    expect(res.body).not.toContain('real-secret-value');
    for (const a of ['10.199.1.2', '10.199.1.5']) {
      expect((await app.inject({ method: 'DELETE', url: `/v1/sandboxes/${a}` })).statusCode).toBe(204);
    }
  });

  it('answers an entry that fails inside the gateway as INTERNAL; the batch still lands', async () => {
    class Failing extends Registry {
      override put(address: string, input: Parameters<Registry['put']>[1]) {
        if (input.sandboxId === 'boom') throw new Error('registry failed');
        return super.put(address, input);
      }
    }
    const failing = new Failing({ maxConnections: 10, dnsQueriesPerSec: 10 });
    const app2 = await controlApp(failing);
    try {
      const res = await app2.inject({
        method: 'PUT',
        url: '/v1/sandboxes',
        payload: {
          registrations: [
            { address: '10.199.1.7', sandboxId: 'boom', policy: {} },
            { address: '10.199.1.8', sandboxId: 'fine', policy: {} },
          ],
        },
      });
      expect(res.statusCode).toBe(200);
      expect(res.json().results[0]).toMatchObject({ address: '10.199.1.7', error: { code: 'INTERNAL' } });
      expect(res.json().results[1]).toMatchObject({ address: '10.199.1.8', sandboxId: 'fine' });
      expect(res.body).not.toContain('registry failed');
      expect(failing.lookup('10.199.1.8')?.sandboxId).toBe('fine');
    } finally {
      await app2.close();
    }
  });

  it.each([
    ['an empty batch', { registrations: [] }],
    ['an entry without a sandbox id', { registrations: [{ address: '10.199.1.6', policy: {} }] }],
    [
      'an unknown policy mode',
      { registrations: [{ address: '10.199.1.6', sandboxId: 'x', policy: { mode: 'open' } }] },
    ],
    [
      'more entries than allowed',
      {
        registrations: Array.from({ length: MAX_BATCH_REGISTRATIONS + 1 }, (_, i) => ({
          address: `10.199.2.${i % 250}`,
          sandboxId: `s${i}`,
          policy: {},
        })),
      },
    ],
  ])('refuses a batch with %s whole (400), registering none of it', async (_why, payload) => {
    const before = registry.list().length;
    const res = await app.inject({ method: 'PUT', url: '/v1/sandboxes', payload });
    expect(res.statusCode).toBe(400);
    expect(res.json().error.code).toBe('BAD_REQUEST');
    expect(registry.list()).toHaveLength(before);
  });

  it('serves Prometheus metrics', async () => {
    const res = await app.inject({ method: 'GET', url: '/metrics' });
    expect(res.statusCode).toBe(200);
    expect(res.body).toContain('space_gateway_decisions_total');
  });
});

describe('control API logging', () => {
  it('logs a registration that changed something, not the watchdog repeating it', async () => {
    const lines: { level: number; msg: string }[] = [];
    const sink = { write: (s: string) => void lines.push(JSON.parse(s)) };
    const quiet = await controlApp(newRegistry(), pino({ level: 'info' }, sink));
    const put = (policy: object) =>
      quiet.inject({ method: 'PUT', url: '/v1/sandboxes/10.199.0.3', payload: { sandboxId: 's3', policy } });
    for (const policy of [{}, {}, {}, { allow: ['pypi.org'] }, { allow: ['pypi.org'] }]) {
      expect((await put(policy)).statusCode).toBe(200);
    }
    expect(lines.map((l) => l.msg)).toEqual(['sandbox registered', 'sandbox policy replaced']);
    await quiet.close();
  });
});
