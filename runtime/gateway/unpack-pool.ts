/**
 * Packed (gzip) response bodies are unpacked and masked in worker threads, never on the gateway's
 * event loop (E17: one sandbox downloading gzip bodies that unpack to 100 MiB used to stall every
 * other sandbox's DNS and TLS for seconds). Work per body is bounded in size (the unpacked total,
 * `maxUnpackedBytes`) and in time (`timeoutMs`: the worker is terminated and replaced, the body
 * refused). Jobs wait in one queue per key (the sandbox) and are taken round-robin across keys, so
 * a sandbox with many bodies queued delays its own, not another's.
 */
import { Worker } from 'node:worker_threads';
import type { PackedBodyProblem } from './packed-body.ts';
import type { Needles } from './reflection.ts';

/** Settings of an {@link UnpackPool}. */
export interface UnpackPoolOptions {
  /** Worker threads at most (started on demand), ≥ 1. */
  workers: number;
  /** Longest time one body may take in a worker, ms; past it the worker is terminated. */
  timeoutMs: number;
  /** Largest unpacked size of one body (all members and layers), bytes. */
  maxUnpackedBytes: number;
}

/** Outcome of {@link UnpackPool.mask}: the body to send, or why it must be refused. */
export type UnpackOutcome =
  | { ok: true; body: Buffer }
  | { ok: false; problem: PackedBodyProblem | 'timeout' | 'closed' };

interface Job {
  id: number;
  key: string;
  body: Buffer;
  needles: Needles;
  resolve: (o: UnpackOutcome) => void;
}

interface Slot {
  worker: Worker;
  job: Job | null;
  /** The worker has loaded its module and listens (its first message). */
  ready: boolean;
  timer?: NodeJS.Timeout;
}

/** The waiting jobs of one key and when it was last served (a tick of the pool). */
interface Queue {
  jobs: Job[];
  served: number;
}

const WORKER_URL = new URL('./unpack-worker.ts', import.meta.url);

/** A small pool of unpack workers with per-key fair queueing (see the module comment). */
export class UnpackPool {
  private readonly opts: UnpackPoolOptions;
  private readonly queues = new Map<string, Queue>();
  private tick = 0;
  private readonly slots: Slot[] = [];
  private nextId = 1;
  private closed = false;

  constructor(opts: UnpackPoolOptions) {
    this.opts = { ...opts, workers: Math.max(1, Math.floor(opts.workers)) };
  }

  /**
   * Masks `body` (a response body starting with a gzip magic) for `needles` in a worker, queued
   * under `key` (the sandbox id). Never rejects: a body over the size limit (`too-large`), one
   * that cannot be fully read (`undecodable`), one that ran past the time limit (`timeout`) or a
   * closed pool (`closed`) resolve `{ ok: false, problem }`.
   */
  mask(key: string, body: Buffer, needles: Needles): Promise<UnpackOutcome> {
    if (this.closed) return Promise.resolve({ ok: false, problem: 'closed' });
    return new Promise((resolve) => {
      const job: Job = { id: this.nextId++, key, body, needles, resolve };
      const q = this.queues.get(key);
      if (q) q.jobs.push(job);
      else this.queues.set(key, { jobs: [job], served: 0 });
      this.pump();
    });
  }

  /** Jobs waiting (not yet in a worker), all keys. */
  get queued(): number {
    let n = 0;
    for (const q of this.queues.values()) n += q.jobs.length;
    return n;
  }

  /** Terminates every worker; jobs in flight or queued resolve `closed`. */
  async close(): Promise<void> {
    this.closed = true;
    for (const q of this.queues.values()) for (const j of q.jobs) j.resolve({ ok: false, problem: 'closed' });
    this.queues.clear();
    const slots = this.slots.splice(0);
    for (const s of slots) {
      clearTimeout(s.timer);
      s.job?.resolve({ ok: false, problem: 'closed' });
      s.job = null;
    }
    await Promise.all(slots.map((s) => s.worker.terminate()));
  }

  /**
   * The next job, fair across keys: the oldest job of the key with one waiting that was served
   * longest ago (a key new to the pool first). A key stays known while it has a body in a worker,
   * so a sandbox whose queue just emptied does not jump ahead when its next body arrives.
   */
  private take(): Job | undefined {
    let best: Queue | undefined;
    for (const q of this.queues.values()) {
      if (q.jobs.length > 0 && (!best || q.served < best.served)) best = q;
    }
    if (!best) return undefined;
    best.served = ++this.tick;
    return best.jobs.shift();
  }

  /** Forgets `key` once it has nothing waiting and nothing in a worker. */
  private settle(key: string): void {
    if (this.queues.get(key)?.jobs.length === 0 && !this.slots.some((s) => s.job?.key === key))
      this.queues.delete(key);
  }

  private pump(): void {
    while (!this.closed && this.queued > 0) {
      let slot = this.slots.find((s) => s.job === null);
      if (!slot && this.slots.length < this.opts.workers) slot = this.spawn();
      if (!slot) return;
      const job = this.take();
      if (!job) return;
      this.run(slot, job);
    }
  }

  private spawn(): Slot {
    const worker = new Worker(WORKER_URL);
    worker.unref(); // an idle pool never holds the process open
    const slot: Slot = { worker, job: null, ready: false };
    worker.on(
      'message',
      (m: { ready?: true; id: number; ok: boolean; body?: Uint8Array; problem?: PackedBodyProblem }) => {
        if (m.ready) {
          slot.ready = true;
          if (slot.job) this.startClock(slot);
          return;
        }
        const job = slot.job;
        if (!job || job.id !== m.id) return;
        clearTimeout(slot.timer);
        slot.job = null;
        slot.worker.unref(); // referenced only while busy
        job.resolve(
          m.ok
            ? { ok: true, body: Buffer.from(m.body!.buffer, m.body!.byteOffset, m.body!.byteLength) }
            : { ok: false, problem: m.problem ?? 'undecodable' },
        );
        this.settle(job.key);
        this.pump();
      },
    );
    const lost = () => this.retire(slot, 'undecodable');
    worker.on('error', lost);
    worker.on('exit', lost);
    this.slots.push(slot);
    return slot;
  }

  /** Drops `slot` (its worker ended or ran out of time); its job resolves with `problem`. */
  private retire(slot: Slot, problem: 'undecodable' | 'timeout'): void {
    const at = this.slots.indexOf(slot);
    if (at < 0) return;
    this.slots.splice(at, 1);
    clearTimeout(slot.timer);
    const job = slot.job;
    slot.job = null;
    job?.resolve({ ok: false, problem });
    if (job) this.settle(job.key);
    void slot.worker.terminate();
    this.pump();
  }

  /** The time limit of the slot's job, from when its worker can start on it. */
  private startClock(slot: Slot): void {
    clearTimeout(slot.timer);
    slot.timer = setTimeout(() => this.retire(slot, 'timeout'), this.opts.timeoutMs);
  }

  private run(slot: Slot, job: Job): void {
    slot.job = job;
    if (slot.ready) this.startClock(slot);
    slot.worker.ref();
    slot.worker.postMessage({
      id: job.id,
      body: job.body,
      exact: job.needles.exact,
      folded: job.needles.folded,
      longest: job.needles.longest,
      maxUnpackedBytes: this.opts.maxUnpackedBytes,
    });
  }
}
