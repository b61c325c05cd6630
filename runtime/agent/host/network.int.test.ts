import { execFile, spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { connect, createServer, type Server } from 'node:net';
import { promisify } from 'node:util';
import { afterAll, describe, expect, it } from 'vitest';
import type { SandboxNetwork } from '../drivers/driver.ts';
import { parsePool, SandboxNetworks, shortId, slotAddresses, slotOfHostAddress } from './network.ts';

const run = promisify(execFile);
/** A pool of its own, so this file never touches other tests' or a running agent's sandboxes. */
const POOL = '10.79.0.0/24';
const nets = new SandboxNetworks({ pool: POOL });
const made: SandboxNetwork[] = [];
const cleanups: (() => unknown)[] = [];

afterAll(async () => {
  for (const c of cleanups.reverse()) await Promise.resolve(c()).catch(() => {});
  for (const n of made) await nets.release(n).catch(() => {});
});

async function alloc(id: string): Promise<SandboxNetwork> {
  const n = await nets.allocate(id);
  made.push(n);
  return n;
}

/** Tries a TCP connect from inside `netns`; resolves true when it connected within 1.5 s. */
async function connectFromNs(netns: string, host: string, port: number): Promise<boolean> {
  const code = `const s=require('net').connect(${port},'${host}');s.on('connect',()=>process.exit(0));s.on('error',()=>process.exit(1));setTimeout(()=>process.exit(2),1500);`;
  try {
    await run('ip', ['netns', 'exec', netns, process.execPath, '-e', code]);
    return true;
  } catch {
    return false;
  }
}

function listen(host: string): Promise<{ server: Server; port: number }> {
  return new Promise((resolve, reject) => {
    const server = createServer((s) => {
      s.on('error', () => {}); // a probe that connects and drops at once resets the socket
      s.end('hi\n');
    });
    server.on('error', reject);
    server.listen(0, host, () => {
      const addr = server.address();
      resolve({ server, port: typeof addr === 'object' && addr ? addr.port : 0 });
    });
  });
}

describe('pure helpers', () => {
  it('computes /30 slots', () => {
    const pool = parsePool('10.77.0.0/16');
    expect(pool.slots).toBe(16384);
    expect(slotAddresses(pool, 0)).toEqual({ hostAddress: '10.77.0.1', sandboxAddress: '10.77.0.2' });
    expect(slotAddresses(pool, 65)).toEqual({ hostAddress: '10.77.1.5', sandboxAddress: '10.77.1.6' });
    expect(slotOfHostAddress(pool, '10.77.1.5')).toBe(65);
    expect(slotOfHostAddress(pool, '10.77.1.6')).toBeUndefined();
    expect(slotOfHostAddress(pool, '10.78.0.1')).toBeUndefined();
    expect(`spv${shortId('i-ABCDEF0123456789')}`.length).toBeLessThanOrEqual(15);
  });
});

describe('SandboxNetworks (real netns, veth, nftables)', () => {
  it('allocates 24 networks concurrently with distinct addresses, then releases them', async () => {
    const ids = Array.from({ length: 24 }, (_, i) => `i-conc${i.toString().padStart(2, '0')}x`);
    const got = await Promise.all(ids.map((id) => alloc(id)));
    expect(new Set(got.map((n) => n.sandboxAddress)).size).toBe(24);
    for (const n of got) expect(existsSync(`/var/run/netns/${n.netns}`)).toBe(true);
    await Promise.all(got.map((n) => nets.release(n)));
    for (const n of got) expect(existsSync(`/var/run/netns/${n.netns}`)).toBe(false);
    expect(nets.inUse).toBe(0);
  });

  it('isolates sandboxes from each other and from the host; the host reaches the sandbox', async () => {
    const a = await alloc('i-isoa');
    const b = await alloc('i-isob');
    const { stdout } = await run('ip', ['-n', a.netns, 'route', 'show']);
    // every packet goes to the host end, where nftables decides (no gateway here: nothing passes)
    expect(stdout).toMatch(new RegExp(`default via ${a.hostAddress.replaceAll('.', '\\.')} dev eth0`));

    // Listener in b; a tries to reach it even with a route added through the host end.
    const srv = spawn('ip', [
      'netns',
      'exec',
      b.netns,
      process.execPath,
      '-e',
      `require('net').createServer(s=>{s.on('error',()=>{});s.end('b')}).listen(7777,'${b.sandboxAddress}',()=>console.log('up'))`,
    ]);
    cleanups.push(() => srv.kill('SIGKILL'));
    await new Promise((r) => srv.stdout.once('data', r));
    await run('ip', ['-n', a.netns, 'route', 'add', '10.79.0.0/24', 'via', a.hostAddress]);
    // positive control: the probe does connect where a path is open (b to its own listener), so a
    // false below means the way was shut, not that the probe or the listener failed
    expect(await connectFromNs(b.netns, b.sandboxAddress, 7777)).toBe(true);
    expect(await connectFromNs(a.netns, b.sandboxAddress, 7777)).toBe(false);

    // Host listener on a's host end: a must not reach it.
    const host = await listen(a.hostAddress);
    cleanups.push(() => host.server.close());
    expect(await connectFromNs(a.netns, a.hostAddress, host.port)).toBe(false);
    // Nor a host listener on another host address (b's end) through a's link.
    const hostB = await listen(b.hostAddress);
    cleanups.push(() => hostB.server.close());
    expect(await connectFromNs(a.netns, b.hostAddress, hostB.port)).toBe(false);
    // positive controls: both host listeners answer a client that may reach them (the host itself)
    for (const [addr, port] of [
      [a.hostAddress, host.port],
      [b.hostAddress, hostB.port],
    ] as const)
      expect(
        await new Promise<boolean>((resolve) => {
          const c = connect(port, addr, () => resolve(true) === undefined && c.destroy());
          c.on('error', () => resolve(false));
        }),
      ).toBe(true);

    // Host → sandbox works.
    const reply = await new Promise<string>((resolve, reject) => {
      const s = connect(7777, b.sandboxAddress);
      let data = '';
      s.on('data', (d: Buffer) => (data += d));
      s.on('end', () => resolve(data));
      s.on('error', reject);
    });
    expect(reply).toBe('b');
  });

  it('re-adopts after a restart and sweeps leftovers', async () => {
    const keep = await alloc('i-keepme');
    const stray = await alloc('i-strayy');
    const fresh = new SandboxNetworks({ pool: POOL });
    const adopted = await fresh.adopt();
    expect(adopted.map((n) => n.netns)).toEqual(expect.arrayContaining([keep.netns, stray.netns]));
    expect(adopted.find((n) => n.netns === keep.netns)).toEqual(keep);
    // The fresh object must not hand out an adopted address.
    const next = await fresh.allocate('i-nextone');
    made.push(next);
    expect(adopted.map((n) => n.sandboxAddress)).not.toContain(next.sandboxAddress);
    const removed = await fresh.sweep([keep.netns, next.netns]);
    expect(removed).toContain(stray.netns);
    expect(removed).not.toContain(keep.netns);
    expect(existsSync(`/var/run/netns/${stray.netns}`)).toBe(false);
    expect(existsSync(`/var/run/netns/${keep.netns}`)).toBe(true);
  });

  it('never hands out an address a leftover link still holds (a process killed before it released)', async () => {
    // another pool over the same range, as a process that died with its namespaces in place
    const dead = new SandboxNetworks({ pool: POOL });
    const left = await dead.allocate('i-leftov');
    made.push(left);
    const fresh = new SandboxNetworks({ pool: POOL });
    const got = await Promise.all(['i-fresh1', 'i-fresh2', 'i-fresh3'].map((id) => fresh.allocate(id)));
    made.push(...got);
    expect(got.map((n) => n.hostAddress)).not.toContain(left.hostAddress);
    expect(fresh.inUse).toBeGreaterThan(3);
    // the leftover's slot is freed once the sweep removes its link: only the three kept stay used
    expect(await fresh.sweep(got.map((n) => n.netns))).toContain(left.netns);
    expect(fresh.inUse).toBe(3);
  });
});
