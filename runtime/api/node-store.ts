/** Read side of node registrations (the agents write them; see runtime/core/REDIS.md). */
import type { Redis } from 'ioredis';
import { SpaceError } from '../core/errors.ts';
import { keys } from '../core/redis-keys.ts';
import type { NodeInfo } from '../core/types.ts';

export class NodeStore {
  readonly redis: Redis;
  constructor(redis: Redis) {
    this.redis = redis;
  }

  async get(id: string): Promise<NodeInfo | null> {
    const [h, alive, warm] = await Promise.all([
      this.redis.hgetall(keys.node(id)),
      this.redis.exists(keys.nodeAlive(id)),
      this.redis.hgetall(keys.nodeWarm(id)),
    ]);
    if (!h.id) return null;
    return {
      id: h.id,
      url: h.url ?? '',
      driver: h.driver ?? '',
      capabilities: (h.capabilities ?? '').split(',').filter(Boolean),
      version: h.version ?? '',
      vcpus: Number(h.vcpusMilli ?? 0) / 1000,
      memoryMiB: Number(h.memoryMiB ?? 0),
      maxSandboxes: Number(h.maxSandboxes ?? 0),
      usedVcpus: Number(h.usedVcpusMilli ?? 0) / 1000,
      usedMemoryMiB: Number(h.usedMemoryMiB ?? 0),
      sandboxes: Number(h.sandboxes ?? 0),
      warm: Object.fromEntries(Object.entries(warm).map(([t, n]) => [t, Math.max(0, Number(n))])),
      schedulable: h.schedulable === '1',
      heartbeatAt: new Date(Number(h.heartbeatAt ?? 0)).toISOString(),
      alive: alive === 1,
      templates: (h.templates ?? '').split(',').filter(Boolean),
      hibernateStore: h.hibernateStore ?? '',
    };
  }

  async list(): Promise<NodeInfo[]> {
    const ids = await this.redis.smembers(keys.nodeIndex());
    const nodes = await Promise.all(ids.sort().map((id) => this.get(id)));
    return nodes.filter((n): n is NodeInfo => n !== null);
  }

  /** The node's agent URL; NODE_UNAVAILABLE when it is unknown or not heartbeating. */
  async requireAlive(id: string): Promise<NodeInfo> {
    const node = await this.get(id);
    if (!node?.alive) throw new SpaceError('NODE_UNAVAILABLE', `node ${id} is not available`, { nodeId: id });
    return node;
  }
}

/** Templates ready on at least one alive node (agents list them in their registration). Pure. */
export function readyTemplates(nodes: readonly NodeInfo[]): Set<string> {
  return new Set(nodes.filter((n) => n.alive).flatMap((n) => n.templates));
}
