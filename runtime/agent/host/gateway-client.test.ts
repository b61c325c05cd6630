import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import type { FastifyInstance } from 'fastify';
import { pino } from 'pino';
import { afterEach, describe, expect, it } from 'vitest';
import { normalisePolicy } from '../../core/egress.ts';
import { SpaceError } from '../../core/errors.ts';
import { createGatewayMetrics } from '../../gateway/audit.ts';
import { buildControlApp } from '../../gateway/control.ts';
import { Registry } from '../../gateway/registry.ts';
import { GatewayClient } from './gateway-client.ts';

/** A real gateway control app on a Unix socket, and what reached it. */
interface Gateway {
  registry: Registry;
  client: GatewayClient;
  /** Sizes of the batches `PUT /v1/sandboxes` took (or refused), in order. */
  batches: number[];
  /** Addresses registered through the single route, in order. */
  singles: string[];
}

const open: { app: FastifyInstance; client: GatewayClient; dir: string }[] = [];
afterEach(async () => {
  for (const o of open.splice(0)) {
    await o.client.close();
    await o.app.close();
    await rm(o.dir, { recursive: true, force: true });
  }
});

/**
 * Starts the control app. `older`: it answers the batch route as a gateway from before it did
 * (404 NOT_FOUND, as for any unknown route). `holdFirstBatchMs`: the first batch is answered that
 * much later, so registrations can arrive while it is in flight.
 */
async function gateway(
  o: { older?: boolean; holdFirstBatchMs?: number; withoutRegistryId?: boolean } = {},
): Promise<Gateway> {
  const dir = await mkdtemp(join(tmpdir(), 'space-gwc-'));
  const socketPath = join(dir, 'control.sock');
  const gw = await controlApp(socketPath, o);
  const client = new GatewayClient(socketPath);
  open.push({ app: gw.app, client, dir });
  return { ...gw, client };
}

/** The control app of {@link gateway}, listening on `socketPath`. */
async function controlApp(
  socketPath: string,
  o: { older?: boolean; holdFirstBatchMs?: number; withoutRegistryId?: boolean },
): Promise<Omit<Gateway, 'client'> & { app: FastifyInstance }> {
  const registry = new Registry({ maxConnections: 10, dnsQueriesPerSec: 10 });
  const app = await buildControlApp({
    registry,
    metrics: createGatewayMetrics(),
    log: pino({ level: 'silent' }),
  });
  const batches: number[] = [];
  const singles: string[] = [];
  app.addHook('preValidation', async (req, reply) => {
    if (req.method !== 'PUT') return;
    if (req.url === '/v1/sandboxes') {
      batches.push((req.body as { registrations: unknown[] }).registrations.length);
      if (o.older) {
        return reply.status(404).send(new SpaceError('NOT_FOUND', `no route PUT ${req.url}`).toBody());
      }
      if (batches.length === 1 && o.holdFirstBatchMs) await sleep(o.holdFirstBatchMs);
    } else singles.push(req.url.split('/').pop()!);
  });
  if (o.withoutRegistryId) {
    // a gateway from before registry ids: its answers carry none
    app.addHook('onSend', async (_req, _reply, payload) =>
      typeof payload === 'string' && payload.startsWith('{')
        ? JSON.stringify({ ...JSON.parse(payload), registryId: undefined })
        : payload,
    );
  }
  await app.listen({ path: socketPath });
  return { app, registry, batches, singles };
}

/** `fn`'s first answer in up to 20 tries 50 ms apart; the last error after that. */
async function firstAnswer<T>(fn: () => Promise<T>): Promise<T> {
  for (let i = 1; ; i++) {
    try {
      return await fn();
    } catch (err) {
      if (i === 20) throw err;
      await sleep(50);
    }
  }
}

const reg = (sandboxId: string, allow: string[] = []) => ({
  sandboxId,
  policy: normalisePolicy({ allow }),
  credentials: [],
});

