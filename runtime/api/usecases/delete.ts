/** Use case: delete (kill) a sandbox. Called by `DELETE /v1/sandboxes/:id` and the E2B kill. */
import type { ApiDeps } from '../app.ts';
import type { OperationRecord } from '../operations.ts';

/**
 * Asks for team `team`'s sandbox `id` to be deleted and returns the delete operation: a repeated
 * delete answers with the one already under way (or done), unless that one failed.
 * @throws SpaceError SANDBOX_NOT_FOUND (unknown, or another team's).
 */
export async function deleteSandbox(deps: ApiDeps, team: string, id: string): Promise<OperationRecord> {
  const rec = await deps.requireSandbox(id, team);
  const prior = await deps.sandboxes.deleteOperationId(rec.id);
  const priorOp = prior ? await deps.operations.get(prior) : null;
  if (priorOp && priorOp.state !== 'failed') return priorOp;
  const op = await deps.operations.enqueue('sandbox.delete', rec.id, { reason: 'request' }, rec.team);
  await deps.sandboxes.setDeleteOperationId(rec.id, op.id);
  return op;
}
