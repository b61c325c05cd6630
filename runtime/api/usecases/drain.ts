/**
 * Use case: drain a node before it goes (a cloud replacing a VM, an instance-type change, a
 * retired machine), or lift the drain. Called by `PUT`/`DELETE /v1/nodes/:id/drain` (`space nodes
 * drain|undrain`). A drained node takes no new sandboxes (placement reads the mark, and so does the
 * agent's heartbeat); its agent, at SIGTERM, waits up to `SPACE_DRAIN_WAIT_MS` for them to end.
 * With `hibernate`, each of its running sandboxes is also hibernated, so it resumes on another node
 * that reads the same (shared) hibernation store.
 */
import { SpaceError } from '../../core/errors.ts';
import { requestLifecycle } from '../../core/lifecycle-requests.ts';
import { F } from '../../core/log-fields.ts';
import { keys } from '../../core/redis-keys.ts';
import type { NodeInfo } from '../../core/types.ts';
import type { ApiDeps } from '../app.ts';
import type { UseCaseLog } from './log.ts';

/** What a drain did. */
export interface DrainResult {
  node: NodeInfo;
  /** Sandboxes whose hibernation was asked (`operationId` to follow; empty without `hibernate`). */
  hibernating: { sandboxId: string; operationId: string }[];
  /** Sandboxes of the node left as they are, with why (e.g. `paused`: frozen in the node's memory). */
  skipped: { sandboxId: string; reason: string }[];
}

/**
 * Drains node `id`; with `hibernate`, asks each of its running sandboxes to hibernate (reason
 * `drain`). Draining twice keeps the first drain's time.
 * @throws SpaceError NODE_NOT_FOUND (no such node); HIBERNATE_STORE_LOCAL when `hibernate` is asked
 *   of a node whose hibernation store is its own disk (nothing is changed then).
 */
export async function drainNode(
  deps: ApiDeps,
  id: string,
  opts: { hibernate: boolean },
  log: UseCaseLog,
): Promise<DrainResult> {
  const before = await deps.nodes.get(id);
  if (!before) throw new SpaceError('NODE_NOT_FOUND', `no node ${id} is registered`, { nodeId: id });
  if (opts.hibernate && nodeLocalStore(before)) {
    throw new SpaceError(
      'HIBERNATE_STORE_LOCAL',
      `node ${id} hibernates to its own disk (store ${JSON.stringify(before.hibernateStore)}): its sandboxes could not resume elsewhere`,
      { nodeId: id, hibernateStore: before.hibernateStore },
    );
  }
  const node = await deps.nodes.setDrain(id, Date.now());
  const hibernating: DrainResult['hibernating'] = [];
  const skipped: DrainResult['skipped'] = [];
  if (opts.hibernate) {
    const ids = (await deps.redis.smembers(keys.nodeSandboxes(id))).sort();
    for (const sandboxId of ids) {
      const rec = await deps.sandboxes.get(sandboxId);
      if (rec?.state !== 'running') {
        skipped.push({ sandboxId, reason: rec?.state ?? 'gone' });
        continue;
      }
      try {
        const asked = await requestLifecycle(deps.redis, 'sandbox.pause', sandboxId, {
          mode: 'hibernated',
          reason: 'drain',
        });
        hibernating.push({ sandboxId, operationId: asked.operationId });
      } catch (err) {
        // it ended or started ending between the read and the ask
        if (!(err instanceof SpaceError)) throw err;
        skipped.push({ sandboxId, reason: err.code });
      }
    }
  }
  log.info(
    { [F.nodeId]: id, hibernating: hibernating.length, skipped: skipped.length },
    'node drained: it takes no new sandboxes',
  );
  return { node, hibernating, skipped };
}

/**
 * Lifts node `id`'s drain: it takes new sandboxes again (from its next heartbeat on, for its own
 * view; placement at once). @throws SpaceError NODE_NOT_FOUND.
 */
export async function undrainNode(deps: ApiDeps, id: string, log: UseCaseLog): Promise<NodeInfo> {
  const node = await deps.nodes.setDrain(id, null);
  log.info({ [F.nodeId]: id }, 'node drain lifted');
  return node;
}

/** Whether the node's hibernation store is its own disk (the agent's default, `node:<id>`). */
function nodeLocalStore(n: NodeInfo): boolean {
  return n.hibernateStore === '' || n.hibernateStore === `node:${n.id}`;
}
