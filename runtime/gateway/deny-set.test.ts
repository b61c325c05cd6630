import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { interfaceCidrs, LiveDenySet, splitCidrList } from './deny-set.ts';

const dirs: string[] = [];
afterAll(async () => {
  for (const d of dirs) await rm(d, { recursive: true, force: true });
});

describe('LiveDenySet (E7)', () => {
  it("denies the node's interface addresses, public ones included, and config node CIDRs", () => {
    const set = new LiveDenySet({
      configured: ['10.0.0.0/8'],
      nodeCidrs: ['100.200.0.0/16'],
      nodeCidrsFile: '',
      refreshMs: 1000,
      interfaces: () => ['203.0.114.7/32', '2001:db8::7/128'],
    });
    expect(set.deniedBy('203.0.114.7')).toBe('node:203.0.114.7/32');
    expect(set.deniedBy('203.0.114.8')).toBeUndefined();
    expect(set.deniedBy('2001:db8::7')).toBe('node:2001:db8::7/128');
    expect(set.deniedBy('::ffff:203.0.114.7')).toMatch(/^node:203\.0\.114\.7\/32/);
    expect(set.deniedBy('100.200.3.4')).toBe('node:100.200.0.0/16');
    expect(set.deniedBy('10.1.2.3')).toBe('10.0.0.0/8');
    expect(set.deniedBy('127.0.0.1')).toBe('127.0.0.0/8'); // always denied
  });

  it('keeps current: a new interface address and the node CIDRs file land at the next refresh', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'denyset-'));
    dirs.push(dir);
    const file = join(dir, 'node-cidrs');
    await writeFile(file, '# load balancers\n198.19.255.1/32, 192.88.99.0/24\n');
    let addrs = ['203.0.114.7/32'];
    const set = new LiveDenySet({
      configured: [],
      nodeCidrs: [],
      nodeCidrsFile: file,
      refreshMs: 60_000,
      interfaces: () => addrs,
    });
    await set.refresh();
    expect(set.deniedBy('192.88.99.20')).toBe('node:192.88.99.0/24');
    addrs = ['203.0.114.7/32', '203.0.114.99/32'];
    expect(set.deniedBy('203.0.114.99')).toBeUndefined();
    await set.refresh();
    expect(set.deniedBy('203.0.114.99')).toBe('node:203.0.114.99/32');
    // a broken file keeps what was read before: a refresh never drops entries by accident
    await writeFile(file, 'not-a-cidr\n');
    await set.refresh();
    expect(set.deniedBy('192.88.99.20')).toBe('node:192.88.99.0/24');
  });

  it('reads the real interfaces (loopback at least) and splits lists', () => {
    expect(interfaceCidrs()).toContain('127.0.0.1/32');
    expect(splitCidrList('a/1, b/2\nc/3 # x\n\n')).toEqual(['a/1', 'b/2', 'c/3']);
  });
});
