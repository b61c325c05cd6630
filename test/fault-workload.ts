/**
 * The client side of the fault suite: what a user of SPACE would have running when a part of it
 * fails, and what that user saw. Each piece keeps going across the fault, never throws on a failed
 * call, and records what it got (HTTP statuses and error codes, operation states), so a case can
 * assert afterwards that nothing was lost and quote what clients saw:
 *
 * - {@link watchOperation}: every state an operation shows, polled through the API;
 * - {@link LineStream}: a command printing numbered lines, read over SSE and resumed with
 *   `Last-Event-ID` after every drop — afterwards no line may be missing or repeated;
 * - {@link Churn}: a create → delete loop; every operation it started must end, once;
 * - {@link ExecProbe}: a short command every 500 ms; gives the recovery time (first success after
 *   the fault).
 */
import { createParser } from 'eventsource-parser';
import { request } from 'undici';
import type { FaultStack } from './fault-stack.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** What one client call got: an HTTP status and the error code, or a transport error (`status` 0). */
export interface Seen {
  /** HTTP status; 0 when no answer came (connection refused or reset, timeout). */
  status: number;
  /** The error body's `code`, the transport error's code (`ECONNREFUSED`), or null on success. */
  code: string | null;
}

/** Calls the stack's API without ever throwing: a refused connection is `{ status: 0 }`. */
export async function tryCall<T = Record<string, unknown>>(
  s: FaultStack,
  method: string,
  path: string,
  body?: unknown,
  timeoutMs = 10_000,
): Promise<Seen & { body: T | null }> {
  try {
    const res = await request(new URL(path, s.apiUrl), {
      method: method as 'GET',
      headers: {
        authorization: `Bearer ${s.apiKey}`,
        ...(body === undefined ? {} : { 'content-type': 'application/json' }),
      },
      body: body === undefined ? undefined : JSON.stringify(body),
      headersTimeout: timeoutMs,
      bodyTimeout: timeoutMs,
    });
    const text = await res.body.text();
    let parsed: unknown = null;
    try {
      parsed = text ? JSON.parse(text) : {};
    } catch {
      parsed = null;
    }
    const code =
      res.statusCode >= 400 ? ((parsed as { error?: { code?: string } })?.error?.code ?? null) : null;
    return { status: res.statusCode, code, body: parsed as T };
  } catch (err) {
    const code = (err as { code?: string }).code ?? (err as Error).name;
    return { status: 0, code, body: null };
  }
}

/** Counts each distinct `status code` a client saw, e.g. `{ "503 CONTROL_PLANE_UNAVAILABLE": 4 }`. */
export function tally(seen: readonly Seen[]): Record<string, number> {
  const out: Record<string, number> = {};
  for (const x of seen) {
    if (x.status >= 200 && x.status < 300) continue;
    const k = `${x.status} ${x.code ?? ''}`.trim();
    out[k] = (out[k] ?? 0) + 1;
  }
  return out;
}

/** What {@link watchOperation} saw. */
export interface OperationWatch {
  /** The distinct states in the order they were shown (`pending`, `running`, `succeeded`). */
  states: string[];
  /** The final operation's error code, if it failed. */
  errorCode: string | null;
  /** When a poll first showed it ended (epoch ms), or null. */
  endedAt: number | null;
  /** Every failed poll (what a client polling the operation got during the fault). */
  refused: Seen[];
  /** Resolves when the operation ended (and then `extraMs` more of watching, to catch a flip). */
  done: Promise<void>;
  /** Stops watching. */
  stop(): void;
}

/**
 * Polls operation `opId` every 100 ms until it ended and `extraMs` (default 3 s) more, recording
 * every state shown and every failed poll. Never throws; gives up after `timeoutMs` (default 120 s).
 */
