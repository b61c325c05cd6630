/**
 * E12 end to end on 127.0.0.1: the plain HTTP proxy in front of a real `node:http` server that
 * serves two virtual hosts and reads pipelined requests (as ordinary servers do). A body on any
 * method, chunked or with a Content-Length a `Connection` header names, must reach that server as a
 * body — never as a second request for the forbidden host. Judged on the server's side: the list of
 * requests it actually read.
 */
import { createServer, type Server } from 'node:http';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { framedRequestHeaders, stripHopByHop } from './http-headers.ts';
import { listenOnLoopback, rawExchange, startTestProxy } from './test-proxy.ts';

/** What the server behind read: one entry per request. */
const served: { method: string; url: string; host: string; body: string }[] = [];
let upstream: Server;
let proxy: { port: number; close: () => void };

beforeAll(async () => {
  upstream = createServer((req, res) => {
    let body = '';
    req.on('data', (d: Buffer) => {
      body += d.toString('latin1');
    });
    req.on('end', () => {
      served.push({ method: req.method!, url: req.url!, host: req.headers.host ?? '', body });
      res.end(`${req.headers.host} ${req.url}`);
    });
  });
  proxy = await startTestProxy('http', 'sbx-e12', await listenOnLoopback(upstream));
});

afterAll(() => {
  proxy.close();
  upstream.close();
});

beforeEach(() => {
  served.length = 0;
});

/** Sends raw bytes through the proxy, reads until it closes (bounded by a 3 s guard). */
const send = (raw: string) => rawExchange(proxy.port, raw);

const SMUGGLED = 'GET /smuggled HTTP/1.1\r\nHost: forbidden.test\r\n\r\n';
const chunk = (s: string) => `${s.length.toString(16)}\r\n${s}\r\n0\r\n\r\n`;

describe('the gateway frames what it re-sends (E12)', () => {
  it.each(['GET', 'HEAD', 'DELETE', 'OPTIONS', 'POST'])(
    '%s with a chunked body: the server reads one request with that body',
    async (method) => {
      await send(
        `${method} /e12 HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n${chunk(SMUGGLED)}`,
      );
      await new Promise((r) => setTimeout(r, 50)); // a second request would be read by now
      expect(served).toEqual([{ method, url: '/e12', host: 'allowed.test', body: SMUGGLED }]);
    },
  );

  it.each(['GET', 'DELETE', 'OPTIONS'])(
    '%s with a Content-Length that Connection names: the length is kept',
    async (method) => {
      await send(
        `${method} /e12 HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: ${SMUGGLED.length}\r\nConnection: close, content-length\r\n\r\n${SMUGGLED}`,
      );
      await new Promise((r) => setTimeout(r, 50));
      expect(served).toEqual([{ method, url: '/e12', host: 'allowed.test', body: SMUGGLED }]);
    },
  );

  it('the second request of a keep-alive connection is framed too', async () => {
    const text = await send(
      `GET /one HTTP/1.1\r\nHost: allowed.test\r\n\r\nGET /two HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n${chunk(SMUGGLED)}`,
    );
    await new Promise((r) => setTimeout(r, 50));
    expect(text.match(/HTTP\/1\.1 \d{3}/g)).toEqual(['HTTP/1.1 200', 'HTTP/1.1 200']);
    expect(served.map((r) => [r.url, r.host, r.body])).toEqual([
      ['/one', 'allowed.test', ''],
      ['/two', 'allowed.test', SMUGGLED],
    ]);
  });

  it('Connection cannot remove Host: the server still reads the one the gateway decided on', async () => {
    await send('GET /e12h HTTP/1.1\r\nHost: allowed.test\r\nConnection: host, close\r\n\r\n');
    expect(served).toEqual([{ method: 'GET', url: '/e12h', host: 'allowed.test', body: '' }]);
  });
});

describe('framedRequestHeaders / stripHopByHop (E12)', () => {
  it('writes exactly one framing header of its own', () => {
    expect(
      framedRequestHeaders(['Host', 'a.test', 'Transfer-Encoding', 'chunked', 'Connection', 'x']),
    ).toEqual(['Host', 'a.test', 'transfer-encoding', 'chunked']);
    expect(
      framedRequestHeaders(['Host', 'a.test', 'Content-Length', '007', 'Connection', 'Content-Length, Host']),
    ).toEqual(['Host', 'a.test', 'content-length', '7']);
    expect(framedRequestHeaders(['Host', 'a.test'])).toEqual(['Host', 'a.test']);
  });

  it('never lets Connection remove Host, Content-Length or Transfer-Encoding (the last is hop-by-hop anyway)', () => {
    expect(
      stripHopByHop([
        'Host',
        'a',
        'Content-Length',
        '3',
        'Connection',
        'host, content-length, transfer-encoding',
      ]),
    ).toEqual(['Host', 'a', 'Content-Length', '3']);
  });
});
