import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { CliError } from './output.ts';
import { outageNotes, outputBytes, readEvents, type SseEvent } from './sse.ts';

type Handler = (req: IncomingMessage, res: ServerResponse, n: number) => void;

let server: Server | null = null;
async function serve(handler: Handler): Promise<string> {
  let n = 0;
  server = createServer((req, res) => handler(req, res, n++));
  await new Promise<void>((r) => server!.listen(0, '127.0.0.1', () => r()));
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}/events`;
}
afterEach(async () => {
  server?.closeAllConnections();
  await new Promise((r) => server?.close(r));
  server = null;
});

const frame = (id: number, event: string, data: string) => `id: ${id}\nevent: ${event}\ndata: ${data}\n\n`;
const out = (s: string) => JSON.stringify({ data: Buffer.from(s).toString('base64') });
const EXIT = JSON.stringify({ exitCode: 3, signal: null, timedOut: false });

async function collect(it: AsyncIterable<SseEvent>): Promise<SseEvent[]> {
  const all: SseEvent[] = [];
  for await (const ev of it) all.push(ev);
  return all;
}

describe('readEvents', () => {
  it('resumes a dropped stream with Last-Event-ID: nothing lost or repeated', async () => {
    const seen: (string | undefined)[] = [];
    const url = await serve((req, res, n) => {
      seen.push(req.headers['last-event-id'] as string | undefined);
      expect(req.headers.authorization).toBe('Bearer tok');
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      if (n === 0) {
        res.write(frame(10, 'stdout', out('a')) + frame(20, 'stderr', out('b')));
        // half an event, then the connection drops
        res.write('id: 30\nevent: stdout\ndata: ');
        setTimeout(() => res.socket?.destroy(), 20);
      } else {
        res.end(frame(30, 'stdout', out('c')) + frame(40, 'exit', EXIT));
      }
    });
    const notes: unknown[] = [];
    const events = await collect(
      readEvents({ url, token: 'tok', retryDelayMs: 1, onReconnect: (i) => notes.push(i.lastEventId) }),
    );
    expect(seen).toEqual([undefined, '20']);
    expect(notes).toEqual(['20']);
    expect(events.map((e) => [e.id, e.event])).toEqual([
      ['10', 'stdout'],
      ['20', 'stderr'],
      ['30', 'stdout'],
      ['40', 'exit'],
    ]);
    expect(events.slice(0, 3).map((e) => outputBytes(e).toString())).toEqual(['a', 'b', 'c']);
  });

  it('is binary-safe', async () => {
    const bytes = Buffer.from([0, 255, 10, 13, 0xe2, 0x82]);
    const url = await serve((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.end(
        frame(6, 'stdout', JSON.stringify({ data: bytes.toString('base64') })) +
          ': keepalive\n\n' +
          frame(7, 'exit', EXIT),
      );
    });
    const events = await collect(readEvents({ url, token: 't' }));
    expect(outputBytes(events[0]!).equals(bytes)).toBe(true);
    expect(events).toHaveLength(2);
  });

  it('starts from lastEventId when given', async () => {
    let header: unknown;
    const url = await serve((req, res) => {
      header = req.headers['last-event-id'];
      res.writeHead(200);
      res.end(frame(9, 'exit', EXIT));
    });
    await collect(readEvents({ url, token: 't', lastEventId: '5' }));
    expect(header).toBe('5');
  });

  it('does not retry a coded client error', async () => {
    let calls = 0;
    const url = await serve((_req, res) => {
      calls++;
      res.writeHead(401, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ error: { code: 'TOKEN_EXPIRED', message: 'expired' } }));
    });
    await expect(collect(readEvents({ url, token: 't', retryDelayMs: 1 }))).rejects.toMatchObject({
      code: 'TOKEN_EXPIRED',
    });
    expect(calls).toBe(1);
  });

  it('waits out a data plane that is away for many attempts (a router restart in a roll), losing nothing', async () => {
    const url = await serve((req, res, n) => {
      if (n === 0) {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.write(frame(1, 'stdout', out('a')));
        setTimeout(() => res.socket?.destroy(), 20);
      } else if (n < 12) {
        // eleven refusals in a row: the restarting node or router
        res.writeHead(503, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ error: { code: 'NODE_UNAVAILABLE', message: 'restarting' } }));
      } else {
        expect(req.headers['last-event-id']).toBe('1');
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.end(frame(2, 'stdout', out('b')) + frame(3, 'exit', EXIT));
      }
    });
    const notes: string[] = [];
    const events = await collect(
      readEvents({
        url,
        token: 't',
        retryDelayMs: 1,
        retryForMs: 10_000,
        ...outageNotes((l) => notes.push(l), 10_000),
      }),
    );
    expect(events.map((e) => e.id)).toEqual(['1', '2', '3']);
    // twelve failed attempts, three notes: the drop, the new reason, the resume
    expect(notes).toHaveLength(3);
    expect(notes[0]).toMatch(/^space: event stream dropped \(.+\); resuming for up to 10 s$/);
    expect(notes[1]).toBe('space: event stream still away (restarting); resuming');
    expect(notes[2]).toMatch(/^space: event stream resumed after \d+\.\d s \(12 attempts\)$/);
  });

  it('gives up once drops in a row have lasted retryForMs, and not before', async () => {
    let calls = 0;
    const url = await serve((_req, res) => {
      calls++;
      res.writeHead(200);
      res.end(); // ends without an exit event
    });
    const t0 = Date.now();
    const err = await collect(readEvents({ url, token: 't', retryDelayMs: 20, retryForMs: 300 })).catch(
      (e) => e,
    );
    expect(err).toBeInstanceOf(CliError);
    expect(err.code).toBe('STREAM_DROPPED');
    expect(err.message).toMatch(/gave up after \d+ attempts over/);
    expect(Date.now() - t0).toBeGreaterThanOrEqual(300);
    // 20, 40, 80, 160 ms … between attempts: a handful, bounded by the doubling
    expect(calls).toBeGreaterThan(2);
    expect(calls).toBeLessThan(10);
  });
});