export function watchOperation(
  s: FaultStack,
  opId: string,
  opts: { extraMs?: number; timeoutMs?: number } = {},
): OperationWatch {
  const w: OperationWatch = {
    states: [],
    errorCode: null,
    endedAt: null,
    refused: [],
    done: Promise.resolve(),
    stop: () => {
      stopped = true;
    },
  };
  let stopped = false;
  w.done = (async () => {
    const until = Date.now() + (opts.timeoutMs ?? 120_000);
    while (!stopped && Date.now() < until) {
      const res = await tryCall<{ state: string; error: { code: string } | null }>(
        s,
        'GET',
        `/v1/operations/${opId}`,
        undefined,
        3000,
      );
      if (res.status === 200 && res.body) {
        if (w.states.at(-1) !== res.body.state) w.states.push(res.body.state);
        if (res.body.state === 'succeeded' || res.body.state === 'failed') {
          w.errorCode = res.body.error?.code ?? null;
          w.endedAt ??= Date.now();
          if (Date.now() - w.endedAt >= (opts.extraMs ?? 3000)) return;
        }
      } else w.refused.push(res);
      await sleep(100);
    }
  })();
  return w;
}

/** The terminal states among `states` (an operation that ended once shows exactly one). */
export function terminal(states: readonly string[]): string[] {
  return states.filter((x) => x === 'succeeded' || x === 'failed');
}

/** A sandbox of the workload: its id and the stream of its numbered-lines command. */
interface Streamed {
  id: string;
  stream: { url: string; token: string };
}

/**
 * A command printing numbered lines (one every 100 ms) read over SSE, resumed with
 * `Last-Event-ID` after every drop. Keeps every number it read, so {@link LineStream.check} can
 * tell whether a line was lost or repeated across a fault.
 */
export class LineStream {
  readonly id: string;
  /** Every number read, in order. */
  readonly numbers: number[] = [];
  /** Failed (re)connections: what the client saw (status 0 = no answer). */
  readonly refused: Seen[] = [];
  /** How many times the stream dropped and was resumed. */
  resumes = 0;
  /** True once the stream ended for good (its sandbox is gone, or it exited). */
  ended = false;
  readonly #stream: { url: string; token: string };
  readonly #abort = new AbortController();
  #lastId = '';
  #partial = '';
  readonly #loop: Promise<void>;

  constructor(sandbox: Streamed) {
    this.id = sandbox.id;
    this.#stream = sandbox.stream;
    this.#loop = this.#run();
  }

  async #run(): Promise<void> {
    while (!this.#abort.signal.aborted && !this.ended) {
      try {
        const res = await request(this.#stream.url, {
          headers: {
            authorization: `Bearer ${this.#stream.token}`,
            ...(this.#lastId ? { 'last-event-id': this.#lastId } : {}),
          },
          signal: this.#abort.signal,
        });
        if (res.statusCode !== 200) {
          const text = await res.body.text();
          const code = (JSON.parse(text || '{}') as { error?: { code?: string } }).error?.code ?? null;
          this.refused.push({ status: res.statusCode, code });
          // the sandbox (or its command) is gone for good: nothing more will come
          if (res.statusCode === 404 || res.statusCode === 410) this.ended = true;
        } else {
          const parser = createParser({
            onEvent: (e) => {
              if (e.id) this.#lastId = e.id;
              if (e.event === 'exit') this.ended = true;
              if (e.event !== 'stdout') return;
              const text = this.#partial + Buffer.from(JSON.parse(e.data).data, 'base64').toString();
              const parts = text.split('\n');
              this.#partial = parts.pop() ?? '';
              for (const p of parts) this.numbers.push(Number(p));
            },
          });
          const decoder = new TextDecoder();
          for await (const chunk of res.body) parser.feed(decoder.decode(chunk as Buffer, { stream: true }));
        }
      } catch (err) {
        if (this.#abort.signal.aborted) return;
        this.refused.push({ status: 0, code: (err as { code?: string }).code ?? (err as Error).name });
      }
      if (this.#abort.signal.aborted || this.ended) return;
      this.resumes += 1;
      await sleep(200);
    }
  }

  /** Resolves once `count` more lines than now have been read (throws after `timeoutMs`). */
  async more(count: number, timeoutMs = 30_000): Promise<void> {
    const want = this.numbers.length + count;
    const until = Date.now() + timeoutMs;
    while (this.numbers.length < want) {
      if (Date.now() > until)
        throw new Error(`stream of ${this.id}: no new lines (${this.numbers.length} read)`);
      await sleep(100);
    }
  }

  /** Whether the lines read are 0, 1, 2, … without a gap or a repeat; the first bad index, else -1. */
  check(): number {
    return this.numbers.findIndex((n, i) => n !== i);
  }

  /** Stops reading. */
  async stop(): Promise<void> {
    this.#abort.abort();
    await this.#loop;
  }
}

/** One create → delete round of {@link Churn}. */
export interface ChurnRound {
  sandboxId: string | null;
  /** The operations it started (create, then delete) and every state each showed. */
  ops: { kind: 'create' | 'delete'; id: string; watch: OperationWatch }[];
}

/**
 * A create → delete loop (one sandbox at a time). Refused calls are retried (they are what
 * clients saw), a create that failed starts a new round, a failed delete is asked again until the
 * record says `killed` — so at the end every sandbox it made is gone and every operation ended.
 */
export class Churn {
  readonly rounds: ChurnRound[] = [];
  readonly refused: Seen[] = [];
  readonly #s: FaultStack;
  #stopped = false;
  readonly #loop: Promise<void>;

