/**
 * Server-Sent Events from a command spool. Event id = byte offset just past the frame, so
 * `Last-Event-ID` (or `?lastEventId=`) resumes exactly. Events:
 * `stdout` / `stderr` `{ data: base64 }`, `truncated` `{ droppedAfter }`, and `exit`
 * `{ exitCode, signal, timedOut, error?, oomKilled? }` (core/guest-protocol.ts ProcessExit) — always
 * last, after which the stream ends.
 */
import type { ServerResponse } from 'node:http';
import { FRAME_EXIT, FRAME_STDERR, FRAME_STDOUT } from '../../core/guest-protocol.ts';
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

/**
 * Whether the client of `res` has gone: its connection closed, possibly before this handler ran
 * (a request read after the agent was stalled can belong to a client that already left, and its
 * 'close' event has fired by then).
 */
function clientGone(res: ServerResponse): boolean {
  return res.destroyed || res.writableEnded || !res.socket || res.socket.destroyed;
}

/**
 * Streams `spool` from `from` to `res` until the exit event, the spool's release (the sandbox
 * went away) or the client leaves — including a client that left before the stream began, which
 * returns at once. Frees its timer and listeners on every path, so no stream outlives its client.
 * `follow: false`: only what is spooled now, then the stream ends (a hibernated sandbox's output:
 * nothing more comes until it resumes; the client reconnects with `Last-Event-ID`).
 */
export async function streamSpool(
  res: ServerResponse,
  spool: Spool,
  from: number,
  o: { follow?: boolean } = {},
): Promise<void> {
  const abort = new AbortController();
  const leave = () => abort.abort();
  res.on('close', leave);
  res.socket?.on('close', leave);
  if (clientGone(res)) {
    res.off('close', leave);
    res.socket?.off('close', leave);
    res.destroy();
    return;
  }
  res.writeHead(200, {
    'content-type': 'text/event-stream; charset=utf-8',
    'cache-control': 'no-store',
    connection: 'keep-alive',
    'x-accel-buffering': 'no',
  });
  res.flushHeaders();
  let last = Date.now();
  const keepalive = setInterval(() => {
    if (clientGone(res)) abort.abort();
    else if (Date.now() - last >= SSE_KEEPALIVE_MS) res.write(': keepalive\n\n');
  }, SSE_KEEPALIVE_MS);
  keepalive.unref(); // never what keeps a stopping agent alive
  try {
    for await (const f of spool.frames(from, { signal: abort.signal, follow: o.follow ?? true })) {
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
    res.off('close', leave);
    res.socket?.off('close', leave);
    res.end();
  }
}
