import { once } from 'node:events';
import { connect, createServer, type Socket } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { guardSockets, type LimitReason, TokenBucket } from './limits.ts';

const open: Socket[] = [];
afterEach(() => {
  for (const s of open.splice(0)) s.destroy();
});

/** A connected pair: [client side, server side]. */
async function pair(): Promise<[Socket, Socket]> {
  const server = createServer();
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const accepted = once(server, 'connection') as Promise<[Socket]>;
  const c = connect((server.address() as { port: number }).port, '127.0.0.1');
  const [s] = await accepted;
  server.close();
  open.push(c, s);
  return [c, s];
}

describe('guardSockets', () => {
  it('fires byte-limit once when the total read crosses the cap', async () => {
    const [c, s] = await pair();
    const reasons: LimitReason[] = [];
    const guard = guardSockets({ idleTimeoutMs: 10_000, maxConnectionBytes: 1000 }, (r) => reasons.push(r));
    guard.add(s);
    s.resume();
    c.write(Buffer.alloc(600));
    await once(s, 'data');
    expect(reasons).toEqual([]);
    c.write(Buffer.alloc(600));
    c.write(Buffer.alloc(600));
    await new Promise((r) => setTimeout(r, 100));
    expect(reasons).toEqual(['byte-limit']);
    expect(guard.bytes()).toBe(1800);
  });

  it('fires idle-timeout when neither side moves', async () => {
    const [, s] = await pair();
    const reasons: LimitReason[] = [];
    guardSockets({ idleTimeoutMs: 150, maxConnectionBytes: 1000 }, (r) => reasons.push(r)).add(s);
    await new Promise((r) => setTimeout(r, 400));
    expect(reasons).toEqual(['idle-timeout']);
  });
});

describe('TokenBucket', () => {
  it('refills at its rate up to its burst', () => {
    let now = 0;
    const b = new TokenBucket(10, 3, () => now);
    expect([b.take(), b.take(), b.take(), b.take()]).toEqual([true, true, true, false]);
    now += 100;
    expect([b.take(), b.take()]).toEqual([true, false]);
    now += 10_000;
    expect([b.take(), b.take(), b.take(), b.take()]).toEqual([true, true, true, false]);
  });
});
