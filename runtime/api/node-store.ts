/** Read side of node registrations (the agents write them; see runtime/core/REDIS.md). */
import type { Redis } from 'ioredis';
import { SpaceError } from '../core/errors.ts';
import { KEY_PREFIX, keys } from '../core/redis-keys.ts';
import { StoreOutage } from '../core/store-outage.ts';
import type { NodeInfo } from '../core/types.ts';
import { flatToHash, type ScriptedRedis, withScripts } from './redis-scripts.ts';

/** Sets (ARGV[1] non-empty) or clears a registered node's drain mark; 0 when the node is unknown. */
const SET_DRAIN = `if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if ARGV[1] == '' then redis.call('HDEL', KEYS[1], 'drainRequestedAt')
else redis.call('HSETNX', KEYS[1], 'drainRequestedAt', ARGV[1]) end
return 1`;

/** How often a dispatch in flight checks that its node still heartbeats (ms). */
export const ALIVE_POLL_MS = 1_000;

/**
 * A node's view from its registration hash, alive key (present or not) and warm-slot hash (null:
 * no registration). `alive` is the key, or the outage rule's presumption for a node not fenced as
 * lost (store-outage.ts).
 */
function nodeFrom(
  h: Record<string, string>,
  aliveKey: boolean,
  warm: Record<string, string>,
  outage: StoreOutage,
): NodeInfo | null {
  if (!h.id) return null;
  const alive = outage.nodeAlive(aliveKey, h.heartbeatAt, h.lostAt);
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
    schedulable: h.schedulable === '1' && !h.drainRequestedAt,
    drainRequestedAt: h.drainRequestedAt ? new Date(Number(h.drainRequestedAt)).toISOString() : null,
    heartbeatAt: new Date(Number(h.heartbeatAt ?? 0)).toISOString(),
    alive,
    templates: (h.templates ?? '').split(',').filter(Boolean),
    hibernateStore: h.hibernateStore ?? '',
    protocol: Number(h.protocol ?? 0),
  };
}

export class NodeStore {
  readonly redis: ScriptedRedis;
  /** This process's Redis outages: a node's alive key that expired during one is not its death. */
  readonly outage: StoreOutage;
  /** `outage` defaults to one that follows `redis`'s own connection events. */
  constructor(redis: Redis, outage?: StoreOutage) {
    this.redis = withScripts(redis);
    this.outage = outage ?? new StoreOutage();
    if (!outage) this.outage.watch(redis);
  }

  /** Node `id` as registered (null when unknown); one round trip. */
  async get(id: string): Promise<NodeInfo | null> {
    const res = await this.redis
      .pipeline()
      .hgetall(keys.node(id))
      .exists(keys.nodeAlive(id))
      .hgetall(keys.nodeWarm(id))
      .exec();
    if (!res) return null;
    for (const [err] of res) if (err) throw err;
    const [h, alive, warm] = res.map(([, value]) => value) as [
      Record<string, string>,
      number,
      Record<string, string>,
    ];
    return nodeFrom(h, alive === 1, warm, this.outage);
  }

  /** Every registered node, in id order; one round trip however many there are (nodes.lua). */
  async list(): Promise<NodeInfo[]> {
    const flat = await this.redis.spaceNodes(keys.nodeIndex(), KEY_PREFIX);
    const out: NodeInfo[] = [];
    for (let i = 0; i + 3 < flat.length; i += 4) {
      const node = nodeFrom(
        flatToHash(flat[i + 2] as string[]),
        flat[i + 1] === 1,
        flatToHash(flat[i + 3] as string[]),
        this.outage,
      );
      if (node) out.push(node);
    }
    return out;
  }

  /**
   * Drains node `id` (`at`: when, ms since the epoch: it takes no new sandboxes from now on, and its
   * agent waits for its sandboxes at SIGTERM) or lifts the drain (`at` null). The mark lives in the
   * node's hash (`drainRequestedAt`), which the agent's heartbeats never overwrite, so it outlives
   * agent restarts. Returns the node as it reads afterwards.
   * @throws SpaceError NODE_NOT_FOUND when no node `id` is registered.
   */
  async setDrain(id: string, at: number | null): Promise<NodeInfo> {
    const done = (await this.redis.eval(
      SET_DRAIN,
      1,
      keys.node(id),
      at === null ? '' : String(at),
    )) as number;
    const node = done === 1 ? await this.get(id) : null;
    if (!node) throw new SpaceError('NODE_NOT_FOUND', `no node ${id} is registered`, { nodeId: id });
    return node;
  }

