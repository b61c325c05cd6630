/**
 * Where a sandbox is served: its record in Redis names its node, the node's registration names
 * the agent's URL. A sandbox that is not running is waited for through `ensureRunning` (which
 * asks for a resume when it is paused), so a request for a paused sandbox is served once it runs.
 * Nothing is cached: a sandbox that resumes on another node is found there on the next request.
 */
import type { Redis } from 'ioredis';
import { SpaceError } from '../core/errors.ts';
import { ensureRunning } from '../core/lifecycle-requests.ts';
import { keys } from '../core/redis-keys.ts';
import { StoreOutage } from '../core/store-outage.ts';
import { DEFAULT_TEAM } from '../core/tenancy.ts';
import type { RouterMetrics } from './metrics.ts';

/** The agent that serves a running sandbox. */
export interface SandboxUpstream {
  sandboxId: string;
  nodeId: string;
  /** Base URL of the node's agent (`http://10.0.0.5:8081`). */
  url: string;
  /** True when this request had to wait for the sandbox to resume. */
  resumed: boolean;
}

/** States a request waits through with a resume (any other non-running state is not waited for). */
const RESUMABLE = new Set(['paused', 'pausing', 'resuming']);

export class SandboxLocator {
  readonly #redis: Redis;
  readonly #metrics: RouterMetrics;
  readonly #resumeTimeoutMs: number;
  /** This process's Redis outages: a node's alive key that expired during one is not its death. */
  readonly #outage: StoreOutage;

  /** `opts.outage` defaults to one that follows `redis`'s connection events. */
  constructor(redis: Redis, metrics: RouterMetrics, opts: { resumeTimeoutMs: number; outage?: StoreOutage }) {
    this.#redis = redis;
    this.#metrics = metrics;
    this.#resumeTimeoutMs = opts.resumeTimeoutMs;
    this.#outage = opts.outage ?? new StoreOutage();
    if (!opts.outage) this.#outage.watch(redis);
  }

  /**
   * The agent serving sandbox `id` of team `opts.team` (the session token's), resuming it first when it is paused (or `afterPaused`: the
   * agent just answered SANDBOX_PAUSED although the record said running). Two Redis round trips
   * when it runs; while it resumes, polls at most `resumeTimeoutMs`.
   * @throws SpaceError SANDBOX_NOT_FOUND (also: the sandbox is another team's); SANDBOX_NOT_RUNNING (ending, or its resume failed);
   *   SANDBOX_PAUSED (it did not run within the timeout); NODE_UNAVAILABLE (its node has no
   *   registration or stopped heartbeating — not counting a Redis outage: core/store-outage.ts).
   */
  async locate(id: string, opts: { team: string; afterPaused?: boolean }): Promise<SandboxUpstream> {
    let [state, nodeId, team] = await this.#redis.hmget(keys.sandbox(id), 'state', 'nodeId', 'team');
    // another team's sandbox reads as absent, before anything happens to it (no resume)
    if (!state || (team || DEFAULT_TEAM) !== opts.team) {
      throw new SpaceError('SANDBOX_NOT_FOUND', `no sandbox ${id}`, { sandboxId: id });
    }
    let resumed = false;
    if (state !== 'running' || opts.afterPaused) {
      if (RESUMABLE.has(state) || opts.afterPaused) {
        resumed = true;
        nodeId = await this.#resume(id);
      } else {
        // creating (wait for it, as a client would) or ending (ensureRunning says so)
        nodeId = (await ensureRunning(this.#redis, id, { timeoutMs: this.#resumeTimeoutMs })).nodeId;
      }
      state = 'running';
    }
    if (!nodeId) {
      throw new SpaceError('SANDBOX_NOT_RUNNING', `sandbox ${id} has no node`, { sandboxId: id, state });
    }
    const [[, node], [, alive]] = (await this.#redis
      .multi()
      .hmget(keys.node(nodeId), 'url', 'heartbeatAt', 'lostAt')
      .exists(keys.nodeAlive(nodeId))
      .exec()) as [[null, (string | null)[]], [null, number]];
    const [url, heartbeatAt, lostAt] = node;
    // the outage rule (core/store-outage.ts): a key that expired while Redis was away is not death
    const up = this.#outage.nodeAlive(alive === 1, heartbeatAt, lostAt);
    if (!url || !up) {
      throw new SpaceError('NODE_UNAVAILABLE', `node ${nodeId} of sandbox ${id} is not available`, {
        sandboxId: id,
        nodeId,
      });
    }
    return { sandboxId: id, nodeId, url, resumed };
  }

  /** Resumes `id` (or waits for the resume under way); returns its node. Records count and latency. */
  async #resume(id: string): Promise<string> {
    const started = performance.now();
    try {
      const loc = await ensureRunning(this.#redis, id, {
        timeoutMs: this.#resumeTimeoutMs,
        reason: 'traffic',
      });
      this.#metrics.resumes.inc({ outcome: 'resumed' });
      this.#metrics.resumeSeconds.observe((performance.now() - started) / 1000);
      return loc.nodeId;
    } catch (err) {
      const timeout = err instanceof SpaceError && err.code === 'SANDBOX_PAUSED';
      this.#metrics.resumes.inc({ outcome: timeout ? 'timeout' : 'failed' });
      throw err;
    }
  }
}
