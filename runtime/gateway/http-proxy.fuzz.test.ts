/**
 * The plain HTTP proxy end to end on 127.0.0.1 (real sockets, a raw upstream that answers whatever
 * bytes a case gives it): two Host headers and ambiguous framing are refused before anything is
 * forwarded (E6); malformed upstream responses end that exchange, never the process (E11) — also
 * under a bounded, seeded fuzz of response heads.
 */
import net from 'node:net';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { listenOnLoopback, rawExchange, startTestProxy } from './test-proxy.ts';

/** What the raw upstream answers next, and every request it received. */
let answer: Buffer = Buffer.from('HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok');
const received: string[] = [];
let upstream: net.Server;
let proxy: { port: number; close: () => void };

beforeAll(async () => {
  upstream = net.createServer((s) => {
    s.on('error', () => {});
    s.once('data', (d: Buffer) => {
      received.push(d.toString('latin1'));
      s.end(answer);
    });
  });
  proxy = await startTestProxy('http', 'sbx-fuzz', await listenOnLoopback(upstream));
});

afterAll(() => {
  proxy.close();
  upstream.close();
});

beforeEach(() => {
  received.length = 0;
  answer = Buffer.from('HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok');
});

/** Sends raw bytes through the proxy and reads until it closes (bounded by a 3 s guard). */
const send = (raw: string) => rawExchange(proxy.port, raw);

const GET = (headers: string[]) => `GET / HTTP/1.1\r\n${headers.map((h) => `${h}\r\n`).join('')}\r\n`;

describe('strict request heads (E6)', () => {
  it('forwards one Host', async () => {
    expect(await send(GET(['Host: allowed.test', 'Connection: close']))).toMatch(/^HTTP\/1\.1 200/);
    expect(received).toHaveLength(1);
  });

  it.each([
    ['two Host headers (allowed first)', ['Host: allowed.test', 'Host: forbidden.test']],
    ['two Host headers (allowed second)', ['Host: forbidden.test', 'Host: allowed.test']],
    ['the same Host twice', ['Host: allowed.test', 'Host: allowed.test']],
    ['Transfer-Encoding other than chunked', ['Host: allowed.test', 'Transfer-Encoding: gzip, chunked']],
  ])('refuses %s; the upstream receives nothing', async (_why, headers) => {
    expect(await send(GET([...headers, 'Connection: close']))).toMatch(/^HTTP\/1\.1 400/);
    expect(received).toEqual([]);
  });

  it('applies the rule to the second request of a keep-alive connection too', async () => {
    const text = await send(
      GET(['Host: allowed.test']) + GET(['Host: allowed.test', 'Host: forbidden.test', 'Connection: close']),
    );
    expect(text.match(/HTTP\/1\.1 \d{3}/g)).toEqual(['HTTP/1.1 200', 'HTTP/1.1 400']);
    expect(received).toHaveLength(1);
  });

  it.each([
    ['obsolete line folding', 'GET / HTTP/1.1\r\nHost: allowed.test\r\nX-A: a\r\n b\r\n\r\n'],
    [
      'Content-Length with Transfer-Encoding',
      'POST / HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n',
    ],
    ['HTTP/2 prior knowledge', 'PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n'],
  ])('refuses %s at the parser', async (_why, raw) => {
    expect(await send(raw)).toMatch(/^HTTP\/1\.1 400/);
    expect(received).toEqual([]);
  });
});

describe('malformed upstream responses (E11)', () => {
  it('a control character in the status line is a 502 for that exchange; the next one is served', async () => {
    answer = Buffer.from('HTTP/1.1 200 O\x01K\r\ncontent-length: 2\r\n\r\nhi');
    expect(await send(GET(['Host: allowed.test', 'Connection: close']))).toMatch(/^HTTP\/1\.1 502/);
    answer = Buffer.from('HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok');
    expect(await send(GET(['Host: allowed.test', 'Connection: close']))).toMatch(/^HTTP\/1\.1 200/);
  });

  it('survives 300 seeded random mutations of a response head (bounded fuzz)', async () => {
    // mulberry32: deterministic, so a failure names its case
    let seed = 0x5eed;
    const rand = () => {
      seed = (seed + 0x6d2b79f5) | 0;
      let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
      t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
      return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
    };
    const base = Buffer.from(
      'HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 5\r\nx-a: b\r\n\r\nhello',
    );
    const headEnd = base.indexOf('\r\n\r\n') + 4;
    const interesting = [0x00, 0x01, 0x0a, 0x0d, 0x20, 0x3a, 0x7f, 0x80, 0xff, 0x09];
    for (let i = 0; i < 300; i++) {
      const b = Buffer.from(base);
      const edits = 1 + Math.floor(rand() * 4);
      for (let e = 0; e < edits; e++) {
        const at = Math.floor(rand() * headEnd);
        b[at] =
          rand() < 0.6 ? interesting[Math.floor(rand() * interesting.length)]! : Math.floor(rand() * 256);
      }
      answer = b;
      const text = await send(GET(['Host: allowed.test', 'Connection: close']));
      // whatever came back is a well-formed head the proxy wrote (or nothing at all)
      if (text !== '')
        expect(text, `case ${i}: ${JSON.stringify(b.toString('latin1'))}`).toMatch(/^HTTP\/1\.1 \d{3} /);
    }
    // and the proxy still serves
    answer = Buffer.from('HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok');
    expect(await send(GET(['Host: allowed.test', 'Connection: close']))).toMatch(/^HTTP\/1\.1 200/);
  }, 60_000);
});