  /**
   * Whether the control plane declared the node lost (`lostAt` fence in its hash, set by the
   * reconciler after the node-lost grace): its sandboxes are presumed gone, and the node destroys
   * whatever still runs there before it rejoins. A node with no registration counts as lost.
   */
  async isLost(id: string): Promise<boolean> {
    const [exists, lostAt] = await Promise.all([
      this.redis.exists(keys.node(id)),
      this.redis.hget(keys.node(id), 'lostAt'),
    ]);
    return exists === 0 || lostAt !== null;
  }

  /**
   * Whether node `id` counts as alive now: its alive key, or (for a node not fenced as lost) the
   * outage rule's presumption (store-outage.ts). A Redis that does not answer says nothing: true.
   */
  async #aliveNow(id: string): Promise<boolean> {
    try {
      const res = await this.redis
        .pipeline()
        .exists(keys.nodeAlive(id))
        .hmget(keys.node(id), 'heartbeatAt', 'lostAt')
        .exec();
      if (!res) return true;
      for (const [err] of res) if (err) throw err;
      const [alive, [heartbeatAt, lostAt]] = res.map(([, v]) => v) as [number, (string | null)[]];
      return this.outage.nodeAlive(alive === 1, heartbeatAt, lostAt);
    } catch {
      return true;
    }
  }

  /**
   * Runs `fn` (a dispatch to node `id`) with a signal that aborts as soon as the node stops
   * heartbeating (checked every {@link ALIVE_POLL_MS}: its alive key, read through the outage rule
   * of store-outage.ts, so a key that expired while Redis was away does not abort it), so a call to
   * a hung agent ends within the heartbeat TTL instead of the whole dispatch timeout. The check loop
   * ends when `fn` settles.
   * @throws SpaceError NODE_UNAVAILABLE when the node stopped heartbeating first; else what `fn` throws.
   */
  async whileAlive<T>(id: string, fn: (signal: AbortSignal) => Promise<T>): Promise<T> {
    const abort = new AbortController();
    // The watcher sleeps on a plain timer that `fn` settling clears, so a call is never held to
    // the next poll (it was: every dispatch took at least ALIVE_POLL_MS) and a dispatch that
    // answers before the first poll (every warm create) costs one timer, not an AbortController
    // and the DOMException its abort makes (~0.1 ms of the API's CPU per create, CPU profile).
    let timer: NodeJS.Timeout | undefined;
    let settled = false;
    const poll = () => {
      timer = setTimeout(async () => {
        const alive = await this.#aliveNow(id);
        if (settled) return;
        if (!alive) abort.abort();
        else poll();
      }, ALIVE_POLL_MS);
    };
    poll();
    try {
      return await fn(abort.signal);
    } catch (err) {
      if (abort.signal.aborted) {
        throw new SpaceError('NODE_UNAVAILABLE', `node ${id} stopped heartbeating during the call`, {
          nodeId: id,
        });
      }
      throw err;
    } finally {
      settled = true;
      clearTimeout(timer);
    }
  }

  /** The node's agent URL; NODE_UNAVAILABLE when it is unknown or not heartbeating. */
  async requireAlive(id: string): Promise<NodeInfo> {
    const node = await this.get(id);
    if (!node?.alive) throw new SpaceError('NODE_UNAVAILABLE', `node ${id} is not available`, { nodeId: id });
    return node;
  }
}

/**
 * Templates some registered node has built, alive or not (a node that stopped heartbeating still
 * says what it holds): they exist, even when no live node can run them right now. Pure.
 */
export function knownTemplates(nodes: readonly NodeInfo[]): Set<string> {
  return new Set(nodes.flatMap((n) => n.templates));
}

/** Templates ready on at least one alive node (agents list them in their registration). Pure. */
export function readyTemplates(nodes: readonly NodeInfo[]): Set<string> {
  return new Set(nodes.filter((n) => n.alive).flatMap((n) => n.templates));
}
