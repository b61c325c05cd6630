/** The benchmark client and its target, against real loopback HTTP servers. */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { benchClient } from './api.ts';
import { openTarget } from './stack.ts';

let server: Server | null = null;
afterEach(async () => {
  await new Promise<void>((r) => (server ? server.close(() => r()) : r()));
  server = null;
});

/** A loopback server answering GET /v1/nodes with `answer(n)` on the n-th call (from 1). */
async function serve(answer: (n: number) => { status: number; body: unknown }): Promise<string> {
  let n = 0;
  server = createServer((_req, res) => {
    n += 1;
    const a = answer(n);
    res.writeHead(a.status, { 'content-type': 'application/json' }).end(JSON.stringify(a.body));
  });
  await new Promise<void>((r) => server!.listen(0, '127.0.0.1', r));
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

describe('waitReady', () => {
  it('ends at once when the API refuses the key', async () => {
    const url = await serve(() => ({ status: 401, body: { code: 'UNAUTHENTICATED' } }));
    const t0 = Date.now();
    await expect(benchClient({ apiUrl: url, apiKey: 'bad' }).waitReady('base', 60_000)).rejects.toThrow(
      /refused the API key \(401\).*--api-key/,
    );
    expect(Date.now() - t0).toBeLessThan(30_000); // not the 60 s wait
  });

  it('ends after `unreachableMs` when nothing answers, naming the URL', async () => {
    const url = await serve(() => ({ status: 200, body: { nodes: [] } }));
    await new Promise<void>((r) => server!.close(() => r()));
    server = null;
    await expect(benchClient({ apiUrl: url, apiKey: 'k' }).waitReady('base', 60_000, 1_000)).rejects.toThrow(
      new RegExp(`API at ${url} did not answer for 1000 ms`),
    );
  });

  it('waits through answers without a ready node, then returns', async () => {
    const url = await serve((n) =>
      n < 3
        ? { status: n === 1 ? 503 : 200, body: { nodes: [{ alive: true, templates: [] }] } }
        : { status: 200, body: { nodes: [{ alive: true, templates: ['base'] }] } },
    );
    await expect(benchClient({ apiUrl: url, apiKey: 'k' }).waitReady('base', 60_000, 1_000)).resolves.toBe(
      undefined,
    );
  });
});

describe('openTarget', () => {
  it('says --trace-file is ignored for a stack it did not start, and only then', async () => {
    const url = await serve(() => ({ status: 200, body: { nodes: [{ alive: true, templates: ['base'] }] } }));
    const notes: string[] = [];
    const t = await openTarget({
      target: url,
      apiKey: 'k',
      pool: 1,
      traceFile: '/tmp/x.jsonl',
      log: (l) => notes.push(l),
    });
    expect(t.traceFile).toBeNull();
    expect(notes.join('\n')).toMatch(new RegExp(`--trace-file ignored: the API at ${url} was not started`));
    notes.length = 0;
    await openTarget({ target: url, apiKey: 'k', pool: 1, log: (l) => notes.push(l) });
    expect(notes.join('\n')).not.toMatch(/--trace-file/);
  });
});
