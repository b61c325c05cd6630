import { once } from 'node:events';
import { createServer, type IncomingMessage, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Readable } from 'node:stream';
import { afterEach, describe, expect, it } from 'vitest';
import { SpaceError } from '../core/errors.ts';
import { FILE_METADATA_HEADER, GUEST_PROTOCOL_VERSION } from '../core/guest-protocol.ts';
import { GuestClient } from './guest-client.ts';

/**
 * A loopback server speaking the two guest routes these tests use (POST /init, GET /health), in
 * the guest's JSON shapes (core/guest-protocol.ts): it records the order requests arrive in and
 * answers /init when the test releases it, with `initStatus`.
 */
async function guestStandIn(initStatus: number) {
  const seen: string[] = [];
  let release: () => void = () => {};
  const released = new Promise<void>((r) => (release = r));
  const server: Server = createServer(async (req: IncomingMessage, res) => {
    for await (const _ of req); // drain the body
    seen.push(`${req.method} ${req.url}`);
    if (req.url === '/init') {
      await released;
      res.writeHead(initStatus, { 'content-type': 'application/json' });
      res.end(initStatus < 400 ? '' : JSON.stringify({ error: { code: 'BAD_REQUEST', message: 'bad env' } }));
      return;
    }
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ ok: true }));
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const { port } = server.address() as AddressInfo;
  const client = new GuestClient({ host: '127.0.0.1', port, token: 't' });
  return { seen, release, server, client };
}

const open: { server: Server; client: GuestClient }[] = [];
afterEach(async () => {
  for (const o of open.splice(0)) {
    await o.client.close();
    o.server.close();
  }
});

describe('guest client: env sent in the background', () => {
  it('holds every later call until the guest answered the init', async () => {
    const g = await guestStandIn(204);
    open.push(g);
    const init = g.client.initInBackground({ A: '1' });
    const health = g.client.health();
    await new Promise((r) => setTimeout(r, 100));
    // the health call has not reached the guest while the init is unanswered
    expect(g.seen).toEqual(['POST /init']);
    g.release();
    await init;
    await health;
    expect(g.seen).toEqual(['POST /init', 'GET /health']);
    await g.client.settled();
  });

  it('fails every later call with GUEST_UNAVAILABLE naming why when the guest refused it', async () => {
    const g = await guestStandIn(400);
    open.push(g);
    const init = g.client.initInBackground({ A: '1' });
    const health = g.client.health();
    g.release();
    await expect(init).rejects.toMatchObject({ code: 'BAD_REQUEST' });
    for (const call of [() => health, () => g.client.health()]) {
      const err = await call().then(
        () => null,
        (e: unknown) => e,
      );
      expect(err).toBeInstanceOf(SpaceError);
      expect(err).toMatchObject({ code: 'GUEST_UNAVAILABLE' });
      expect((err as Error).message).toMatch(/did not take the sandbox's settings: bad env/);
    }
    // nothing after the init reached the guest
    expect(g.seen).toEqual(['POST /init']);
    await g.client.settled(); // resolves whatever the outcome
  });
});

describe('guest client: host-side steps held behind the create', () => {
  const deferred = () => {
    let resolve: () => void = () => {};
    let reject: (e: unknown) => void = () => {};
    const p = new Promise<void>((res, rej) => {
      resolve = res;
      reject = rej;
    });
    return { p, resolve, reject };
  };

  it('holds calls until every held step is done, whichever order they end in', async () => {
    const g = await guestStandIn(204);
    open.push(g);
    g.release();
    const a = deferred();
    const b = deferred();
    g.client.holdUntil(a.p, (e) => new SpaceError('GUEST_UNAVAILABLE', String(e)));
    g.client.holdUntil(b.p, (e) => new SpaceError('GUEST_UNAVAILABLE', String(e)));
    const health = g.client.health();
    b.resolve();
    await new Promise((r) => setTimeout(r, 50));
    expect(g.seen).toEqual([]); // step a is still pending
    a.resolve();
    await health;
    expect(g.seen).toEqual(['GET /health']);
  });

  it('fails held and later calls with the failed step’s error, and never reaches the guest', async () => {
    const g = await guestStandIn(204);
    open.push(g);
    g.release();
    const step = deferred();
    g.client.holdUntil(
      step.p,
      (e) => new SpaceError('GUEST_UNAVAILABLE', `egress not in force: ${(e as Error).message}`),
    );
    const held = g.client.health();
    step.reject(new Error('gateway down'));
    for (const call of [() => held, () => g.client.health()]) {
      await expect(call()).rejects.toMatchObject({
        code: 'GUEST_UNAVAILABLE',
        message: 'egress not in force: gateway down',
      });
    }
    expect(g.seen).toEqual([]);
    await g.client.settled();
  });
});

describe('guest client: protocol versions (a sandbox made before an upgrade)', () => {
  /** A guest daemon of protocol `version`: answers /health, accepts uploads, records the rest. */
  async function guestOfVersion(version: string) {
    const seen: string[] = [];
    const server: Server = createServer(async (req, res) => {
      for await (const _ of req);
      const meta = req.headers[FILE_METADATA_HEADER];
      seen.push(`${req.method} ${req.url?.split('?')[0]}${meta ? ` ${meta}` : ''}`);
      res.writeHead(200, { 'content-type': 'application/json' });
      if (req.url === '/health') res.end(JSON.stringify({ ok: true, version, uptimeMs: 1 }));
      else res.end(JSON.stringify({ name: 'f', path: '/f', type: 'file', size: 1, mode: 420, mtimeMs: 0 }));
    });
    server.listen(0, '127.0.0.1');
    await once(server, 'listening');
    const { port } = server.address() as AddressInfo;
    const g = { seen, server, client: new GuestClient({ host: '127.0.0.1', port, token: 't' }) };
    open.push(g);
    return g;
  }
  const body = () => Readable.from([Buffer.from('x')]);

  it('refuses metadata and watch entries on protocol 1 before reaching the guest', async () => {
    const g = await guestOfVersion('1');
    await expect(g.client.writeFile('/f', body(), { metadata: { k: 'v' } })).rejects.toMatchObject({
      code: 'BAD_REQUEST',
      message: /guest daemon speaks protocol 1; file metadata needs 2/,
    });
    await expect(g.client.watch('/d', { recursive: false, entries: true })).rejects.toMatchObject({
      code: 'BAD_REQUEST',
    });
    // without them: as before, and the version was asked once
    await g.client.writeFile('/f', body(), { metadata: {} });
    await g.client.writeFile('/f', body());
    expect(g.seen).toEqual(['GET /health', 'PUT /files', 'PUT /files']);
  });

  it('sends metadata to a guest of the current protocol', async () => {
    const g = await guestOfVersion(String(GUEST_PROTOCOL_VERSION));
    await g.client.writeFile('/f', body(), { metadata: { k: 'v' } });
    expect(g.seen).toEqual(['GET /health', 'PUT /files {"k":"v"}']);
  });
});
