/**
 * E13: every clear-text ClientHello of a spliced connection names the server the gateway decided
 * on. Unit cases for {@link HandshakeWatch} on hand-built records, then the TLS proxy end to end on
 * 127.0.0.1: a real TLS 1.3 HelloRetryRequest (an OpenSSL server offering P-256 only to a client
 * whose first key share is X25519) still completes; a far-side server that answers
 * HelloRetryRequest and logs every hello it reads never reads one naming another server.
 */
import { once } from 'node:events';
import net from 'node:net';
import tls from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { caFromPem, generateCaPem } from './ca.ts';
import { HandshakeWatch } from './splice-watch.ts';
import { listenOnLoopback, rawExchange, startTestProxy } from './test-proxy.ts';

const u16 = (n: number) => Buffer.from([n >> 8, n & 255]);
const u24 = (n: number) => Buffer.from([n >> 16, (n >> 8) & 255, n & 255]);

/** A TLS 1.3-style ClientHello handshake message (type, length, body) naming `sni` (null: none). */
function helloMessage(sni: string | null): Buffer {
  const ext = (type: number, data: Buffer) => Buffer.concat([u16(type), u16(data.length), data]);
  const exts: Buffer[] = [];
  if (sni !== null) {
    const name = Buffer.from(sni);
    const entry = Buffer.concat([Buffer.from([0]), u16(name.length), name]);
    exts.push(ext(0, Buffer.concat([u16(entry.length), entry])));
  }
  exts.push(ext(0x2b, Buffer.from([2, 3, 4]))); // supported_versions: TLS 1.3
  exts.push(ext(0x0a, Buffer.from([0, 2, 0, 0x17]))); // supported_groups: secp256r1
  exts.push(ext(0x33, Buffer.from([0, 0]))); // key_share: none (asks for a HelloRetryRequest)
  const extensions = Buffer.concat(exts);
  const body = Buffer.concat([
    Buffer.from([3, 3]),
    Buffer.alloc(32, 7),
    Buffer.from([0]),
    u16(2),
    Buffer.from([0x13, 0x01]),
    Buffer.from([1, 0]),
    u16(extensions.length),
    extensions,
  ]);
  return Buffer.concat([Buffer.from([1]), u24(body.length), body]);
}
const record = (type: number, payload: Buffer) =>
  Buffer.concat([Buffer.from([type, 3, 3]), u16(payload.length), payload]);
const hello = (sni: string | null) => record(22, helloMessage(sni));
const CCS = record(20, Buffer.from([1]));
const HRR_RANDOM = Buffer.from('cf21ad74e59a6111be1d8c021e65b891c2a211167abb8c5e079e09e2c8a8339c', 'hex');
/** A ServerHello record; `retry` makes it a HelloRetryRequest (RFC 8446 §4.1.3). */
function serverHello(retry: boolean): Buffer {
  const body = Buffer.concat([
    Buffer.from([3, 3]),
    retry ? HRR_RANDOM : Buffer.alloc(32, 9),
    Buffer.from([0, 0x13, 0x01, 0]),
    u16(6),
    Buffer.from([0, 0x2b, 0, 2, 3, 4]),
  ]);
  return record(22, Buffer.concat([Buffer.from([2]), u24(body.length), body]));
}

describe('HandshakeWatch', () => {
  const watch = () => new HandshakeWatch('allowed.test', 16_384);

  it('lets a HelloRetryRequest and a second hello naming the same server through (any case, CCS first)', () => {
    const w = watch();
    expect(w.fromServer(serverHello(true))).toBeNull();
    expect(w.fromClient(Buffer.concat([CCS, hello('Allowed.Test.')]))).toBeNull();
    expect(w.fromServer(serverHello(false))).toBeNull();
    expect(w.done).toBe(true);
    expect(w.fromClient(hello('forbidden.test'))).toBeNull(); // encrypted from here on: not read
  });

  it.each([
    ['names another server', [hello('forbidden.test')], 'sni-changed'],
    ['names none', [hello(null)], 'sni-changed'],
    ['arrives a byte at a time', [...hello('forbidden.test')].map((b) => Buffer.from([b])), 'sni-changed'],
    [
      'is split across two records',
      (() => {
        const m = helloMessage('forbidden.test');
        return [Buffer.concat([record(22, m.subarray(0, 20)), record(22, m.subarray(20))])];
      })(),
      'sni-changed',
    ],
    ['is a third one', [hello('allowed.test'), hello('allowed.test')], 'malformed-handshake'],
    ['is not a hello', [record(22, Buffer.from([11, 0, 0, 0]))], 'malformed-handshake'],
    ['is not a TLS record', [Buffer.from('GET / HTTP/1.1\r\n\r\n')], 'malformed-handshake'],
  ])('a later hello that %s ends the connection', (_what, chunks, problem) => {
    const w = watch();
    w.fromServer(serverHello(true));
    const answers = chunks.map((c) => w.fromClient(c));
    expect(answers.at(-1)).toBe(problem);
  });

  it('checks a hello sent before the server answered (pipelined), and a second retry request', () => {
    expect(watch().fromClient(hello('forbidden.test'))).toBe('sni-changed');
    const w = watch();
    expect(w.fromServer(serverHello(true))).toBeNull();
    expect(w.fromServer(serverHello(true))).toBe('malformed-handshake');
  });
});

