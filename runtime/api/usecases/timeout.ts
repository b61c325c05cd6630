/** Use case: set a sandbox's running lifetime. Called by `POST /v1/sandboxes/:id/timeout`. */
import { SpaceError } from '../../core/errors.ts';
import type { ApiDeps } from '../app.ts';
import type { SandboxRecord } from '../sandbox-store.ts';

/**
 * Sets team `team`'s sandbox `id`'s lifetime to `timeoutSec` (s) from now; returns the record then.
 * @throws SpaceError BAD_REQUEST (over the configured maximum), SANDBOX_NOT_FOUND,
 *   SANDBOX_NOT_RUNNING (ending, or not live).
 */
export async function setSandboxTimeout(
  deps: ApiDeps,
  team: string,
  id: string,
  timeoutSec: number,
): Promise<SandboxRecord> {
  if (timeoutSec > deps.config.maxTimeoutSec) {
    throw new SpaceError('BAD_REQUEST', `timeoutSec must be at most ${deps.config.maxTimeoutSec}`);
  }
  await deps.requireSandbox(id, team);
  const res = await deps.sandboxes.extend(id, timeoutSec);
  if (!res.ok) {
    if (res.current === null) throw new SpaceError('SANDBOX_NOT_FOUND', `no sandbox ${id}`);
    throw new SpaceError('SANDBOX_NOT_RUNNING', `sandbox ${id} is ${res.current}`, { state: res.current });
  }
  return deps.requireSandbox(id, team);
}
