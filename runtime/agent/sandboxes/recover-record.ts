/**
 * What a node agent can learn of one of its sandboxes from the control plane's record (Redis), to
 * rebuild a `sandbox.json` it found torn (an older agent's write cut by a full disk): the sandbox's
 * session, template, shape, deadline, egress policy and credential grants (resolved as the API
 * resolves them for a dispatch; values never). The instance comes from the folder's marker (see
 * state-files.ts); together they are all adoption needs.
 */
import type { Redis } from 'ioredis';
import { type RecordedGrant, resolveGrants } from '../../core/credential-grants.ts';
import type { EgressPolicy } from '../../core/egress.ts';
import { keys } from '../../core/redis-keys.ts';
import type { CreateSandbox } from './types.ts';

/**
 * The create request of sandbox `id` as the control plane records it, or null when it records no
 * live sandbox of that id on node `nodeId` (none, ended, or placed elsewhere). Credentials deleted
 * or rotated since the grant are left out (as a dispatch would). Env is never recovered (the
 * agent keeps none on disk either). @throws what Redis throws (the caller treats it as "cannot").
 */
export async function recordedRequest(
  redis: Redis,
  nodeId: string,
  id: string,
): Promise<CreateSandbox | null> {
  const h = await redis.hgetall(keys.sandbox(id));
  if (!h.id || h.nodeId !== nodeId || h.state === 'killing' || h.state === 'killed') return null;
  const grants = JSON.parse(h.grants ?? '[]') as RecordedGrant[];
  const credentials = await resolveGrants(redis, grants);
  return {
    sandboxId: id,
    sessionId: h.sessionId ?? '',
    template: h.template ?? '',
    vcpus: Number(h.vcpus),
    memoryMiB: Number(h.memoryMiB),
    env: {},
    expiresAtMs: Number(h.expiresAtMs),
    egress: JSON.parse(h.egress ?? '{"mode":"allow-list","allow":[],"deny":[],"cidrs":[]}') as EgressPolicy,
    credentials,
  };
}