  constructor(s: FaultStack) {
    this.#s = s;
    this.#loop = this.#run();
  }

  async #accepted(method: string, path: string, body?: unknown): Promise<Record<string, unknown> | null> {
    // a round in flight is finished even after stop(): nothing it made may be left behind
    const until = Date.now() + 120_000;
    while (Date.now() < until) {
      const res = await tryCall<Record<string, unknown>>(this.#s, method, path, body);
      if (res.status === 202 || res.status === 200) return res.body;
      this.refused.push(res);
      if (res.status === 404 && method === 'DELETE') return null;
      if (this.#stopped && method === 'POST') return null;
      await sleep(500);
    }
    return null;
  }

  async #run(): Promise<void> {
    while (!this.#stopped) {
      const round: ChurnRound = { sandboxId: null, ops: [] };
      const created = (await this.#accepted('POST', '/v1/sandboxes', {
        template: 'base',
        vcpus: 0.5,
        memoryMiB: 128,
      })) as { sandbox: { id: string }; operation: { id: string } } | null;
      if (!created) continue;
      this.rounds.push(round);
      round.sandboxId = created.sandbox.id;
      const cw = watchOperation(this.#s, created.operation.id, { extraMs: 1000 });
      round.ops.push({ kind: 'create', id: created.operation.id, watch: cw });
      await cw.done;
      // delete whatever the create did: until the record says killed
      for (let i = 0; i < 20; i++) {
        const rec = await tryCall<{ state: string }>(this.#s, 'GET', `/v1/sandboxes/${created.sandbox.id}`);
        if (rec.status === 200 && rec.body?.state === 'killed') break;
        if (rec.status !== 200) {
          this.refused.push(rec);
          await sleep(500);
          continue;
        }
        const del = (await this.#accepted('DELETE', `/v1/sandboxes/${created.sandbox.id}`)) as {
          operation: { id: string };
        } | null;
        if (!del) break;
        const dw = watchOperation(this.#s, del.operation.id, { extraMs: 1000 });
        round.ops.push({ kind: 'delete', id: del.operation.id, watch: dw });
        await dw.done;
        if (dw.states.at(-1) !== 'succeeded') await sleep(1000);
      }
    }
  }

  /** Operations that never ended, or ended more than once (a flip). */
  problems(): string[] {
    const out: string[] = [];
    for (const r of this.rounds) {
      for (const o of r.ops) {
        const t = terminal(o.watch.states);
        if (t.length === 0) out.push(`${o.kind} ${o.id} never ended: ${o.watch.states.join('→')}`);
        if (t.length > 1) out.push(`${o.kind} ${o.id} flipped: ${o.watch.states.join('→')}`);
      }
    }
    return out;
  }

  /** Codes the churn's operations failed with (e.g. `{ NODE_UNAVAILABLE: 1 }`). */
  failures(): Record<string, number> {
    const out: Record<string, number> = {};
    for (const r of this.rounds) {
      for (const o of r.ops) {
        if (o.watch.states.at(-1) !== 'failed') continue;
        const k = `${o.kind} ${o.watch.errorCode ?? ''}`;
        out[k] = (out[k] ?? 0) + 1;
      }
    }
    return out;
  }

  /** Ends the loop after the round in flight (which finishes: its sandbox is deleted). */
  async stop(): Promise<void> {
    this.#stopped = true;
    await this.#loop;
  }
}

/**
 * Runs a short command (`echo ok`) every 500 ms in a probe sandbox and records each try. When
 * the probe's sandbox is gone (declared lost), it makes a new one, so the probe measures when a
 * client can run commands again, not whether that one sandbox survived.
 */
export class ExecProbe {
  readonly tries: { at: number; end: number; ok: boolean; seen: Seen }[] = [];
  /** Probe sandboxes it made (the first is given; later ones replace a lost one). */
  readonly made: string[] = [];
  readonly #s: FaultStack;
  #sandbox: string;
  #stopped = false;
  readonly #loop: Promise<void>;

