/**
 * The operation handlers that change sandboxes: create (place → dispatch → running) and delete
 * (killing → destroy on the node → release → killed). Both are idempotent, so a reclaimed
 * operation can run again.
 *
 * A delete is done only when the node confirmed it: while the node is unreachable (or its destroy
 * fails) the delete fails with a retryable code and the sandbox stays `killing`, its reservation
 * held — the node's own reconciliation destroys it when it speaks again and the control plane's
 * reconciler then finishes the delete. Only a node declared lost (fenced, see `NodeStore.isLost`)
 * is skipped: it destroys everything the control plane ended before it rejoins. A failed create
 * releases its reservation at once (its record says `killed`, so the node destroys whatever it
 * made). Dispatches end as soon as their node stops heartbeating (`NodeStore.whileAlive`).
 */
import type { Logger } from 'pino';
import { SpaceError } from '../core/errors.ts';
import { F } from '../core/log-fields.ts';
import type { OperationKind } from '../core/types.ts';
import { KILL_REASONS, type KillReason } from '../core/types.ts';
import type { AgentClient } from './agent-client.ts';
import type { CredentialStore } from './credential-store.ts';
import type { NodeStore } from './node-store.ts';
import type { OperationHandler, OperationRecord } from './operations.ts';
import type { SandboxStore } from './sandbox-store.ts';

export interface LifecycleDeps {
  sandboxes: SandboxStore;
  credentials: CredentialStore;
  nodes: NodeStore;
  agents: AgentClient;
  log: Logger;
}

/**
 * Destroys what exists of a sandbox and records it killed; safe to repeat. With `strict` (a
 * delete) the node must confirm the destroy — an unreachable node that is not declared lost, or a
 * failed destroy, throws and leaves the sandbox `killing` with its reservation; without it (cleanup
 * of a failed create) the destroy is best effort and the reservation is released whatever happens.
 * @throws SpaceError NODE_UNAVAILABLE / DRIVER_FAILED (strict only) when the node did not confirm.
 */
async function teardown(
  d: LifecycleDeps,
  id: string,
  reason: KillReason,
  opts: { strict: boolean; message?: string },
): Promise<void> {
  const rec = await d.sandboxes.get(id);
  if (!rec) return;
  if (rec.nodeId) {
    const nodeId = rec.nodeId;
    const node = await d.nodes.get(nodeId);
    try {
      if (node?.alive) {
        await d.nodes.whileAlive(nodeId, (signal) => d.agents.deleteSandbox(node, id, signal));
      } else if (!(await d.nodes.isLost(nodeId))) {
        throw new SpaceError(
          'NODE_UNAVAILABLE',
          `node ${nodeId} is not heartbeating; the delete will be retried`,
          {
            sandboxId: id,
            nodeId,
          },
        );
      }
      // a lost node is fenced: it destroys its ended sandboxes before it may rejoin
    } catch (err) {
      if (opts.strict) throw err;
      d.log.warn(
        { err, [F.sandboxId]: id, [F.nodeId]: nodeId },
        'destroy after failed create failed; the node reconciles it',
      );
    }
  }
  await d.sandboxes.release(id);
  // keep what was said when it started ending (a crash the node described), else the reason's text
  await d.sandboxes.markKilled(id, reason, opts.message ?? rec.endMessage ?? undefined);
}

async function create(d: LifecycleDeps, op: OperationRecord): Promise<void> {
  const id = op.target;
  const log = d.log.child({ [F.sandboxId]: id, [F.operationId]: op.id });
  let rec = await d.sandboxes.get(id);
  if (!rec) throw new SpaceError('SANDBOX_NOT_FOUND', `sandbox ${id} vanished`);
  if (rec.state !== 'creating') {
    if (rec.state === 'running') return; // a previous run of this operation finished the work
    throw new SpaceError('SANDBOX_NOT_RUNNING', `sandbox ${id} is ${rec.state}; creation abandoned`, {
      sandboxId: id,
    });
  }
  const placed = await d.sandboxes.place(rec);
  if (placed.nodeId === null) {
    const err = new SpaceError(
      'NODE_CAPACITY_EXHAUSTED',
      placed.reason === 'no_nodes' ? 'no node is available' : 'no node has room for this sandbox',
      { sandboxId: id },
    );
    await d.sandboxes.markKilled(id, 'create_failed', err.message);
    throw err;
  }
  rec = (await d.sandboxes.get(id))!;
  try {
    const node = await d.nodes.requireAlive(placed.nodeId);
    const req = {
      sandboxId: id,
      sessionId: rec.sessionId,
      template: rec.template,
      vcpus: rec.vcpus,
      memoryMiB: rec.memoryMiB,
      env: rec.env,
      expiresAtMs: rec.expiresAtMs,
      egress: rec.egress,
      credentials: await d.credentials.resolve(rec.grants),
    };
    const out = await d.nodes.whileAlive(node.id, (signal) => d.agents.createSandbox(node, req, signal));
    const createdFrom = out.source ?? (out.fromWarmPool ? 'warm' : 'boot');
    const moved = await d.sandboxes.transition(id, 'running', {
      fromWarmPool: out.fromWarmPool ? '1' : '0',
      createdFrom,
    });
    if (!moved.ok) {
      // deleted while we were creating: the delete operation owns the teardown, but the agent
      // may have finished after it; destroy again (idempotent) so nothing is left behind
      await d.agents.deleteSandbox(node, id).catch(() => {});
      throw new SpaceError('SANDBOX_NOT_RUNNING', `sandbox ${id} was deleted while being created`, {
        sandboxId: id,
      });
    }
    log.info({ [F.nodeId]: node.id, createdFrom }, 'sandbox running');
  } catch (err) {
    const e =
      err instanceof SpaceError ? err : new SpaceError('INTERNAL', 'create failed', {}, { cause: err });
    if ((await d.sandboxes.get(id))?.state === 'creating') {
      await d.sandboxes.markKilling(id, 'create_failed');
      await teardown(d, id, 'create_failed', {
        strict: false,
        message: `creation failed: ${e.message}`,
      }).catch((cleanupErr) => log.error({ err: cleanupErr }, 'cleanup after failed create failed'));
    }
    throw e;
  }
}

async function remove(d: LifecycleDeps, op: OperationRecord): Promise<void> {
  const id = op.target;
  const reason = (KILL_REASONS as readonly string[]).includes(op.args.reason ?? '')
    ? (op.args.reason as KillReason)
    : 'request';
  const rec = await d.sandboxes.get(id);
  if (!rec || rec.state === 'killed') return;
  if (rec.state !== 'killing') await d.sandboxes.markKilling(id, reason);
  const current = await d.sandboxes.get(id);
  await teardown(d, id, (current?.killReason as KillReason | null) ?? reason, { strict: true });
  d.log.info({ [F.sandboxId]: id, reason }, 'sandbox killed');
}

/** The handler table of the operation worker. */
export function lifecycleHandlers(d: LifecycleDeps): Record<OperationKind, OperationHandler> {
  return {
    'sandbox.create': (op) => create(d, op),
    'sandbox.delete': (op) => remove(d, op),
  };
}
