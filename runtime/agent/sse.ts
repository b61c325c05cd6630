/**
 * Server-Sent Events from a command spool. Event id = byte offset just past the frame, so
 * `Last-Event-ID` (or `?lastEventId=`) resumes exactly. Events:
 * `stdout` / `stderr` `{ data: base64 }`, `truncated` `{ droppedAfter }`, and `exit`
 * `{ exitCode, signal, timedOut, error? }` — always last, after which the stream ends.
 */
import type { ServerResponse } from 'node:http';
import { FRAME_EXIT, FRAME_STDERR, FRAME_STDOUT } from '../core/guest-protocol.ts';
import { FRAME_TRUNCATED, type Spool } from './spool.ts';

/** Comment line sent when no event went out for this long (keeps proxies from timing out), ms. */
export const SSE_KEEPALIVE_MS = 15_000;

function eventName(type: number): string {
  switch (type) {
    case FRAME_STDOUT:
      return 'stdout';
    case FRAME_STDERR:
      return 'stderr';
    case FRAME_EXIT:
      return 'exit';
    case FRAME_TRUNCATED:
      return 'truncated';
    default:
      return 'unknown';
  }
}

/** Writes with backpressure: resolves when the socket can take more (or is gone). */
function write(res: ServerResponse, s: string): Promise<void> {
  if (res.write(s)) return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => {
      res.off('drain', done);
      res.off('close', done);
      resolve();
    };
    res.on('drain', done);
    res.on('close', done);
  });
}

/** Streams `spool` from `from` to `res` until the exit event or the client leaves. */
export async function streamSpool(res: ServerResponse, spool: Spool, from: number): Promise<void> {
  const abort = new AbortController();
  res.on('close', () => abort.abort());
  res.writeHead(200, {
    'content-type': 'text/event-stream; charset=utf-8',
    'cache-control': 'no-store',
    connection: 'keep-alive',
    'x-accel-buffering': 'no',
  });
  res.flushHeaders();
  let last = Date.now();
  const keepalive = setInterval(() => {
    if (Date.now() - last >= SSE_KEEPALIVE_MS) res.write(': keepalive\n\n');
  }, SSE_KEEPALIVE_MS);
  try {
    for await (const f of spool.frames(from, { signal: abort.signal })) {
      if (abort.signal.aborted) break;
      const data =
        f.type === FRAME_STDOUT || f.type === FRAME_STDERR
          ? JSON.stringify({ data: f.payload.toString('base64') })
          : f.payload.toString('utf8');
      await write(res, `id: ${f.end}\nevent: ${eventName(f.type)}\ndata: ${data}\n\n`);
      last = Date.now();
    }
  } finally {
    clearInterval(keepalive);
    res.end();
  }
}