// ---------- end to end through the TLS proxy ----------

let proxyPort = 0;
let realPort = 0;
let fakePort = 0;
const closers: (() => void)[] = [];
/** SNI of every ClientHello the fake upstream read (null: none). */
const fakeSaw: (string | null)[] = [];
let upstreamPort = 0;

beforeAll(async () => {
  // the proxy dials one upstream port; a tiny TCP switch in front picks the server under test
  const pem = await generateCaPem();
  const ca = caFromPem(pem.certPem, pem.keyPem);
  const leaf = await ca.leafFor('allowed.test');
  const real = tls.createServer(
    { cert: leaf.certPem, key: leaf.keyPem, ecdhCurve: 'P-256', minVersion: 'TLSv1.3' },
    (s) => {
      s.end('real served');
    },
  );
  realPort = await listenOnLoopback(real);
  // the fake upstream: answers the first hello with a HelloRetryRequest, logs every hello it reads
  const fake = net.createServer((s) => {
    s.on('error', () => {});
    let buf = Buffer.alloc(0);
    let n = 0;
    s.on('data', (d: Buffer) => {
      buf = Buffer.concat([buf, d]);
      while (buf.length >= 5 && buf.length >= 5 + buf.readUInt16BE(3)) {
        const type = buf[0];
        const payload = buf.subarray(5, 5 + buf.readUInt16BE(3));
        buf = buf.subarray(5 + payload.length);
        if (type !== 22 || payload[0] !== 1) continue;
        const m = /[a-z.]+\.test/i.exec(payload.toString('latin1'));
        fakeSaw.push(m ? m[0] : null);
        if (++n === 1) s.write(serverHello(true));
        else s.end(Buffer.concat([serverHello(false), Buffer.from(`served ${m ? m[0] : '(default)'}`)]));
      }
    });
  });
  fakePort = await listenOnLoopback(fake);
  let target = realPort;
  const sw = net.createServer((c) => {
    const up = net.connect(target, '127.0.0.1');
    c.pipe(up).pipe(c);
    c.on('error', () => up.destroy());
    up.on('error', () => c.destroy());
  });
  upstreamPort = await listenOnLoopback(sw);
  useUpstream = (which) => {
    target = which === 'real' ? realPort : fakePort;
  };
  const proxy = await startTestProxy('tls', 'sbx-e13', upstreamPort);
  proxyPort = proxy.port;
  closers.push(
    () => proxy.close(),
    () => sw.close(),
    () => fake.close(),
    () => real.close(),
  );
});
let useUpstream: (which: 'real' | 'fake') => void = () => {};

afterAll(() => {
  for (const c of closers) c();
});

/** Raw client: writes `first`, then after the first answer `second` (if any); what came back. Bounded by 3 s. */
const raw = (first: Buffer, second?: Buffer) => rawExchange(proxyPort, first, second);

describe('the TLS proxy checks every ClientHello of a spliced connection (E13)', () => {
  it('a real HelloRetryRequest handshake completes through the splice', async () => {
    useUpstream('real');
    const c = tls.connect({
      host: '127.0.0.1',
      port: proxyPort,
      servername: 'allowed.test',
      rejectUnauthorized: false,
      ecdhCurve: 'X25519:P-256', // the first key share is X25519: the server asks again for P-256
    });
    c.on('error', () => {});
    const [data] = (await once(c, 'data')) as [Buffer];
    expect(data.toString()).toBe('real served');
    expect(c.getEphemeralKeyInfo()).toMatchObject({ name: 'prime256v1' });
    c.destroy();
  });

  it.each([
    ['names another server', hello('allowed.test'), Buffer.concat([CCS, hello('forbidden.test')])],
    ['names none (the default virtual host)', hello('allowed.test'), hello(null)],
    [
      'is pipelined with the first',
      Buffer.concat([hello('allowed.test'), hello('forbidden.test')]),
      undefined,
    ],
  ])('a second hello that %s never reaches the server', async (_what, first, second) => {
    useUpstream('fake');
    fakeSaw.length = 0;
    const text = await raw(first, second);
    expect(text).not.toContain('served');
    expect(fakeSaw.filter((sni) => sni !== 'allowed.test')).toEqual([]);
  });

  it('a second hello naming the same server reaches it (control)', async () => {
    useUpstream('fake');
    fakeSaw.length = 0;
    const text = await raw(hello('allowed.test'), hello('allowed.test'));
    expect(text).toContain('served allowed.test');
    expect(fakeSaw).toEqual(['allowed.test', 'allowed.test']);
  });
});
