import dnsPacket from 'dns-packet';
import { pino } from 'pino';
import { describe, expect, it } from 'vitest';
import { createAudit } from './audit.ts';
import { answerQuery, type DnsDeps } from './dns-server.ts';
import { normalisePolicy } from './policy.ts';
import { Registry } from './registry.ts';
import type { Resolution, UpstreamResolver } from './resolver.ts';

function setup(answers: Record<string, Resolution>, qps = 100) {
  const asked: string[] = [];
  const resolver: UpstreamResolver = {
    async resolve(name) {
      asked.push(name);
      const r = answers[name];
      if (!r) throw new Error('SERVFAIL');
      return r;
    },
    clear() {},
  };
  const registry = new Registry({ maxConnections: 10, dnsQueriesPerSec: qps });
  registry.put('10.199.0.2', {
    sandboxId: 's1',
    policy: normalisePolicy({
      allow: ['pkg.allowed.test', 'rebind.allowed.test'],
      deny: ['bad.allowed.test'],
    }),
    credentials: [],
  });
  const deps: DnsDeps = {
    registry,
    resolver,
    audit: createAudit(pino({ level: 'silent' })),
    answerTtlSec: 30,
  };
  return { deps, asked };
}

const query = (name: string, type: dnsPacket.RecordType = 'A', id = 7) =>
  dnsPacket.encode({
    type: 'query',
    id,
    flags: dnsPacket.RECURSION_DESIRED,
    questions: [{ type, name, class: 'IN' }],
  });

const decode = (b: Buffer | null) => dnsPacket.decode(b!) as dnsPacket.DecodedPacket & { rcode: string };

