/**
 * Reconciliation of sandbox records with what nodes really run (the control plane's half; the
 * node's half is `agent/reconcile.ts`). Every pass:
 * - a node that stopped heartbeating more than the node-lost grace ago is fenced (`lostAt` in its
 *   hash) — silence while Redis itself was away does not count (`noteStoreOutage`, the rule of
 *   store-outage.ts shared with placement and dispatch): from then on deletes of its sandboxes
 *   finish without it, and the node destroys every sandbox the control plane ended before it may
 *   announce itself alive again;
 * - a live sandbox placed on a node that stopped heartbeating more than {@link NODE_LOST_GRACE_MS}
 *   ago, or missing from its alive node's inventory although it was live well before that
 *   inventory was taken, is lost: it moves to
 *   `killing` (reason `node_lost`) and gets a delete operation that releases its reservation;
 * - a sandbox in `killing` gets its delete operation queued again (deletes are idempotent) when
 *   its node already dropped it from its inventory (the node destroyed it on its own
 *   reconciliation), when its node is lost, or after {@link STUCK_KILLING_MS} without progress — never while
 *   a delete of it is still pending or running, so a crash between claim and enqueue can't strand
 *   it and a failed delete (node unreachable) is finished once the node speaks again.
 */
import type { Logger } from 'pino';
import { F } from '../core/log-fields.ts';
import { keys } from '../core/redis-keys.ts';
import { StoreOutage } from '../core/store-outage.ts';
import { DEFAULT_TEAM } from '../core/tenancy.ts';
import { parseEndReport } from '../core/types.ts';
import type { OperationStore } from './operations.ts';
import type { SandboxStore } from './sandbox-store.ts';

/** Clock skew allowed between API and agent hosts when comparing inventory times (ms). */
export const INVENTORY_GRACE_MS = 5_000;
/**
 * A node that stopped heartbeating is given this long to come back (an agent restart or rolling
 * upgrade re-adopts its sandboxes) before its sandboxes are declared lost (ms).
 */
export const NODE_LOST_GRACE_MS = 120_000;
/**
 * The longest a node's announced restart (`restartBy` in its hash, written by an agent that stops
 * keeping its sandboxes: SPACE_AGENT_RESTART_HOLD_MS) may hold off its loss, counted from its last
 * heartbeat (ms): a node that never comes back is declared lost after this at the latest.
 */
export const MAX_RESTART_HOLD_MS = 30 * 60_000;
/** A sandbox in `killing` this long without an update gets its delete queued again (ms). */
export const STUCK_KILLING_MS = 60_000;

const LIVE = new Set(['running', 'pausing', 'paused', 'resuming']);

export class Reconciler {
  readonly #sandboxes: SandboxStore;
  readonly #operations: OperationStore;
  readonly #log: Logger;
  readonly #graceMs: number;
  /** This process's Redis outages (shared with the node store: one rule for node liveness). */
  readonly #outage: StoreOutage;

  /** `nodeLostGraceMs` defaults to {@link NODE_LOST_GRACE_MS}; `outage` to one of its own. */
  constructor(
    sandboxes: SandboxStore,
    operations: OperationStore,
    log: Logger,
    nodeLostGraceMs = NODE_LOST_GRACE_MS,
    outage = new StoreOutage(),
  ) {
    this.#sandboxes = sandboxes;
    this.#operations = operations;
    this.#log = log;
    this.#graceMs = nodeLostGraceMs;
    this.#outage = outage;
  }

