/**
 * Node registration: the agent writes its capacity, URL, templates and warm-pool counts to Redis
 * every heartbeat, with an alive key that expires after NODE_ALIVE_TTL_MS. Reservations
 * (`used*`, `sandboxes`) belong to the API's placement scripts and are only initialised here.
 */
import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import { keys, NODE_ALIVE_TTL_MS } from '../core/redis-keys.ts';

/** What the node advertises. */
export interface Registration {
  id: string;
  url: string;
  driver: string;
  /** What the driver can do (`pause`, `snapshot`, `restore`, …) and `kvm` when KVM is usable. */
  capabilities: string[];
  /** The API ↔ agent contract version it speaks (core/agent-protocol.ts). */
  protocol: number;
  version: string;
  vcpus: number;
  memoryMiB: number;
  maxSandboxes: number;
  /** Hibernation store this node reads (nodes with the same store can resume each other's). */
  hibernateStore: string;
}

/** What changes between heartbeats. */
export interface NodeState {
  schedulable: boolean;
  templates: string[];
  warm: Record<string, number>;
  /**
   * The memory the warm slots (ready and being made) hold, MiB, one slot's share of it, and the
   * pool's shape (milli-vCPUs, MiB): placement counts the held memory as used, less one slot's
   * share when a create of exactly that shape claims a slot.
   */
  warmHeld: { memoryMiB: number; slotFootprintMiB: number; slotVcpusMilli: number; slotMemoryMiB: number };
  /** Ids of the sandboxes this agent runs (the API reconciles its records against them). */
  sandboxes: string[];
  /**
   * The state disk's headroom, bytes, and whether it is under its floor (then `schedulable` is
   * false too: host/disk-headroom.ts); null before the first reading or when it failed.
   */
  disk: { pressure: boolean; freeBytes: number; totalBytes: number } | null;
}

/** Deletes the node's `lostAt` fence if it still holds the value the agent reconciled against. */
const LIFT_FENCE = `if redis.call('HGET', KEYS[1], 'lostAt') == ARGV[1] then redis.call('HDEL', KEYS[1], 'lostAt') end`;

export class NodeRegistry {
  readonly #redis: Redis;
  readonly #reg: Registration;
  readonly #log: Logger;
  readonly #state: () => NodeState;
  readonly #rejoin: () => Promise<void>;
  #timer: NodeJS.Timeout | null = null;
  #drainRequested = false;

  constructor(o: {
    redis: Redis;
    registration: Registration;
    log: Logger;
    state: () => NodeState;
    /**
     * Called before a node the control plane declared lost (`lostAt` in its hash) announces itself
     * again: must destroy what the control plane ended meanwhile (fencing). The fence is lifted only
     * after it resolves; when it throws, the node stays fenced and the beat fails.
     */
    rejoin?: () => Promise<void>;
  }) {
    this.#rejoin = o.rejoin ?? (async () => {});
    this.#redis = o.redis;
    this.#reg = o.registration;
    this.#log = o.log;
    this.#state = o.state;
  }