describe('GatewayClient registrations', () => {
  it('sends a burst as one batch; each caller gets the registry that took it', async () => {
    const gw = await gateway();
    const answers = await Promise.all(
      Array.from({ length: 20 }, (_, i) =>
        gw.client.register(`10.199.3.${i + 2}`, reg(`s${i}`, ['pypi.org'])),
      ),
    );
    expect(gw.batches).toEqual([20]);
    expect(gw.singles).toEqual([]);
    expect(answers.every((a) => a.registryId === gw.registry.id)).toBe(true);
    expect(
      gw.registry
        .list()
        .map((r) => r.sandboxId)
        .sort(),
    ).toEqual(Array.from({ length: 20 }, (_, i) => `s${i}`).sort());
    expect(gw.registry.lookup('10.199.3.7')?.policy.allow).toEqual(['pypi.org']);
  });

  it('sends a lone registration through the single route', async () => {
    const gw = await gateway();
    expect((await gw.client.register('10.199.3.2', reg('s1'))).registryId).toBe(gw.registry.id);
    expect(gw.batches).toEqual([]);
    expect(gw.singles).toEqual(['10.199.3.2']);
  });

  it('sends what came while a batch was in flight as the next batch, in order', async () => {
    const gw = await gateway({ holdFirstBatchMs: 100 });
    const first = [2, 3, 4].map((n) => gw.client.register(`10.199.3.${n}`, reg(`a${n}`)));
    await sleep(30); // the first batch is at the gateway now
    // the same address again, after its first registration: the later policy is the one held
    const later = [5, 6, 7, 8].map((n) => gw.client.register(`10.199.3.${n}`, reg(`b${n}`)));
    later.push(gw.client.register('10.199.3.2', reg('a2', ['pypi.org'])));
    await Promise.all([...first, ...later]);
    expect(gw.batches).toEqual([3, 5]);
    expect(gw.registry.lookup('10.199.3.2')?.policy.allow).toEqual(['pypi.org']);
    expect(gw.registry.list()).toHaveLength(7);
  });

  it('fails only the registrations the gateway refuses, whether per entry or by schema', async () => {
    const gw = await gateway();
    const results = await Promise.allSettled([
      gw.client.register('10.199.3.2', reg('ok1')),
      gw.client.register('not-an-ip', reg('bad-address')),
      gw.client.register('10.199.3.4', reg('ok2')),
    ]);
    expect(results.map((r) => r.status)).toEqual(['fulfilled', 'rejected', 'fulfilled']);
    expect(((results[1] as PromiseRejectedResult).reason as SpaceError).code).toBe('BAD_REQUEST');
    expect(gw.batches).toEqual([3]);

    // an entry the batch's schema refuses (an empty sandbox id) makes the gateway refuse the whole
    // batch: the client sends each alone, so only that one fails
    // (an address twice: sent one after the other, so the later registration is the one held)
    const again = await Promise.allSettled([
      gw.client.register('10.199.3.5', reg('ok3')),
      gw.client.register('10.199.3.6', reg('')),
      gw.client.register('10.199.3.7', reg('ok4')),
      gw.client.register('10.199.3.5', reg('ok3', ['pypi.org'])),
    ]);
    expect(again.map((r) => r.status)).toEqual(['fulfilled', 'rejected', 'fulfilled', 'fulfilled']);
    expect(((again[1] as PromiseRejectedResult).reason as SpaceError).code).toBe('BAD_REQUEST');
    expect(gw.batches).toEqual([3, 4]);
    expect(gw.singles.sort()).toEqual(['10.199.3.5', '10.199.3.5', '10.199.3.6', '10.199.3.7']);
    expect(gw.registry.lookup('10.199.3.5')?.policy.allow).toEqual(['pypi.org']);
    expect(
      gw.registry
        .list()
        .map((r) => r.sandboxId)
        .sort(),
    ).toEqual(['ok1', 'ok2', 'ok3', 'ok4']);
  });

  it('registers one by one with a gateway older than the batch route, and stops asking it', async () => {
    const gw = await gateway({ older: true });
    for (const burst of [0, 1]) {
      const answers = await Promise.all(
        [2, 3, 4].map((n) => gw.client.register(`10.199.${4 + burst}.${n}`, reg(`s${burst}-${n}`))),
      );
      expect(answers.every((a) => a.registryId === gw.registry.id)).toBe(true);
    }
    expect(gw.batches).toEqual([3]); // asked once
    expect(gw.singles).toHaveLength(6);
    expect(gw.registry.list()).toHaveLength(6);
  });

  it('tries batches again once the gateway restarts after refusing them (an upgrade)', async () => {
    const old = await gateway({ older: true });
    const burst = (gw: { client: GatewayClient }, third: number) =>
      Promise.all([2, 3, 4].map((n) => gw.client.register(`10.199.${third}.${n}`, reg(`s${third}-${n}`))));
    await burst(old, 4);
    expect(old.batches).toEqual([3]);
    // the same socket, now a gateway with the batch route and a new registry
    await open[0]!.app.close();
    const upgraded = await controlApp(old.client.socketPath, {});
    open.push({ app: upgraded.app, client: old.client, dir: '' });
    // as the watchdog reads it, pass after pass: the first read may meet the closed connection
    expect(await firstAnswer(() => old.client.registryId())).toBe(upgraded.registry.id);
    await burst(old, 5);
    expect(upgraded.batches).toEqual([3]);
    expect(upgraded.singles).toEqual([]);
    // a gateway that refuses them again (restarted into the older one): one refusal, then singles
    await open[1]!.app.close();
    const older = await controlApp(old.client.socketPath, { older: true });
    open.push({ app: older.app, client: old.client, dir: '' });
    expect(await firstAnswer(() => old.client.registryId())).toBe(older.registry.id);
    await burst(old, 6);
    await burst(old, 7);
    expect(older.batches).toEqual([3]);
    expect(older.singles).toHaveLength(6);
  });

  it('tries batches again after an upgrade from a gateway without registry ids', async () => {
    const gw = await gateway({ older: true, withoutRegistryId: true });
    const burst = (third: number) =>
      Promise.all([2, 3, 4].map((n) => gw.client.register(`10.199.${third}.${n}`, reg(`s${third}-${n}`))));
    expect((await burst(4)).map((a) => a.registryId)).toEqual([undefined, undefined, undefined]);
    await burst(5);
    expect(gw.batches).toEqual([3]);
    await open[0]!.app.close();
    const upgraded = await controlApp(gw.client.socketPath, {});
    open.push({ app: upgraded.app, client: gw.client, dir: '' });
    expect(await firstAnswer(() => gw.client.registryId())).toBe(upgraded.registry.id);
    await burst(6);
    expect(upgraded.batches).toEqual([3]);
  });

  it('fails every registration of a burst with DRIVER_FAILED when the gateway is gone', async () => {
    const gw = await gateway();
    await open[0]!.app.close();
    const results = await Promise.allSettled(
      [2, 3].map((n) => gw.client.register(`10.199.3.${n}`, reg(`s${n}`))),
    );
    for (const r of results) {
      expect(r.status).toBe('rejected');
      expect(((r as PromiseRejectedResult).reason as SpaceError).code).toBe('DRIVER_FAILED');
    }
  });
});
