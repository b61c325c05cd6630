/**
 * Reconciliation of sandbox records with what nodes really run. Every pass:
 * - a live sandbox placed on a node that stopped heartbeating more than {@link NODE_LOST_GRACE_MS}
 *   ago, or missing from its alive node's inventory although it was live well before that
 *   inventory was taken, is lost: it moves to
 *   `killing` (reason `node_lost`) and gets a delete operation that releases its reservation;
 * - a sandbox stuck in `killing` with no progress for {@link STUCK_KILLING_MS} gets its delete
 *   operation queued again (deletes are idempotent), so a crash between claim and enqueue can't
 *   strand it.
 */
import type { Logger } from 'pino';
import { F } from '../core/log-fields.ts';
import { keys } from '../core/redis-keys.ts';
import type { OperationStore } from './operations.ts';
import type { SandboxStore } from './sandbox-store.ts';

/** Clock skew allowed between API and agent hosts when comparing inventory times (ms). */
export const INVENTORY_GRACE_MS = 5_000;
/**
 * A node that stopped heartbeating is given this long to come back (an agent restart or rolling
 * upgrade re-adopts its sandboxes) before its sandboxes are declared lost (ms).
 */
export const NODE_LOST_GRACE_MS = 120_000;
/** A sandbox in `killing` this long without an update gets its delete queued again (ms). */
export const STUCK_KILLING_MS = 60_000;

const LIVE = new Set(['running', 'pausing', 'paused', 'resuming']);

export class Reconciler {
  readonly #sandboxes: SandboxStore;
  readonly #operations: OperationStore;
  readonly #log: Logger;

  constructor(sandboxes: SandboxStore, operations: OperationStore, log: Logger) {
    this.#sandboxes = sandboxes;
    this.#operations = operations;
    this.#log = log;
  }

  /** One pass over every node; returns the sandbox ids it acted on. */
  async pass(now = Date.now()): Promise<{ lost: string[]; requeued: string[] }> {
    const redis = this.#sandboxes.redis;
    const lost: string[] = [];
    const requeued: string[] = [];
    for (const node of await redis.smembers(keys.nodeIndex())) {
      const [alive, inventoryAt, placed, inventory, ended, heartbeatAt] = await Promise.all([
        redis.exists(keys.nodeAlive(node)),
        redis.hget(keys.node(node), 'inventoryAt'),
        redis.smembers(keys.nodeSandboxes(node)),
        redis.smembers(keys.nodeInventory(node)),
        redis.hgetall(keys.nodeEnded(node)),
        redis.hget(keys.node(node), 'heartbeatAt'),
      ]);
      const deadFor = alive === 1 ? 0 : now - Number(heartbeatAt ?? 0);
      const running = new Set(inventory);
      for (const id of placed) {
        const rec = await this.#sandboxes.get(id);
        if (!rec) continue;
        const updated = Date.parse(rec.updatedAt);
        if (rec.state === 'killing' && now - updated > STUCK_KILLING_MS) {
          await this.#operations.enqueue('sandbox.delete', id, { reason: rec.killReason ?? 'request' });
          requeued.push(id);
          continue;
        }
        if (!LIVE.has(rec.state)) {
          if (ended[id]) await redis.hdel(keys.nodeEnded(node), id);
          continue;
        }
        // a pause or resume under way owns the sandbox (a hibernating node forgets it before the
        // record says paused); the operation ends it in a settled state
        if (rec.state === 'pausing' || rec.state === 'resuming') continue;
        const crash = ended[id];
        if (crash) {
          // the node saw it die (out of memory, pids, kernel failure): record that, not "node lost"
          const moved = await this.#sandboxes.transition(id, 'killing', {
            killReason: 'crashed',
            endMessage: crash,
          });
          if (moved.ok) {
            await this.#operations.enqueue('sandbox.delete', id, { reason: 'crashed' });
            this.#log.warn({ [F.sandboxId]: id, [F.nodeId]: node }, 'sandbox crashed');
            lost.push(id);
          }
          await redis.hdel(keys.nodeEnded(node), id);
          continue;
        }
        const gone =
          deadFor > NODE_LOST_GRACE_MS ||
          (alive === 1 &&
            !running.has(id) &&
            inventoryAt !== null &&
            updated < Number(inventoryAt) - INVENTORY_GRACE_MS);
        if (!gone) continue;
        const moved = await this.#sandboxes.markKilling(id, 'node_lost');
        if (!moved.ok) continue;
        await this.#operations.enqueue('sandbox.delete', id, { reason: 'node_lost' });
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
