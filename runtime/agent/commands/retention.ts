/**
 * How long a sandbox's command outputs stay on the node's disk: each command leaves a spool
 * (`<id>.out`) and a record (`<id>.json`) in the sandbox's folder, and without a bound a busy
 * sandbox walks the node's disk towards full (1,000 execs left 2,000 files for the sandbox's whole
 * life). A finished command's output is reclaimed once it was read to its exit and
 * {@link READ_GRACE_MS} passed (a client that lost the connection right at the end can still
 * resume), or once it ended `maxAgeMs` ago, read or not; and while the sandbox keeps more than
 * `maxCommands` outputs or `maxBytes` of them, the oldest finished ones go first. A running
 * command's output is never reclaimed (each is bounded by the per-command spool limit), nor one a
 * reader is streaming. Pure.
 */

/** A read-to-the-end output stays this long before it is reclaimed, ms. */
export const READ_GRACE_MS = 30_000;

/** The per-sandbox bounds (SPACE_SPOOL_MAX_COMMANDS, SPACE_SPOOL_SANDBOX_BYTES, SPACE_SPOOL_RETENTION_MS). */
export interface SpoolRetention {
  /** Outputs (running or finished) kept per sandbox before finished ones are reclaimed. */
  maxCommands: number;
  /** Bytes of output kept per sandbox before finished ones are reclaimed. */
  maxBytes: number;
  /** A finished command's output is reclaimed this long after it ended, ms. */
  maxAgeMs: number;
}

/** What the policy needs to know of one command's output. */
export interface KeptOutput {
  id: string;
  /** Epoch ms its exit was spooled; null while it runs. */
  endedAt: number | null;
  /** Epoch ms a reader last got its exit event; null when none has. */
  readToEndAt: number | null;
  /** Readers streaming it now. */
  readers: number;
  /** Its spool's size, bytes. */
  bytes: number;
}

/** The ids of the outputs to reclaim now, oldest first. Pure. */
export function outputsToReclaim(kept: readonly KeptOutput[], r: SpoolRetention, now: number): string[] {
  const reclaimable = (k: KeptOutput) => k.endedAt !== null && k.readers === 0;
  const out = new Set<string>();
  for (const k of kept) {
    if (!reclaimable(k)) continue;
    const read = k.readToEndAt !== null && now - k.readToEndAt >= READ_GRACE_MS;
    const aged = now - k.endedAt! >= r.maxAgeMs;
    if (read || aged) out.add(k.id);
  }
  let count = kept.length - out.size;
  let bytes = kept.reduce((n, k) => n + (out.has(k.id) ? 0 : k.bytes), 0);
  const oldestFirst = kept
    .filter((k) => reclaimable(k) && !out.has(k.id))
    .sort((a, b) => a.endedAt! - b.endedAt!);
  for (const k of oldestFirst) {
    if (count <= r.maxCommands && bytes <= r.maxBytes) break;
    out.add(k.id);
    count -= 1;
    bytes -= k.bytes;
  }
  const order = new Map(kept.map((k) => [k.id, k.endedAt ?? Number.POSITIVE_INFINITY]));
  return [...out].sort((a, b) => order.get(a)! - order.get(b)!);
}
