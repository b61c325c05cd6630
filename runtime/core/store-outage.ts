/**
 * The control plane's memory of its own Redis outages, and the one rule that reads a node's
 * silence through them. While Redis is away no node can heartbeat, so a node's alive key
 * (`node:<id>:alive`, TTL {@link NODE_ALIVE_TTL_MS}) may expire through no fault of the node. A
 * node counts as silent only since its last heartbeat or the end of the outage, whichever is later:
 * - liveness (placement, dispatch, pause, delete): a node without its alive key is *presumed alive*
 *   when it was alive as the outage began and the outage ended less than one alive TTL ago — it has
 *   not yet had a full TTL of reachable Redis to heartbeat in ({@link StoreOutage.presumedAlive});
 *   place.lua applies the same rule from the same figures ({@link StoreOutage.luaArgs});
 * - loss (the reconciler's node-lost grace): silence counts from the outage's end
 *   ({@link StoreOutage.silentFor}).
 * The router reads the same rule before it forwards to a sandbox's node. One instance per process
 * (API, router), fed by its Redis connections' events and by the failures its loops see; it only
 * knows what this process saw (a process started after an outage judges strictly).
 */
import type { Redis } from 'ioredis';
import { NODE_ALIVE_TTL_MS } from './redis-keys.ts';

export class StoreOutage {
  /** When the last outage began (epoch ms; 0: none seen). */
  #began = 0;
  /** The last moment Redis was known to be away, or when it answered again after that (epoch ms). */
  #ended = 0;
  #down = false;

  /**
   * Redis could not be reached at `now` (epoch ms). A failure more than one alive TTL after the
   * last one seen begins a new outage (a loop that saw failures may never see the recovery).
   */
  down(now = Date.now()): void {
    if (!this.#down || now - this.#ended > NODE_ALIVE_TTL_MS) this.#began = now;
    this.#down = true;
    this.#ended = Math.max(this.#ended, now);
  }

  /** Redis answered again at `now` (epoch ms): the outage, if one was under way, ends. */
  up(now = Date.now()): void {
    if (!this.#down) return;
    this.#down = false;
    this.#ended = Math.max(this.#ended, now);
  }

  /** When Redis was last known to be away (epoch ms; 0: never). */
  get lastAt(): number {
    return this.#ended;
  }

  /**
   * Whether a node whose alive key is missing is still presumed alive at `now`: it heartbeat
   * (`heartbeatAtMs`, its hash's `heartbeatAt`, epoch ms) within one alive TTL before the outage
   * began, and the outage ended less than one alive TTL ago. A node fenced as lost never is:
   * {@link nodeAlive} applies the whole rule.
   */
  presumedAlive(heartbeatAtMs: number, now = Date.now()): boolean {
    if (this.#ended === 0) return false;
    return heartbeatAtMs >= this.#began - NODE_ALIVE_TTL_MS && now - this.#ended < NODE_ALIVE_TTL_MS;
  }

  /**
   * Whether a node counts as alive at `now`, from what Redis holds of it: its alive key (`aliveKey`:
   * present), else, when its hash has no `lostAt` fence, the outage's presumption
   * ({@link presumedAlive}) from its hash's `heartbeatAt` (absent: never heard). The rule every
   * reader of liveness in TypeScript applies (node store, router); place.lua's copy is
   * placement-lib.lua's `node_up`.
   */
  nodeAlive(
    aliveKey: boolean,
    heartbeatAt: string | null | undefined,
    lostAt: string | null | undefined,
    now = Date.now(),
  ): boolean {
    return aliveKey || (!lostAt && this.presumedAlive(Number(heartbeatAt ?? 0), now));
  }

  /** How long a node last heard at `heartbeatAtMs` (epoch ms) has been silent at `now`, outages excluded (ms). */
  silentFor(heartbeatAtMs: number, now = Date.now()): number {
    return now - Math.max(heartbeatAtMs, this.#ended);
  }

  /**
   * The rule's figures as place.lua takes them (ARGV, decimal strings): the outage's beginning and
   * end, now (epoch ms) and the alive TTL (ms).
   */
  luaArgs(now = Date.now()): [string, string, string, string] {
    return [String(this.#began), String(this.#ended), String(now), String(NODE_ALIVE_TTL_MS)];
  }

  /**
   * Follows `conn`'s connection: an `error` event is Redis away, `ready` after it Redis back.
   * Returns `conn`.
   */
  watch(conn: Redis): Redis {
    conn.on('error', () => this.down());
    conn.on('ready', () => this.up());
    return conn;
  }
}
