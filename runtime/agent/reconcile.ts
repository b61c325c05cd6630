/**
 * The node's half of two-way reconciliation: the agent compares what it runs with the control
 * plane's records and converges on them. A sandbox whose record is gone, ending (`killing`,
 * `killed`) or placed on another node is destroyed here; one the control plane still wants on this
 * node but holds no reservation for is registered again; one frozen here whose record says it runs
 * is thawed, and one running here whose record says frozen is frozen (a pause or resume whose
 * operation failed after the node carried it out, e.g. an agent killed mid-pause: case F7). Runs at start (after re-adoption), every
 * {@link AgentReconciler.start} interval, and — as fencing — before a node the control plane
 * declared lost (`lostAt` in its node hash) announces itself alive again: such a node first
 * destroys every sandbox the control plane ended while it was away. Each action is a log line
 * (`sandbox destroyed by reconciliation` / `sandbox re-registered by reconciliation`) and a count
 * in {@link AgentReconciler.metric} (`space_agent_reconciled_total{action}`).
 */
import { readFileSync } from 'node:fs';
import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import { Counter } from 'prom-client';
import { F } from '../core/log-fields.ts';
import { keys } from '../core/redis-keys.ts';
import type { SandboxManager } from './sandboxes/manager.ts';

/** The control plane's record of a sandbox as reconciliation reads it (null fields: absent). */
export interface RecordView {
  state: string | null;
  /** The record's pause mode (`frozen`, `hibernated`), when it was ever paused. */
  pauseMode?: string | null;
  nodeId: string | null;
  released: string | null;
  /** Whether the sandbox is in the node's placed set (holds a reservation there). */
  placed: boolean;
}

/** What to do with a sandbox this node runs. */
export type ReconcileAction = 'keep' | 'destroy' | 'reregister' | 'thaw' | 'freeze';

/**
 * Decides what this node does with one sandbox it runs, from the control plane's record and
 * whether the node holds it frozen (`frozen`). Pause and resume in flight (`pausing`, `resuming`)
 * are left to their operation. Pure.
 * @returns the action and, for anything but `keep`, why (for the log line).
 */
export function reconcileAction(
  rec: RecordView,
  nodeId: string,
  frozen = false,
): { action: ReconcileAction; why: string } {
  const placement = placementAction(rec, nodeId);
  if (placement.action !== 'keep' || rec.nodeId !== nodeId) return placement;
  if (frozen && rec.state === 'running') return { action: 'thaw', why: 'frozen but its record is running' };
  if (!frozen && rec.state === 'paused' && rec.pauseMode === 'frozen') {
    return { action: 'freeze', why: 'running but its record is paused (frozen)' };
  }
  return placement;
}

function placementAction(rec: RecordView, nodeId: string): { action: ReconcileAction; why: string } {
  if (rec.state === null) return { action: 'destroy', why: 'no record' };
  if (rec.state === 'killing' || rec.state === 'killed')
    return { action: 'destroy', why: `record is ${rec.state}` };
  if (rec.nodeId && rec.nodeId !== nodeId) return { action: 'destroy', why: `placed on ${rec.nodeId}` };
  // a create in flight owns its record until it settles
  if (rec.state === 'creating') return { action: 'keep', why: '' };
  if (rec.nodeId === nodeId && (rec.released === '1' || !rec.placed)) {
    return { action: 'reregister', why: 'live but holds no reservation' };
  }
  return { action: 'keep', why: '' };
}

const REREGISTER = readFileSync(new URL('./scripts/reregister.lua', import.meta.url), 'utf8');

/** Runs reconciliation passes for one node. */
export class AgentReconciler {
  readonly #redis: Redis;
  readonly #nodeId: string;
  readonly #sandboxes: SandboxManager;
  readonly #log: Logger;
  /**
   * Actions taken, by `action` (`destroyed`, `reregistered`, `thawed`, `frozen`, `failed`); the
   * agent app registers it.
   */
  readonly metric = new Counter({
    name: 'space_agent_reconciled_total',
    help: 'Sandboxes this node destroyed, re-registered, thawed or froze because the control plane disagreed.',
    labelNames: ['action'],
    registers: [],
  });
  #timer: NodeJS.Timeout | null = null;
  #running: Promise<void> | null = null;

