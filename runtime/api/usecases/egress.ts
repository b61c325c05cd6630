/**
 * Use case: replace a running sandbox's egress policy (the node closes connections the new policy
 * no longer allows). Called by `PATCH /v1/sandboxes/:id/egress` and the E2B `PUT …/network`.
 */
import { type EgressPolicyInput, normalisePolicy } from '../../core/egress.ts';
import { SpaceError } from '../../core/errors.ts';
import { F } from '../../core/log-fields.ts';
import type { ApiDeps } from '../app.ts';
import { allowCredentialHosts } from '../credential-store.ts';
import type { SandboxRecord } from '../sandbox-store.ts';
import type { UseCaseLog } from './log.ts';

/**
 * Pushes `policy` (as the client gave it; normalised here, the sandbox's credential hosts added) to
 * the node of team `team`'s sandbox `id`, then stores it; returns the record as it is then.
 * @throws SpaceError SANDBOX_NOT_FOUND, SANDBOX_NOT_RUNNING (not running, or not placed),
 *   NODE_UNAVAILABLE, the policy's BAD_REQUEST (normalisePolicy), the node's refusals.
 */
export async function replaceEgress(
  deps: ApiDeps,
  team: string,
  id: string,
  policy: EgressPolicyInput,
  log: UseCaseLog,
): Promise<SandboxRecord> {
  const rec = await deps.requireSandbox(id, team);
  const egress = allowCredentialHosts(normalisePolicy(policy), rec.grants);
  if (rec.state !== 'running' || !rec.nodeId) {
    throw new SpaceError('SANDBOX_NOT_RUNNING', `sandbox ${rec.id} is ${rec.state}`, { state: rec.state });
  }
  const node = await deps.nodes.requireAlive(rec.nodeId);
  await deps.agents.updateEgress(node, rec.id, egress);
  await deps.sandboxes.setEgress(rec.id, egress);
  log.info({ [F.sandboxId]: rec.id, egress }, 'egress policy replaced');
  return deps.requireSandbox(rec.id, team);
}
