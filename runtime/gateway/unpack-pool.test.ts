import { gzipSync } from 'node:zlib';
import { afterEach, describe, expect, it } from 'vitest';
import { needlesFor } from './reflection.ts';
import { UnpackPool } from './unpack-pool.ts';

const VALUE = 'sk-live-0123456789abcdef0123';
const needles = needlesFor([VALUE]);
const MiB = 1024 * 1024;
let pool: UnpackPool | undefined;
afterEach(async () => {
  await pool?.close();
  pool = undefined;
});

describe('UnpackPool (E17: packed bodies are unpacked in workers, bounded in size and time)', () => {
  it('masks in a worker: the same answers as maskPackedBody', async () => {
    pool = new UnpackPool({ workers: 1, timeoutMs: 5000, maxUnpackedBytes: MiB });
    const r = await pool.mask('a', Buffer.concat([gzipSync('x'), Buffer.from(`\0${VALUE}`)]), needles);
    expect(r.ok && r.body.toString('latin1')).toContain(`\0${'*'.repeat(VALUE.length)}`);
    expect(await pool.mask('a', gzipSync(Buffer.alloc(2 * MiB)), needles)).toEqual({
      ok: false,
      problem: 'too-large',
    });
    expect(
      await pool.mask('a', Buffer.concat([gzipSync('x'), Buffer.from([0]), gzipSync('y')]), needles),
    ).toEqual({ ok: false, problem: 'undecodable' });
  });

  it('a body past the time limit is refused; its worker is replaced and the next body is served', async () => {
    pool = new UnpackPool({ workers: 1, timeoutMs: 20, maxUnpackedBytes: 512 * MiB });
    const bomb = gzipSync(Buffer.alloc(256 * MiB));
    expect(await pool.mask('a', bomb, needles)).toEqual({ ok: false, problem: 'timeout' });
    const r = await pool.mask('a', gzipSync('fine'), needles);
    expect(r.ok).toBe(true);
  });

  it("the event loop keeps running while a worker unpacks (another sandbox's traffic is not held)", async () => {
    pool = new UnpackPool({ workers: 1, timeoutMs: 30_000, maxUnpackedBytes: 200 * MiB });
    const bomb = gzipSync(Buffer.alloc(100 * MiB));
    let ticks = 0;
    const timer = setInterval(() => ticks++, 5);
    const t0 = performance.now();
    const r = await pool.mask('a', bomb, needles);
    const ms = performance.now() - t0;
    clearInterval(timer);
    console.log(`100 MiB bomb in a worker: ${ms.toFixed(0)} ms, ${ticks} timer ticks of 5 ms meanwhile`);
    expect(r.ok).toBe(true);
    // on the event loop (the old path) no timer could fire until the whole body was done
    expect(ticks).toBeGreaterThan(0);
  });

  it('takes queued bodies round-robin across sandboxes', async () => {
    pool = new UnpackPool({ workers: 1, timeoutMs: 5000, maxUnpackedBytes: MiB });
    const order: string[] = [];
    const job = (key: string, n: number) =>
      pool!.mask(key, gzipSync(`${key}${n}`), needles).then(() => order.push(`${key}${n}`));
    await Promise.all([job('a', 1), job('a', 2), job('a', 3), job('b', 1), job('b', 2)]);
    expect(order).toEqual(['a1', 'b1', 'a2', 'b2', 'a3']);
  });

  it('close() answers queued bodies `closed`', async () => {
    pool = new UnpackPool({ workers: 1, timeoutMs: 5000, maxUnpackedBytes: MiB });
    const pending = [pool.mask('a', gzipSync('1'), needles), pool.mask('a', gzipSync('2'), needles)];
    await pool.close();
    expect(await Promise.all(pending)).toEqual([
      { ok: false, problem: 'closed' },
      { ok: false, problem: 'closed' },
    ]);
    expect(await pool.mask('a', gzipSync('3'), needles)).toEqual({ ok: false, problem: 'closed' });
  });
});