describe('answerQuery', () => {
  const allowed = { allowed: ['93.184.216.34'], denied: [], ttlSec: 300, chain: [] };

  it('answers an allowed A query from the upstream, TTL capped', async () => {
    const { deps, asked } = setup({ 'pkg.allowed.test': allowed });
    const r = decode(await answerQuery(deps, '10.199.0.2', query('PKG.allowed.test.')));
    expect(r.rcode).toBe('NOERROR');
    expect(r.id).toBe(7);
    expect(r.answers).toMatchObject([{ type: 'A', data: '93.184.216.34', ttl: 30 }]);
    // the exact deny entry is resolved too: its addresses are denied (E8)
    expect(asked).toEqual(['pkg.allowed.test', 'bad.allowed.test']);
  });

  it("E8: a name resolving to a denied name's address gets no address", async () => {
    const { deps } = setup({
      'pkg.allowed.test': { allowed: ['93.184.216.34', '198.51.100.7'], denied: [], ttlSec: 30, chain: [] },
      'rebind.allowed.test': { allowed: ['198.51.100.7'], denied: [], ttlSec: 30, chain: [] },
      'bad.allowed.test': { allowed: ['198.51.100.7'], denied: [], ttlSec: 30, chain: [] },
    });
    const some = decode(await answerQuery(deps, '10.199.0.2', query('pkg.allowed.test')));
    expect(some.answers).toMatchObject([{ data: '93.184.216.34' }]);
    const none = decode(await answerQuery(deps, '10.199.0.2', query('rebind.allowed.test')));
    expect(none.rcode).toBe('NOERROR');
    expect(none.answers).toEqual([]);
  });

  it('E8: a name whose CNAME chain passes through a denied name gets no address', async () => {
    const { deps } = setup({
      'pkg.allowed.test': {
        allowed: ['93.184.216.34'],
        denied: [],
        ttlSec: 30,
        chain: ['cdn.x.test', 'bad.allowed.test'],
      },
      'bad.allowed.test': { allowed: ['203.0.113.9'], denied: [], ttlSec: 30, chain: [] },
    });
    const r = decode(await answerQuery(deps, '10.199.0.2', query('pkg.allowed.test')));
    expect(r.answers).toEqual([]);
  });

  it('answers AAAA of an allowed name with an empty NOERROR, without asking upstream', async () => {
    const { deps, asked } = setup({});
    const r = decode(await answerQuery(deps, '10.199.0.2', query('pkg.allowed.test', 'AAAA')));
    expect(r.rcode).toBe('NOERROR');
    expect(r.answers).toEqual([]);
    expect(asked).toEqual([]);
  });

  it.each([
    ['a name off the list', 'evil.test', 'A'],
    ['a denied name', 'bad.allowed.test', 'A'],
    ['a tunnelling name', 'mfrggzdfmztwq2lknnwg23tpobyxe43uov3ho6dzpi.exfil.evil.test', 'A'],
    ['TXT of an allowed name', 'pkg.allowed.test', 'TXT'],
    ['an IP literal', '127.0.0.1', 'A'],
  ] as const)('refuses %s without asking upstream (T03)', async (_why, name, type) => {
    const { deps, asked } = setup({ 'pkg.allowed.test': allowed });
    const r = decode(await answerQuery(deps, '10.199.0.2', query(name, type)));
    expect(r.rcode).toBe('REFUSED');
    expect(asked).toEqual([]);
  });

  it('drops queries from unregistered sources', async () => {
    const { deps, asked } = setup({ 'pkg.allowed.test': allowed });
    expect(await answerQuery(deps, '10.199.0.99', query('pkg.allowed.test'))).toBeNull();
    expect(asked).toEqual([]);
  });

  it('answers nothing for a name resolving into the deny set (T04)', async () => {
    const { deps } = setup({
      'rebind.allowed.test': { allowed: [], denied: ['127.0.0.1'], ttlSec: 1, chain: [] },
    });
    const r = decode(await answerQuery(deps, '10.199.0.2', query('rebind.allowed.test')));
    expect(r.rcode).toBe('NOERROR');
    expect(r.answers).toEqual([]);
  });

  it('SERVFAIL when the upstream fails', async () => {
    const { deps } = setup({});
    expect(decode(await answerQuery(deps, '10.199.0.2', query('pkg.allowed.test'))).rcode).toBe('SERVFAIL');
  });

  it('rate-limits per sandbox with REFUSED', async () => {
    const { deps } = setup({ 'pkg.allowed.test': allowed }, 2);
    const codes: string[] = [];
    for (let i = 0; i < 8; i++)
      codes.push(decode(await answerQuery(deps, '10.199.0.2', query('pkg.allowed.test'))).rcode);
    expect(codes.slice(0, 4)).toEqual(['NOERROR', 'NOERROR', 'NOERROR', 'NOERROR']);
    expect(codes.slice(4)).toEqual(['REFUSED', 'REFUSED', 'REFUSED', 'REFUSED']);
  });

  it('answers malformed and over-long names with an error, never throws', async () => {
    const { deps, asked } = setup({});
    // a 300-byte name: 5 labels of 59 bytes, built by hand (encoders refuse it)
    const labels = Buffer.concat(
      [...Array(5)].map(() => Buffer.concat([Buffer.from([59]), Buffer.alloc(59, 0x61)])),
    );
    const head = Buffer.from([0, 9, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0]);
    const long = Buffer.concat([head, labels, Buffer.from([0, 0, 1, 0, 1])]);
    const r = await answerQuery(deps, '10.199.0.2', long);
    expect(r).not.toBeNull();
    expect(r!.readUInt16BE(0)).toBe(9);
    expect(r!.readUInt16BE(2) & 0x8000).toBe(0x8000);
    expect(r!.readUInt16BE(2) & 0xf).not.toBe(0);
    expect(await answerQuery(deps, '10.199.0.2', Buffer.from([1, 2, 3]))).toBeNull();
    for (let i = 0; i < 200; i++) {
      const junk = Buffer.from(query('pkg.allowed.test'));
      junk[12 + (i % (junk.length - 12))] = (i * 37) & 255;
      await answerQuery(deps, '10.199.0.2', junk);
    }
    expect(asked.every((n) => n === 'pkg.allowed.test' || n === 'bad.allowed.test')).toBe(true);
  });
});
