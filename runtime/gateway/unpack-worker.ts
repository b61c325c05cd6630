/**
 * Worker-thread entry of `unpack-pool.ts`: masks one packed body per message with
 * {@link maskPackedBody}, off the gateway's event loop (E17). Message in: `{ id, body, exact,
 * folded, longest, maxUnpackedBytes }` (byte arrays arrive as Uint8Array); messages out: `{ ready:
 * true }` once at start, then per job `{ id, ok: true, body }` or `{ id, ok: false, problem }`.
 */
import { parentPort } from 'node:worker_threads';
import { maskPackedBody, PackedBodyError } from './packed-body.ts';

interface Job {
  id: number;
  body: Uint8Array;
  exact: Uint8Array[];
  folded: Uint8Array[];
  longest: number;
  maxUnpackedBytes: number;
}

const asBuffer = (u: Uint8Array) => Buffer.from(u.buffer, u.byteOffset, u.byteLength);

// loaded and listening: the pool starts a body's clock only now (start-up is not the body's time)
parentPort?.postMessage({ ready: true });
parentPort?.on('message', (job: Job) => {
  try {
    const body = maskPackedBody(
      asBuffer(job.body),
      { exact: job.exact.map(asBuffer), folded: job.folded.map(asBuffer), longest: job.longest },
      job.maxUnpackedBytes,
    );
    parentPort!.postMessage({ id: job.id, ok: true, body });
  } catch (err) {
    const problem = err instanceof PackedBodyError ? err.problem : 'undecodable';
    parentPort!.postMessage({ id: job.id, ok: false, problem });
  }
});