  /** Writes one heartbeat now (after rejoining first when the node was declared lost). */
  async beat(): Promise<void> {
    const r = this.#reg;
    const [lostAt, drainRequestedAt] = await this.#redis.hmget(keys.node(r.id), 'lostAt', 'drainRequestedAt');
    this.#drainRequested = !!drainRequestedAt;
    if (lostAt) {
      this.#log.warn({ lostAt: Number(lostAt) }, 'node was declared lost; reconciling before rejoining');
      await this.#rejoin();
      // lift exactly the fence that was seen: one set again meanwhile stays for the next beat
      await this.#redis.eval(LIFT_FENCE, 1, keys.node(r.id), lostAt);
    }
    // taken before the inventory: every sandbox the API saw running before `at` is in it
    const at = Date.now();
    const s = this.#state();
    const nk = keys.node(r.id);
    const m = this.#redis
      .multi()
      .sadd(keys.nodeIndex(), r.id)
      .hset(nk, {
        id: r.id,
        url: r.url,
        driver: r.driver,
        capabilities: r.capabilities.join(','),
        protocol: String(r.protocol),
        version: r.version,
        vcpusMilli: String(Math.round(r.vcpus * 1000)),
        memoryMiB: String(r.memoryMiB),
        maxSandboxes: String(r.maxSandboxes),
        hibernateStore: r.hibernateStore,
        schedulable: s.schedulable ? '1' : '0',
        templates: s.templates.join(','),
        warmMemoryMiB: String(s.warmHeld.memoryMiB),
        warmSlotFootprintMiB: String(s.warmHeld.slotFootprintMiB),
        warmSlotVcpusMilli: String(s.warmHeld.slotVcpusMilli),
        warmSlotMemoryMiB: String(s.warmHeld.slotMemoryMiB),
        // '' when unknown; the API reads `schedulable` (these say why, and how much room is left)
        diskPressure: s.disk ? (s.disk.pressure ? '1' : '0') : '',
        diskFreeBytes: s.disk ? String(s.disk.freeBytes) : '',
        diskTotalBytes: s.disk ? String(s.disk.totalBytes) : '',
        heartbeatAt: String(Date.now()),
        inventoryAt: String(at),
      })
      // back: a restart's hold (stop()) is over
      .hdel(nk, 'restartBy')
      .hsetnx(nk, 'usedVcpusMilli', '0')
      .hsetnx(nk, 'usedMemoryMiB', '0')
      .hsetnx(nk, 'sandboxes', '0')
      .del(keys.nodeWarm(r.id))
      .del(keys.nodeInventory(r.id));
    if (s.sandboxes.length > 0) m.sadd(keys.nodeInventory(r.id), ...s.sandboxes);
    const warm = Object.entries(s.warm);
    if (warm.length > 0)
      m.hset(keys.nodeWarm(r.id), Object.fromEntries(warm.map(([t, n]) => [t, String(n)])));
    m.set(keys.nodeAlive(r.id), '1', 'PX', NODE_ALIVE_TTL_MS);
    await m.exec();
  }

  /**
   * Whether an operator asked the control plane to drain this node (`space nodes drain`: the
   * node hash's `drainRequestedAt`), as read by the last heartbeat; it outlives agent restarts.
   */
  get drainRequested(): boolean {
    return this.#drainRequested;
  }

  /** Beats now and then every `intervalMs`. */
  async start(intervalMs: number): Promise<void> {
    await this.beat();
    this.#timer = setInterval(() => {
      this.beat().catch((err: unknown) => this.#log.error({ err }, 'heartbeat failed'));
    }, intervalMs);
  }

  /**
   * Stops beating and marks the node unschedulable (drained: no new sandboxes). With `deregister`
   * (the node's sandboxes are being destroyed) it also stops counting as alive at once; without it
   * (a restart that keeps its sandboxes) the alive key simply expires, and the control plane
   * waits its node-lost grace before giving up on the sandboxes, so the next agent re-adopts them.
   * `restartHoldMs` > 0 (a restart, not a node going away) also writes `restartBy` (now + it,
   * epoch ms) to the node hash: the control plane does not declare the node lost before then
   * (api/reconciler.ts), so a restart slower than the grace kills nothing. The next heartbeat
   * removes it.
   */
  async stop(deregister: boolean, restartHoldMs = 0): Promise<void> {
    if (this.#timer) clearInterval(this.#timer);
    const m = this.#redis
      .multi()
      .hset(keys.node(this.#reg.id), 'schedulable', '0')
      .del(keys.nodeWarm(this.#reg.id));
    if (deregister) m.del(keys.nodeAlive(this.#reg.id));
    else if (restartHoldMs > 0)
      m.hset(keys.node(this.#reg.id), 'restartBy', String(Date.now() + restartHoldMs));
    await m.exec();
  }
}