  constructor(s: FaultStack, sandboxId: string) {
    this.#s = s;
    this.#sandbox = sandboxId;
    this.#loop = this.#run();
  }

  /** The sandbox it currently probes. */
  get sandbox(): string {
    return this.#sandbox;
  }

  async #once(): Promise<Seen> {
    const res = await tryCall<{ stream: { url: string; token: string } }>(
      this.#s,
      'POST',
      `/v1/sandboxes/${this.#sandbox}/commands`,
      { cmd: 'echo', args: ['ok'] },
      5000,
    );
    if (res.status !== 201 || !res.body) return res;
    try {
      const r = await request(res.body.stream.url, {
        headers: { authorization: `Bearer ${res.body.stream.token}` },
        signal: AbortSignal.timeout(5000),
      });
      const text = await r.body.text();
      if (r.statusCode !== 200) return { status: r.statusCode, code: 'STREAM' };
      return text.includes('"exit"') || text.includes('event: exit')
        ? { status: 200, code: null }
        : { status: 0, code: 'NO_EXIT' };
    } catch (err) {
      return { status: 0, code: (err as { code?: string }).code ?? (err as Error).name };
    }
  }

  async #run(): Promise<void> {
    while (!this.#stopped) {
      const at = Date.now();
      const seen = await this.#once();
      this.tries.push({ at, end: Date.now(), ok: seen.status === 200 && seen.code === null, seen });
      // the probe's sandbox ended (declared lost): probe with a new one
      if (seen.code === 'SANDBOX_NOT_FOUND' || seen.code === 'SANDBOX_NOT_RUNNING') {
        const rec = await tryCall<{ state: string }>(this.#s, 'GET', `/v1/sandboxes/${this.#sandbox}`);
        if (rec.status === 404 || rec.body?.state === 'killed') {
          const made = await tryCall<{ sandbox: { id: string } }>(this.#s, 'POST', '/v1/sandboxes', {
            template: 'base',
            vcpus: 0.5,
            memoryMiB: 128,
          });
          if (made.status === 202 && made.body) {
            this.#sandbox = made.body.sandbox.id;
            this.made.push(this.#sandbox);
          }
        }
      }
      await sleep(Math.max(0, 500 - (Date.now() - at)));
    }
  }

  /**
   * Waits until the probe works again after a fault injected at `since` (epoch ms): the newest try
   * succeeded, and so did every try after the first success that followed the last failure.
   * Returns the time from `since` to the end of that first success (ms) — the recovery time a
   * client saw — and what the failed tries since `since` got.
   * @throws Error when it has not recovered within `timeoutMs` (default 120 s).
   */
  async recovered(since: number, timeoutMs = 120_000): Promise<{ ms: number; failed: Seen[] }> {
    const until = Date.now() + timeoutMs;
    for (;;) {
      const after = this.tries.filter((t) => t.at >= since);
      let lastFail = -1;
      after.forEach((t, i) => {
        if (!t.ok) lastFail = i;
      });
      const first = after.find((t, i) => i > lastFail && t.ok);
      if (first) return { ms: first.end - since, failed: after.filter((t) => !t.ok).map((t) => t.seen) };
      if (Date.now() > until)
        throw new Error(`exec probe did not recover: ${JSON.stringify(after.slice(-3))}`);
      await sleep(100);
    }
  }

  async stop(): Promise<void> {
    this.#stopped = true;
    await this.#loop;
  }
}
