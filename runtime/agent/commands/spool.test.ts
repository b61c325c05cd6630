import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { FRAME_EXIT, FRAME_STDOUT } from '../../core/guest-protocol.ts';
import { encodeFrame, Spool } from './spool.ts';

const out = (s: string) => encodeFrame(FRAME_STDOUT, Buffer.from(s));

async function all(spool: Spool, from = 0) {
  const frames: { type: number; text: string; end: number }[] = [];
  for await (const f of spool.frames(from, { follow: false }))
    frames.push({ type: f.type, text: f.payload.toString(), end: f.end });
  return frames;
}

describe('spool on a full disk', () => {
  let dir: string;
  beforeEach(async () => {
    dir = await mkdtemp(join(tmpdir(), 'space-spool-'));
  });
  afterEach(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it('an append the disk refuses throws NODE_DISK_FULL and later appends are not poisoned', async () => {
    // /dev/full answers every write with ENOSPC: a real full disk, no mock
    const spool = await Spool.open('/dev/full');
    await expect(spool.append(out('a'))).rejects.toMatchObject({ code: 'NODE_DISK_FULL' });
    await expect(spool.append(out('b'))).rejects.toMatchObject({ code: 'NODE_DISK_FULL' });
    expect(spool.size).toBe(0);
    await spool.close();
  });

  it('an exit kept in memory reaches readers after the last frame on disk, with its offset', async () => {
    const spool = await Spool.open(join(dir, 'c.out'));
    await spool.append(out('line'));
    const exit = encodeFrame(FRAME_EXIT, Buffer.from(JSON.stringify({ errorCode: 'NODE_DISK_FULL' })));
    await spool.failWith(exit);
    expect(spool.closed).toBe(true);
    const frames = await all(spool);
    expect(frames.map((f) => f.type)).toEqual([FRAME_STDOUT, FRAME_EXIT]);
    expect(frames[1]!.end).toBe(spool.size);
    expect(JSON.parse(frames[1]!.text)).toEqual({ errorCode: 'NODE_DISK_FULL' });
    // a reader resuming at the end gets the exit again, nothing else
    expect((await all(spool, spool.size)).map((f) => f.type)).toEqual([FRAME_EXIT]);
    await spool.close();
  });
});
