/**
 * The NodeBalancer stand-in, for real on loopback: leastconn placement, a backend out of rotation
 * after its failed health checks and back after a passing one, a refused connection counted as a
 * failed check, and no backend in rotation → the connection is closed.
 */
import { once } from 'node:events';
import { createServer, type Server } from 'node:http';
import { type AddressInfo, connect } from 'node:net';
import { request } from 'undici';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { freeLoopbackPort } from '../../runtime/cli/up-host.ts';
import { type Backend, balance, type Forwarder, type HealthCheck } from './load-balancer.ts';

const open: { close(): unknown }[] = [];
afterEach(async () => {
  for (const x of open.splice(0)) await x.close();
});

/** An HTTP backend that names itself and answers /readyz with `ready`'s status; closed after the test. */
async function backend(name: string) {
  const state = { ready: 200 };
  const server: Server = createServer((req, res) => {
    if (req.url === '/readyz') res.writeHead(state.ready).end();
    // /hold keeps the connection open (keep-alive); anything else closes it
    else
      res
        .writeHead(200, {
          'content-length': name.length,
          ...(req.url === '/hold' ? {} : { connection: 'close' }),
        })
        .end(name);
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const port = (server.address() as AddressInfo).port;
  open.push({ close: () => server.close() });
  return { name, state, server, address: { host: '127.0.0.1', port } };
}

async function lb(backends: Backend[], health?: HealthCheck) {
  const port = await freeLoopbackPort();
  const f: Forwarder = await balance('127.0.0.1', port, backends, health);
  open.push(f);
  return { f, url: `http://127.0.0.1:${port}/` };
}

/** Which backend answers a fresh connection through `url`, or the error's code. */
async function who(url: string): Promise<string> {
  try {
    const res = await request(url, { reset: true, headersTimeout: 2000 });
    return await res.body.text();
  } catch (err) {
    return (err as { code?: string }).code ?? 'error';
  }
}

const FAST = { path: '/readyz', intervalSec: 0.05, timeoutSec: 0.5, attempts: 2 };

describe('the load balancer stand-in', () => {
  it('sends a new connection to the backend with the fewest open ones', async () => {
    const a = await backend('a');
    const b = await backend('b');
    const { url } = await lb([a.address, b.address]);
    // a connection held open on whichever backend took it: the next ones go to the other
    const held = connect(Number(new URL(url).port), '127.0.0.1');
    held.write('GET /hold HTTP/1.1\r\nhost: x\r\n\r\n');
    const [reply] = (await once(held, 'data')) as [Buffer];
    const heldBy = /\r\n\r\n(\w+)$/.exec(reply.toString())?.[1];
    expect(['a', 'b']).toContain(heldBy);
    const other = heldBy === 'a' ? 'b' : 'a';
    expect([await who(url), await who(url), await who(url)]).toEqual([other, other, other]);
    held.destroy();
  });

  it('takes a backend out after its failed checks, brings it back after a passing one', async () => {
    const a = await backend('a');
    const b = await backend('b');
    const { f, url } = await lb([a.address, b.address], FAST);
    b.state.ready = 503;
    await vi.waitFor(() => expect(f.inRotation()).toEqual([`127.0.0.1:${a.address.port}`]));
    for (let i = 0; i < 6; i++) expect(await who(url)).toBe('a');
    b.state.ready = 200;
    await vi.waitFor(() => expect(f.inRotation()).toHaveLength(2));
  });

  it('a backend that refuses connections leaves the rotation; with none left a connection is closed', async () => {
    const a = await backend('a');
    const b = await backend('b');
    const { f, url } = await lb([a.address, b.address], { ...FAST, intervalSec: 60 });
    b.server.close();
    b.server.closeAllConnections();
    // only passive checks can see it here (the next active check is a minute away)
    const seen: string[] = [];
    for (let i = 0; i < 8; i++) seen.push(await who(url));
    expect(f.inRotation()).toEqual([`127.0.0.1:${a.address.port}`]);
    expect(seen.slice(-3)).toEqual(['a', 'a', 'a']);
    a.server.close();
    a.server.closeAllConnections();
    for (let i = 0; i < 3; i++) await who(url);
    expect(f.inRotation()).toEqual([]);
    expect(await who(url)).not.toBe('a');
  });

  it('without a health check every backend stays in rotation', async () => {
    const a = await backend('a');
    const { f, url } = await lb([a.address]);
    expect(await who(url)).toBe('a');
    expect(f.inRotation()).toEqual([`127.0.0.1:${a.address.port}`]);
  });

  it('refuses to start with no backend', async () => {
    await expect(balance('127.0.0.1', await freeLoopbackPort(), [])).rejects.toThrow(/no backends/);
  });
});