  constructor(o: { redis: Redis; nodeId: string; sandboxes: SandboxManager; log: Logger }) {
    this.#redis = o.redis;
    this.#nodeId = o.nodeId;
    this.#sandboxes = o.sandboxes;
    this.#log = o.log;
  }

  /**
   * One pass over the sandboxes this node runs (creates in flight are left to their operation).
   * Passes never overlap: a call while one runs waits for it and runs again.
   * @returns the ids destroyed and re-registered. Throws when Redis cannot be read.
   */
  async pass(): Promise<{ destroyed: string[]; reregistered: string[] }> {
    while (this.#running) await this.#running.catch(() => {});
    let result: { destroyed: string[]; reregistered: string[] } = { destroyed: [], reregistered: [] };
    this.#running = (async () => {
      result = await this.#pass();
    })();
    try {
      await this.#running;
    } finally {
      this.#running = null;
    }
    return result;
  }

  async #pass(): Promise<{ destroyed: string[]; reregistered: string[] }> {
    const ids = this.#sandboxes.list().map((sb) => sb.id);
    const destroyed: string[] = [];
    const reregistered: string[] = [];
    if (ids.length === 0) return { destroyed, reregistered };
    const m = this.#redis.multi();
    for (const id of ids) {
      m.hmget(keys.sandbox(id), 'state', 'nodeId', 'released', 'pauseMode');
      m.sismember(keys.nodeSandboxes(this.#nodeId), id);
    }
    const rows = (await m.exec()) ?? [];
    for (const [i, id] of ids.entries()) {
      const [e1, f] = rows[i * 2] ?? [];
      const [e2, member] = rows[i * 2 + 1] ?? [];
      if (e1 || e2 || !f) throw e1 ?? e2 ?? new Error('reconciliation read failed');
      const [state, nodeId, released, pauseMode] = f as (string | null)[];
      const { action, why } = reconcileAction(
        {
          state: state ?? null,
          nodeId: nodeId ?? null,
          released: released ?? null,
          placed: member === 1,
          pauseMode: pauseMode ?? null,
        },
        this.#nodeId,
        this.#sandboxes.find(id)?.paused === 'frozen',
      );
      const log = this.#log.child({ [F.sandboxId]: id });
      if (action === 'destroy') {
        try {
          await this.#sandboxes.delete(id);
          this.metric.inc({ action: 'destroyed' });
          destroyed.push(id);
          log.warn({ why, state }, 'sandbox destroyed by reconciliation');
        } catch (err) {
          this.metric.inc({ action: 'failed' });
          log.error({ err, why }, 'reconciliation could not destroy a sandbox; retrying next pass');
        }
      } else if (action === 'thaw' || action === 'freeze') {
        const want = action === 'thaw' ? 'running' : 'paused';
        try {
          const changed = await this.#sandboxes.convergePause(
            id,
            action === 'thaw' ? 'running' : 'frozen',
            // read again inside the sandbox's serial section: a pause or resume dispatched since wins
            async () => (await this.#redis.hget(keys.sandbox(id), 'state')) === want,
          );
          if (changed) {
            this.metric.inc({ action: action === 'thaw' ? 'thawed' : 'frozen' });
            log.warn({ why, state }, `sandbox ${action === 'thaw' ? 'thawed' : 'frozen'} by reconciliation`);
          }
        } catch (err) {
          this.metric.inc({ action: 'failed' });
          log.error({ err, why }, 'reconciliation could not bring a sandbox to its recorded state');
        }
      } else if (action === 'reregister') {
        const done = await this.#redis.eval(
          REREGISTER,
          3,
          keys.sandbox(id),
          keys.node(this.#nodeId),
          keys.nodeSandboxes(this.#nodeId),
          this.#nodeId,
        );
        if (done === 1) {
          this.metric.inc({ action: 'reregistered' });
          reregistered.push(id);
          log.warn({ why, state }, 'sandbox re-registered by reconciliation');
        }
      }
    }
    return { destroyed, reregistered };
  }

  /** Runs a pass every `intervalMs` (errors are logged; the next pass tries again). */
  start(intervalMs: number): void {
    this.#timer = setInterval(() => {
      if (this.#running) return;
      this.pass().catch((err: unknown) => this.#log.warn({ err }, 'reconciliation pass failed'));
    }, intervalMs);
  }

  /** Stops the timer and waits for a pass in progress. */
  async stop(): Promise<void> {
    if (this.#timer) clearInterval(this.#timer);
    await this.#running?.catch(() => {});
  }
}
