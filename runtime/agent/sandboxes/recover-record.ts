/**
 * What a node agent can learn of one of its sandboxes from the control plane's record (Redis), to
 * rebuild a `sandbox.json` it found torn (an older agent's write cut by a full disk): the sandbox's
 * session, template, shape, deadline, egress policy and credential grants (resolved as the API
 * resolves them for a dispatch; values never). The instance comes from the folder's marker (see
 * state-files.ts); together they are all adoption needs.
 */
import type { Redis } from 'ioredis';
import { type CredentialGrant, credentialFromHash } from '../../core/credentials.ts';
import type { EgressPolicy } from '../../core/egress.ts';
import { keys } from '../../core/redis-keys.ts';
import { DEFAULT_TEAM } from '../../core/tenancy.ts';
import type { CreateSandbox } from './types.ts';

/** A grant as the sandbox's record keeps it (the API's `SandboxGrant`, the fields read here). */
interface RecordedGrant {
  name: string;
  placeholder: string;
  domains: string[];
  generation?: string;
  team?: string;
}

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
  const credentials: CredentialGrant[] = [];
  for (const g of grants) {
    const c = credentialFromHash(await redis.hgetall(keys.credential(g.team ?? DEFAULT_TEAM, g.name)));
    if (!c || (g.generation !== undefined && c.generation !== g.generation)) continue;
    credentials.push({
      name: g.name,
      placeholder: g.placeholder,
      domains: c.domains,
      header: c.header,
      format: c.format,
      generation: c.generation,
      ...(g.team ? { team: g.team } : {}),
    });
  }
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
