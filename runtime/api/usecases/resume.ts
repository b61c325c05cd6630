/**
 * Use case: resume a paused sandbox (asynchronous: the operation worker thaws or restores it,
 * lifecycle.ts). Called by `POST /v1/sandboxes/:id/resume` and the E2B connect.
 */
import type { ApiDeps } from '../app.ts';
import type { OperationRecord } from '../operations.ts';
import type { UseCaseLog } from './log.ts';
import { askLifecycle } from './pause.ts';

/**
 * Asks for team `team`'s sandbox `id` to be resumed and returns the resume operation (one already
 * under way is shared).
 * @throws SpaceError SANDBOX_NOT_FOUND (unknown, or another team's), SANDBOX_NOT_RUNNING (creating
 *   or ending).
 */
export function resumeSandbox(
  deps: ApiDeps,
  team: string,
  id: string,
  log: UseCaseLog,
): Promise<OperationRecord> {
  return askLifecycle(deps, 'sandbox.resume', team, id, { reason: 'request' }, log);
}
