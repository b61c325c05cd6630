/**
 * Use case: pause a sandbox (asynchronous: the operation worker freezes or hibernates it,
 * lifecycle.ts). Called by `POST /v1/sandboxes/:id/pause` and the E2B pause.
 */
import { SpaceError } from '../../core/errors.ts';
import { requestLifecycle } from '../../core/lifecycle-requests.ts';
import { F } from '../../core/log-fields.ts';
import type { ApiDeps } from '../app.ts';
import type { OperationRecord } from '../operations.ts';
import type { UseCaseLog } from './log.ts';

/**
 * Asks for `kind` on team `team`'s sandbox `id`, sharing an operation of that kind already under
 * way, and returns the operation. `args` reach the worker's handler (`reason`, `mode`).
 * @throws SpaceError SANDBOX_NOT_FOUND (unknown, or another team's), SANDBOX_NOT_RUNNING (creating
 *   or ending).
 */
export async function askLifecycle(
  deps: ApiDeps,
  kind: 'sandbox.pause' | 'sandbox.resume',
  team: string,
  id: string,
  args: Record<string, string>,
  log: UseCaseLog,
): Promise<OperationRecord> {
  const rec = await deps.requireSandbox(id, team);
  const asked = await requestLifecycle(deps.redis, kind, rec.id, args);
  const op = await deps.operations.get(asked.operationId);
  if (!op) throw new SpaceError('INTERNAL', `operation ${asked.operationId} vanished`);
  log.info(
    { [F.sandboxId]: rec.id, [F.operationId]: op.id, shared: !asked.created },
    kind === 'sandbox.pause' ? 'pause requested' : 'resume requested',
  );
  return op;
}

/**
 * Asks for team `team`'s sandbox `id` to be paused (`mode`: `auto`, `frozen`, `hibernated`;
 * absent = the platform's policy) and returns the pause operation.
 * @throws SpaceError as {@link askLifecycle}.
 */
export function pauseSandbox(
  deps: ApiDeps,
  team: string,
  id: string,
  mode: string | undefined,
  log: UseCaseLog,
): Promise<OperationRecord> {
  const args: Record<string, string> = { reason: 'request' };
  if (mode) args.mode = mode;
  return askLifecycle(deps, 'sandbox.pause', team, id, args, log);
}
