import { once } from 'node:events';
import { createServer } from 'node:net';
import { connect as tlsConnect } from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseClientHello } from './client-hello.ts';

const MAX = 32 * 1024;

/** A real ClientHello from Node's TLS stack (OpenSSL), captured on a plain TCP server. */
async function captureHello(servername: string | undefined): Promise<Buffer> {
  const server = createServer();
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const port = (server.address() as { port: number }).port;
  const got = new Promise<Buffer>((resolve) => {
    server.once('connection', (s) => {
      const chunks: Buffer[] = [];
      s.on('data', (c: Buffer) => {
        chunks.push(c);
        const buf = Buffer.concat(chunks);
        if (parseClientHello(buf, MAX).status !== 'incomplete') {
          resolve(buf);
          s.destroy();
        }
      });
    });
  });
  const client = tlsConnect({ host: '127.0.0.1', port, servername, rejectUnauthorized: false });
  client.on('error', () => {});
  const hello = await got;
  client.destroy();
  server.close();
  return hello;
}

/** Re-frames a single-record hello into records of at most `size` payload bytes. */
function refragment(hello: Buffer, size: number): Buffer {
  const payload = hello.subarray(5, 5 + hello.readUInt16BE(3));
  const out: Buffer[] = [];
  for (let i = 0; i < payload.length; i += size) {
    const part = payload.subarray(i, i + size);
    const head = Buffer.from([0x16, 3, 1, 0, 0]);
    head.writeUInt16BE(part.length, 3);
    out.push(head, part);
  }
  return Buffer.concat(out);
}

/** A minimal hand-built hello with the given extensions block (or none). */
function buildHello(extensions: Buffer | null): Buffer {
  const body = Buffer.concat([
    Buffer.from([3, 3]),
    Buffer.alloc(32, 7),
    Buffer.from([0]), // session id
    Buffer.from([0, 2, 0x13, 0x01]), // one cipher suite
    Buffer.from([1, 0]), // null compression
    ...(extensions ? [Buffer.from([extensions.length >> 8, extensions.length & 255]), extensions] : []),
  ]);
  const hs = Buffer.concat([Buffer.from([1, 0, body.length >> 8, body.length & 255]), body]);
  return Buffer.concat([Buffer.from([0x16, 3, 1, hs.length >> 8, hs.length & 255]), hs]);
}

function sniExt(...names: Buffer[]): Buffer {
  const entries = Buffer.concat(
    names.map((n) => Buffer.concat([Buffer.from([0, n.length >> 8, n.length & 255]), n])),
  );
  const list = Buffer.concat([Buffer.from([entries.length >> 8, entries.length & 255]), entries]);
  return Buffer.concat([Buffer.from([0, 0, list.length >> 8, list.length & 255]), list]);
}

let real: Buffer;
let realNoSni: Buffer;
beforeAll(async () => {
  real = await captureHello('pkg.allowed.test');
  realNoSni = await captureHello(undefined);
});
afterAll(() => {});