  /**
   * Queues a delete of sandbox `id` unless one is pending or running already (the record's
   * `deleteOperationId`). Returns whether it queued one.
   */
  async #queueDelete(id: string, reason: string): Promise<boolean> {
    const redis = this.#sandboxes.redis;
    const [prior, team] = await redis.hmget(keys.sandbox(id), 'deleteOperationId', 'team');
    const op = prior ? await this.#operations.get(prior) : null;
    if (op && (op.state === 'pending' || op.state === 'running')) return false;
    const queued = await this.#operations.enqueue('sandbox.delete', id, { reason }, team || DEFAULT_TEAM);
    await redis.hset(keys.sandbox(id), 'deleteOperationId', queued.id);
    return true;
  }

  /**
   * Tells the reconciler that Redis could not be reached at `now` (epoch ms). While Redis is away
   * no node can heartbeat, so that silence is the control plane's, not the node's: a node counts
   * as silent only since its last heartbeat or the end of the outage, whichever is later. Without
   * this, an outage longer than the node-lost grace had every node declared lost, and every
   * sandbox killed, on the first pass after Redis came back.
   */
  noteStoreOutage(now = Date.now()): void {
    this.#outage.down(now);
  }

  /** One pass over every node; returns the sandbox ids it acted on. */
  async pass(now = Date.now()): Promise<{ lost: string[]; requeued: string[] }> {
    const redis = this.#sandboxes.redis;
    const lost: string[] = [];
    const requeued: string[] = [];
    for (const node of await redis.smembers(keys.nodeIndex())) {
      const [alive, [inventoryAt, heartbeatAt, restartBy], placed, inventory, ended] = await Promise.all([
        redis.exists(keys.nodeAlive(node)),
        redis.hmget(keys.node(node), 'inventoryAt', 'heartbeatAt', 'restartBy'),
        redis.smembers(keys.nodeSandboxes(node)),
        redis.smembers(keys.nodeInventory(node)),
        redis.hgetall(keys.nodeEnded(node)),
      ]);
      const deadFor = alive === 1 ? 0 : this.#outage.silentFor(Number(heartbeatAt ?? 0), now);
      // an announced restart holds the node until its agent said it would be back (capped)
      const heldUntil = Math.min(Number(restartBy ?? 0), Number(heartbeatAt ?? 0) + MAX_RESTART_HOLD_MS);
      const lostNode = deadFor > this.#graceMs && now >= heldUntil;
      if (lostNode && (await redis.hsetnx(keys.node(node), 'lostAt', String(now))) === 1) {
        // the fence: the node must reconcile before it may heartbeat again (agent/registry.ts)
        this.#log.warn({ [F.nodeId]: node, deadForMs: deadFor }, 'node declared lost');
      }
      const running = new Set(inventory);
      // the inventory was taken after this: a sandbox missing from it is not on the node
      const reported = (updated: number) =>
        alive === 1 && inventoryAt !== null && updated < Number(inventoryAt) - INVENTORY_GRACE_MS;
      for (const id of placed) {
        const rec = await this.#sandboxes.get(id);
        if (!rec) continue;
        const updated = Date.parse(rec.updatedAt);
        if (rec.state === 'killing') {
          const gone = lostNode || (!running.has(id) && reported(updated));
          if (gone || now - updated > STUCK_KILLING_MS) {
            if (await this.#queueDelete(id, rec.killReason ?? 'request')) requeued.push(id);
          }
          continue;
        }
        if (!LIVE.has(rec.state)) {
          if (ended[id]) await redis.hdel(keys.nodeEnded(node), id);
          continue;
        }
        // a pause or resume under way owns the sandbox (a hibernating node forgets it before the
        // record says paused); the operation ends it in a settled state
        if (rec.state === 'pausing' || rec.state === 'resuming') continue;
        const crash = ended[id] ? parseEndReport(ended[id]) : undefined;
        if (crash) {
          // the node saw it die (out of memory, pids, kernel failure): record that, not "node lost"
          const moved = await this.#sandboxes.transition(id, 'killing', {
            killReason: crash.reason,
            endMessage: crash.message,
          });
          if (moved.ok) {
            await this.#queueDelete(id, crash.reason);
            this.#log.warn({ [F.sandboxId]: id, [F.nodeId]: node }, 'sandbox crashed');
            lost.push(id);
          }
          await redis.hdel(keys.nodeEnded(node), id);
          continue;
        }
        const gone = lostNode || (!running.has(id) && reported(updated));
        if (!gone) continue;
        const moved = await this.#sandboxes.markKilling(id, 'node_lost');
        if (!moved.ok) continue;
        await this.#queueDelete(id, 'node_lost');
        this.#log.warn(
          { [F.sandboxId]: id, [F.nodeId]: node, alive: alive === 1 },
          'sandbox lost by its node',
        );
        lost.push(id);
      }
    }
    return { lost, requeued };
  }
}
