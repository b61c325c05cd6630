/**
 * Writes that must outlive a Redis failover: after them, `WAIT <replicas> <timeoutMs>` on the
 * connection that made them (Redis WAIT, https://redis.io/docs/latest/commands/wait/) returns
 * once that many replicas have acknowledged every write the connection sent before it. A primary
 * that dies after that point loses none of them: the replica the sentinels promote holds them.
 *
 * WAIT does not undo anything: a write no replica acknowledged in time stays on the primary and is
 * lost only if a failover comes before the replica catches up. Callers fail the request with
 * `WRITE_NOT_REPLICATED` (503, retryable) so the client knows to check and retry. Off
 * (`replicas` 0) for a deployment with one Redis server, where WAIT would always answer 0.
 */
import type { Redis } from 'ioredis';
import { SpaceError } from './errors.ts';

/** How many replicas must acknowledge a protected write, and how long to wait for them. */
export interface ReplicaAck {
  /** Replicas that must acknowledge (0: off). */
  replicas: number;
  /** Longest wait for them, ms (WAIT's timeout; 0 would mean forever and is not accepted). */
  timeoutMs: number;
}

/**
 * Resolves once `ack.replicas` replicas hold every write `redis` sent so far; at once when
 * `ack.replicas` is 0. Runs WAIT on `redis` itself (it must be the connection that wrote; WAIT
 * blocks that connection for up to `ack.timeoutMs`).
 * @throws SpaceError WRITE_NOT_REPLICATED (details `replicas`, `acknowledged`, `timeoutMs`) when
 * fewer acknowledged in time; what ioredis throws when Redis cannot be reached.
 */
export async function awaitReplicas(redis: Redis, ack: ReplicaAck): Promise<void> {
  if (ack.replicas <= 0) return;
  const acknowledged = await redis.wait(ack.replicas, Math.max(1, ack.timeoutMs));
  if (acknowledged >= ack.replicas) return;
  throw new SpaceError(
    'WRITE_NOT_REPLICATED',
    `the change was made on the Redis primary but ${acknowledged} of ${ack.replicas} replicas acknowledged it within ${ack.timeoutMs} ms: a failover now could lose it; read it back or retry`,
    { replicas: ack.replicas, acknowledged, timeoutMs: ack.timeoutMs },
  );
}
