import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { interfaceCidrs, LiveDenySet, localRouteCidrs, routeCidrs, splitCidrList } from './deny-set.ts';

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

describe('LiveDenySet: the local routing table (E14)', () => {
  const base = { configured: ['10.0.0.0/8'], nodeCidrs: [], nodeCidrsFile: '', refreshMs: 60_000 };

  it('turns `ip -j route show table local` entries into CIDRs, default and bare addresses included', () => {
    expect(
      routeCidrs(
        [
          { type: 'local', dst: '198.51.100.0/24' },
          { type: 'broadcast', dst: '203.0.113.255' },
          { type: 'local', dst: 'default' },
          { type: 'local' },
        ],
        4,
      ),
    ).toEqual(['198.51.100.0/24', '203.0.113.255/32', '0.0.0.0/0']);
    expect(routeCidrs([{ type: 'anycast', dst: '2001:db8::' }], 6)).toEqual(['2001:db8::/128']);
  });

  it('denies every address a local route covers (AnyIP ranges, broadcast), leaves out what config covers', async () => {
    let routes = ['192.88.99.0/28', '203.0.114.255/32', '10.77.0.1/32'];
    const set = new LiveDenySet({ ...base, interfaces: () => [], localRoutes: async () => routes });
    await set.refresh();
    expect(set.deniedBy('192.88.99.9')).toBe('node:192.88.99.0/28');
    expect(set.deniedBy('192.88.99.16')).toBeUndefined();
    expect(set.deniedBy('203.0.114.255')).toBe('node:203.0.114.255/32');
    expect(set.deniedBy('10.77.0.1')).toBe('10.0.0.0/8');
    expect(set.nodeEntries()).toEqual(['192.88.99.0/28', '203.0.114.255/32']);
    routes = ['203.0.114.255/32'];
    await set.refresh();
    expect(set.deniedBy('192.88.99.9')).toBeUndefined(); // a route removed is an address given back
  });

  it('a table that cannot be read keeps the routes read before; one never read stops the start', async () => {
    let fail = false;
    const set = new LiveDenySet({
      ...base,
      interfaces: () => [],
      localRoutes: async () => {
        if (fail) throw new Error('ip: not found');
        return ['192.88.99.0/28'];
      },
    });
    await set.refresh();
    fail = true;
    await set.refresh();
    expect(set.deniedBy('192.88.99.1')).toBe('node:192.88.99.0/28');
    const never = new LiveDenySet({
      ...base,
      interfaces: () => [],
      localRoutes: async () => {
        throw new Error('ip: not found');
      },
      watch: () => () => {},
    });
    await expect(never.start()).rejects.toThrow(/cannot read the node's local routing table/);
  });

  it('reads again at each route change it is told of, once per burst, before the periodic refresh', async () => {
    let reads = 0;
    let routes: string[] = [];
    let changed: () => void = () => {};
    let unwatched = false;
    const set = new LiveDenySet({
      ...base,
      interfaces: () => [],
      localRoutes: async () => {
        reads++;
        await new Promise((r) => setTimeout(r, 20));
        return routes;
      },
      watch: (f) => {
        changed = f;
        return () => {
          unwatched = true;
        };
      },
    });
    await set.start();
    expect(reads).toBe(1);
    routes = ['192.88.99.0/28'];
    for (let i = 0; i < 5; i++) changed();
    for (let i = 0; i < 50 && set.deniedBy('192.88.99.1') === undefined; i++)
      await new Promise((r) => setTimeout(r, 10));
    expect(set.deniedBy('192.88.99.1')).toBe('node:192.88.99.0/28');
    await new Promise((r) => setTimeout(r, 60));
    expect(reads).toBe(3); // the one under way when the burst came, and one more for the rest
    set.stop();
    expect(unwatched).toBe(true);
  });

  it("reads the real kernel's local table (loopback's range and its broadcast address at least)", async () => {
    const got = await localRouteCidrs();
    expect(got).toContain('127.0.0.0/8');
    expect(got).toContain('127.255.255.255/32');
  });
});