describe('parseClientHello', () => {
  it('reads the SNI of a real hello and reports its length', () => {
    const r = parseClientHello(real, MAX);
    expect(r).toEqual({ status: 'ok', sni: 'pkg.allowed.test', length: real.length });
  });

  it('reports no SNI when the client sends none', () => {
    expect(parseClientHello(realNoSni, MAX)).toMatchObject({ status: 'ok', sni: null });
    expect(parseClientHello(buildHello(null), MAX)).toMatchObject({ status: 'ok', sni: null });
  });

  it('reads a hello split over several records', () => {
    expect(parseClientHello(refragment(real, 7), MAX)).toMatchObject({
      status: 'ok',
      sni: 'pkg.allowed.test',
    });
  });

  it('is incomplete on every strict prefix and asks for no more than needed', () => {
    for (let n = 0; n < real.length; n++) {
      const r = parseClientHello(real.subarray(0, n), MAX);
      expect(r.status).toBe('incomplete');
      if (r.status === 'incomplete') expect(r.need).toBeLessThanOrEqual(real.length);
    }
  });

  it('accepts trailing bytes after the hello (they are replayed)', () => {
    expect(parseClientHello(Buffer.concat([real, Buffer.from('extra')]), MAX)).toMatchObject({
      status: 'ok',
      length: real.length,
    });
  });

  it('refuses non-TLS input at the first byte', () => {
    expect(parseClientHello(Buffer.from('GET / HTTP/1.1\r\n'), MAX)).toEqual({
      status: 'error',
      reason: 'not-tls',
    });
    expect(parseClientHello(Buffer.from('SSH-2.0-x\r\n'), MAX)).toEqual({
      status: 'error',
      reason: 'not-tls',
    });
    expect(parseClientHello(Buffer.from([0x16, 0x02, 0x00]), MAX)).toEqual({
      status: 'error',
      reason: 'not-tls',
    });
  });

  it('caps the size as soon as a length claims too much', () => {
    expect(parseClientHello(real, 100)).toEqual({ status: 'error', reason: 'hello-too-large' });
    // a record header claiming 16 KiB with a 1 KiB cap fails before any payload arrives
    expect(parseClientHello(Buffer.from([0x16, 3, 1, 0x40, 0x00]), 1024)).toEqual({
      status: 'error',
      reason: 'hello-too-large',
    });
  });

  it.each([
    ['zero-length record', Buffer.from([0x16, 3, 1, 0, 0])],
    ['record over 16 KiB', Buffer.from([0x16, 3, 1, 0x40, 0x01])],
    ['not a ClientHello', Buffer.from([0x16, 3, 1, 0, 4, 2, 0, 0, 0])],
    [
      'alert record after the first',
      Buffer.concat([Buffer.from([0x16, 3, 1, 0, 2, 1, 0]), Buffer.from([0x15, 3, 1, 0, 2, 0, 0])]),
    ],
    ['two SNI host names', buildHello(sniExt(Buffer.from('a.test'), Buffer.from('b.test')))],
    [
      'duplicate SNI extension',
      buildHello(Buffer.concat([sniExt(Buffer.from('a.test')), sniExt(Buffer.from('a.test'))])),
    ],
    ['NUL in SNI', buildHello(sniExt(Buffer.from('a.test\u0000.evil.test')))],
    ['space in SNI', buildHello(sniExt(Buffer.from('a test')))],
    ['non-ASCII SNI', buildHello(sniExt(Buffer.from('bücher.test')))],
    ['empty SNI', buildHello(sniExt(Buffer.alloc(0)))],
    ['SNI over 255 bytes', buildHello(sniExt(Buffer.alloc(300, 0x61)))],
    ['extension length past the end', buildHello(Buffer.from([0, 0, 0, 50, 0]))],
  ])('refuses a malformed hello: %s', (_why, buf) => {
    expect(parseClientHello(buf, MAX)).toMatchObject({ status: 'error' });
  });

  it('never throws on mutated or truncated real hellos (fuzz, seeded)', () => {
    let seed = 12345;
    const rand = () => {
      seed = (seed * 1103515245 + 12345) & 0x7fffffff;
      return seed;
    };
    const statuses = new Set<string>();
    for (let i = 0; i < 5000; i++) {
      const buf = Buffer.from(rand() % 2 ? real : refragment(real, 1 + (rand() % 300)));
      const flips = 1 + (rand() % 4);
      for (let f = 0; f < flips; f++) buf[rand() % buf.length] = rand() & 255;
      const cut = rand() % 3 === 0 ? buf.subarray(0, rand() % buf.length) : buf;
      const r = parseClientHello(cut, MAX);
      statuses.add(r.status);
      if (r.status === 'ok' && r.sni !== null) expect(r.sni).toMatch(/^[\x21-\x7e]+$/);
    }
    expect(statuses.has('error')).toBe(true);
  });
});
