/**
 * The operation handlers that change sandboxes: create (place → dispatch → running), delete
 * (killing → destroy on the node → release → killed), pause (pausing → freeze or hibernate on the
 * node → paused) and resume (resuming → thaw, or place + restore → running). All are idempotent,
 * so a reclaimed operation can run again; a pause or resume that fails returns the sandbox to the
 * state it came from.
 *
 *
 * A delete is done only when the node confirmed it: while the node is unreachable (or its destroy
 * fails) the delete fails with a retryable code and the sandbox stays `killing`, its reservation
 * held — the node's own reconciliation destroys it when it speaks again and the control plane's
 * reconciler then finishes the delete. Only a node declared lost (fenced, see `NodeStore.isLost`)
 * is skipped: it destroys everything the control plane ended before it rejoins. A failed create
 * releases its reservation at once (its record says `killed`, so the node destroys whatever it
 * made). Dispatches end as soon as their node stops heartbeating (`NodeStore.whileAlive`).
 */
import { setTimeout as sleep } from 'node:timers/promises';
import type { Logger } from 'pino';
import { SpaceError } from '../core/errors.ts';
import { F } from '../core/log-fields.ts';
import { isRedisUnavailable } from '../core/redis-errors.ts';
import { inChildSpan } from '../core/tracing.ts';
import type { NodeInfo, OperationKind, PauseMode, SandboxState } from '../core/types.ts';
import { type EndReport, KILL_REASONS, type KillReason } from '../core/types.ts';
import { reportUsage, type UsageState } from '../core/usage.ts';
import type { AgentClient } from './agent-client.ts';
import type { CredentialStore } from './credential-store.ts';
import type { NodeStore } from './node-store.ts';
import type { OperationHandler, OperationRecord } from './operations.ts';
import { type SandboxRecord, type SandboxStore, sandboxFromHash } from './sandbox-store.ts';

/** Pause policy (from the API config). */
export interface PausePolicy {
  /** Mode of a pause that names none, and of every auto-pause. */
  mode: 'auto' | PauseMode;
  /** With `auto`: the node's reserved memory share (%) above which pauses hibernate. */
  hibernateAbovePercent: number;
  /** How long a paused sandbox is kept, s. */
  retentionSec: number;
}

export interface LifecycleDeps {
  sandboxes: SandboxStore;
  credentials: CredentialStore;
  nodes: NodeStore;
  agents: AgentClient;
  log: Logger;
  pause: PausePolicy;
  /** Told of every interval this process closes (metrics); optional. */
  onUsage?: (state: UsageState, closedMs: number) => void;
  /** Told of every pause/resume carried out (metrics); optional. */
  onLifecycle?: (kind: 'pause' | 'resume', mode: PauseMode, ok: boolean, ms: number) => void;
}

/** The first agent protocol with the pause and resume routes (core/agent-protocol.ts). */
export const PAUSE_PROTOCOL = 3;

/** How long a pause or resume waits for the other one, already under way, to settle (ms). */
const SETTLE_WAIT_MS = 120_000;

/** How long a pause or resume whose node stopped answering mid-call asks it again (ms). */
export const REDISPATCH_WAIT_MS = 120_000;
/** Pause between two such asks (ms). */
const REDISPATCH_EVERY_MS = 1_000;

/**
 * Records the sandbox's activity state change (metering); a Redis failure only logs. `agoMs`: the
 * change happened that long ago (the node's word for when its instance paused or ran again), see
 * `reportUsage`.
 */
async function meter(
  d: LifecycleDeps,
  rec: SandboxRecord,
  state: UsageState | 'ended',
  onlyIf?: UsageState,
  agoMs?: number,
) {
  await inChildSpan('redis.usage.report', { 'space.usage.state': state }, () =>
    reportUsage(d.sandboxes.redis, rec.id, state, onlyIf, agoMs),
  )
    .then((r) => {
      if (r.previous) d.onUsage?.(r.previous, r.closedMs);
    })
    .catch((err: unknown) => d.log.warn({ err, [F.sandboxId]: rec.id }, 'usage report failed'));
}

/**
 * Runs a pause or resume dispatch to node `nodeId` (the first ask goes to `read`, the node as the
 * caller just read it, when given), and when the node does not answer
 * (NODE_UNAVAILABLE: it died or restarted mid-call, so whether it carried the change out is
 * unknown) asks it again every {@link REDISPATCH_EVERY_MS} once it is alive, until it answers or
 * {@link REDISPATCH_WAIT_MS} passed since the first ask. The node's pause and resume are idempotent
 * and answer with the state it ended in (a restarted agent first settles what its predecessor left
 * half done, agent/sandboxes/adopt.ts), so the operation ends once, on the node's word (case F7).
 * @throws the last NODE_UNAVAILABLE when the node never answered; any other error at once.
 */
async function dispatchUntilAnswered<T>(
  d: LifecycleDeps,
  nodeId: string,
  call: (node: NodeInfo) => Promise<T>,
  log: Logger,
  read?: NodeInfo,
): Promise<T> {
  const until = Date.now() + REDISPATCH_WAIT_MS;
  for (let attempt = 1; ; attempt++) {
    try {
      return await call(attempt === 1 && read ? read : await d.nodes.requireAlive(nodeId));
    } catch (err) {
      if (!(err instanceof SpaceError) || err.code !== 'NODE_UNAVAILABLE' || Date.now() > until) throw err;
      if (attempt === 1)
        log.warn({ err, [F.nodeId]: nodeId }, 'node did not answer; asking again once it is back');
    }
    await sleep(REDISPATCH_EVERY_MS);
  }
}

/** Waits (bounded) until the sandbox leaves `transient`; returns the record then. */
async function settle(d: LifecycleDeps, id: string, transient: SandboxState): Promise<SandboxRecord | null> {
  const until = Date.now() + SETTLE_WAIT_MS;
  for (;;) {
    const rec = await d.sandboxes.get(id);
    if (!rec || rec.state !== transient || Date.now() > until) return rec;
    await sleep(50);
  }
}

/**
 * Destroys what exists of a sandbox and records it killed; safe to repeat. With `strict` (a
 * delete) the node must confirm the destroy — an unreachable node that is not declared lost, or a
 * failed destroy, throws and leaves the sandbox `killing` with its reservation; without it (cleanup
 * of a failed create) the destroy is best effort and the reservation is released whatever happens.
 * @throws SpaceError NODE_UNAVAILABLE / DRIVER_FAILED (strict only) when the node did not confirm.
 */
async function teardown(
  d: LifecycleDeps,
  id: string,
  reason: KillReason,
  opts: { strict: boolean; message?: string },
): Promise<void> {
  const rec = await d.sandboxes.get(id);
  if (!rec) return;
  let endedOnItsOwn: EndReport | undefined;
  if (rec.nodeId) {
    const nodeId = rec.nodeId;
    const node = await d.nodes.get(nodeId);
    try {
      if (node?.alive) {
        await d.nodes.whileAlive(nodeId, (signal) => d.agents.deleteSandbox(node, id, signal));
        // the node found it already ended on its own (a delete racing an OOM or a fork bomb): that
        // is why it ended, whatever the delete was asked for (R21)
        const ended = await d.sandboxes.takeEndReport(nodeId, id);
        if (ended) endedOnItsOwn = ended;
      } else if (!(await d.nodes.isLost(nodeId))) {
        throw new SpaceError(
          'NODE_UNAVAILABLE',
          `node ${nodeId} is not heartbeating; the delete will be retried`,
          {
            sandboxId: id,
            nodeId,
          },
        );
      }
      // a lost node is fenced: it destroys its ended sandboxes before it may rejoin
    } catch (err) {
      if (opts.strict) throw err;
      d.log.warn(
        { err, [F.sandboxId]: id, [F.nodeId]: nodeId },
        'destroy after failed create failed; the node reconciles it',
      );
    }
  } else if (rec.hibernation) {
    // hibernated: a node that reads its store removes the snapshot (a later agent start sweeps it
    // when none is up now)
    const reader = (await d.nodes.list()).find((n) => n.alive && n.hibernateStore === rec.hibernation?.store);
    if (reader) await d.agents.deleteSandbox(reader, id).catch(() => {});
  }
  await d.sandboxes.release(id);
  // keep what was said when it started ending (a crash the node described), else the reason's text
  await d.sandboxes.markKilled(
    id,
    endedOnItsOwn?.reason ?? reason,
    endedOnItsOwn?.message ?? opts.message ?? rec.endMessage ?? undefined,
  );
  await meter(d, rec, 'ended');
}

async function create(d: LifecycleDeps, op: OperationRecord, target: Record<string, string>): Promise<void> {
  const id = op.target;
  const log = d.log.child({ [F.sandboxId]: id, [F.operationId]: op.id });
  // as the run's start read it (operation-start.lua): no read of our own
  const rec = sandboxFromHash(target);
  if (!rec) throw new SpaceError('SANDBOX_NOT_FOUND', `sandbox ${id} vanished`);
  if (rec.state !== 'creating') {
    if (rec.state === 'running') return; // a previous run of this operation finished the work
    throw new SpaceError('SANDBOX_NOT_RUNNING', `sandbox ${id} is ${rec.state}; creation abandoned`, {
      sandboxId: id,
    });
  }
  // placed at admission (admit.lua); this finds its node again, liveness read through the outage
  // rule (a node whose alive key expired while Redis was away still has the sandbox it made)
  const placed = await d.sandboxes.place(rec, '', d.nodes.outage);
  if (placed.nodeId === null) {
    const err = new SpaceError(
      'NODE_CAPACITY_EXHAUSTED',
      placed.reason === 'no_nodes' ? 'no node is available' : 'no node has room for this sandbox',
      { sandboxId: id },
    );
    await d.sandboxes.markKilled(id, 'create_failed', err.message);
    throw err;
  }
  // place.lua changed only the node fields of the record: nothing below reads them from `rec`
  try {
    // place.lua answers with the node's URL and liveness: no read of the node before the dispatch
    if (!placed.alive) {
      throw new SpaceError('NODE_UNAVAILABLE', `node ${placed.nodeId} is not available`, {
        nodeId: placed.nodeId,
      });
    }
    const node = { id: placed.nodeId, url: placed.url };
    const credentials = await d.credentials.resolve(rec.grants);
    const req = {
      sandboxId: id,
      sessionId: rec.sessionId,
      template: rec.template,
      vcpus: rec.vcpus,
      memoryMiB: rec.memoryMiB,
      env: rec.env,
      expiresAtMs: rec.expiresAtMs,
      egress: rec.egress,
      credentials,
    };
    const out = await d.nodes.whileAlive(node.id, (signal) => d.agents.createSandbox(node, req, signal));
    const createdFrom = out.source ?? (out.fromWarmPool ? 'warm' : 'boot');
    const moved = await d.sandboxes.transition(id, 'running', {
      fromWarmPool: out.fromWarmPool ? '1' : '0',
      createdFrom,
    });
    if (!moved.ok) {
      // deleted while we were creating: the delete operation owns the teardown, but the agent
      // may have finished after it; destroy again (idempotent) so nothing is left behind
      await d.agents.deleteSandbox(node, id).catch(() => {});
      throw new SpaceError('SANDBOX_NOT_RUNNING', `sandbox ${id} was deleted while being created`, {
        sandboxId: id,
      });
    }
    log.info({ [F.nodeId]: node.id, createdFrom }, 'sandbox running');
    // Not awaited: the worker's finish follows on the same Redis connection, so Redis records the
    // idle interval before the operation reads as succeeded, and the create's answer does not wait
    // a round trip for it (a failure only logs, as before).
    void meter(d, rec, 'idle', undefined);
  } catch (err) {
    // Redis away is no reason to give the sandbox up: the worker runs this create again once Redis
    // is back (place.lua keeps the node, the agent answers a create it made with what it made)
    if (isRedisUnavailable(err)) throw err;
    const e =
      err instanceof SpaceError ? err : new SpaceError('INTERNAL', 'create failed', {}, { cause: err });
    if ((await d.sandboxes.get(id))?.state === 'creating') {
      await d.sandboxes.markKilling(id, 'create_failed');
      await teardown(d, id, 'create_failed', {
        strict: false,
        message: `creation failed: ${e.message}`,
      }).catch((cleanupErr) => log.error({ err: cleanupErr }, 'cleanup after failed create failed'));
    }
    throw e;
  }
}

async function remove(d: LifecycleDeps, op: OperationRecord): Promise<void> {
  const id = op.target;
  const reason = (KILL_REASONS as readonly string[]).includes(op.args.reason ?? '')
    ? (op.args.reason as KillReason)
    : 'request';
  const rec = await d.sandboxes.get(id);
  if (!rec || rec.state === 'killed') return;
  if (rec.state !== 'killing') await d.sandboxes.markKilling(id, reason);
  const current = await d.sandboxes.get(id);
  await teardown(d, id, (current?.killReason as KillReason | null) ?? reason, { strict: true });
  d.log.info({ [F.sandboxId]: id, reason }, 'sandbox killed');
}

/**
 * The mode a pause gets: the one asked for, else the policy's; `auto` hibernates when the node's
 * driver can snapshot and restore and its reserved memory is above the threshold. A node that
 * cannot snapshot only freezes. Pure.
 */
export function choosePauseMode(
  asked: string | undefined,
  node: Pick<NodeInfo, 'capabilities' | 'memoryMiB' | 'usedMemoryMiB'>,
  policy: PausePolicy,
): PauseMode {
  const canHibernate = node.capabilities.includes('snapshot') && node.capabilities.includes('restore');
  const want = asked === 'frozen' || asked === 'hibernated' ? asked : policy.mode;
  if (want === 'frozen') return 'frozen';
  if (want === 'hibernated') {
    if (!canHibernate) {
      throw new SpaceError(
        'SNAPSHOT_UNSUPPORTED',
        'the sandbox’s node cannot hibernate sandboxes (no snapshots)',
      );
    }
    return 'hibernated';
  }
  const share = node.memoryMiB > 0 ? (100 * node.usedMemoryMiB) / node.memoryMiB : 0;
  return canHibernate && share > policy.hibernateAbovePercent ? 'hibernated' : 'frozen';
}

async function pause(d: LifecycleDeps, op: OperationRecord): Promise<void> {
  const id = op.target;
  const log = d.log.child({ [F.sandboxId]: id, [F.operationId]: op.id });
  let rec = await d.sandboxes.get(id);
  if (rec?.state === 'resuming') rec = await settle(d, id, 'resuming');
  if (!rec) throw new SpaceError('SANDBOX_NOT_FOUND', `sandbox ${id} vanished`);
  if (rec.state === 'paused') {
    // already paused (or a previous run of this operation got this far): finish its bookkeeping
    if (rec.pause?.mode === 'hibernated' && rec.nodeId) await d.sandboxes.unplace(id);
    return;
  }
  if (rec.state !== 'running' && rec.state !== 'pausing') {
    throw new SpaceError('SANDBOX_NOT_RUNNING', `sandbox ${id} is ${rec.state}; it cannot be paused`, {
      sandboxId: id,
      state: rec.state,
    });
  }
  const node = await d.nodes.requireAlive(rec.nodeId ?? '');
  // mixed versions during an upgrade: an agent before protocol 3 has no pause route (a 404 there
  // would read as a lost sandbox); refuse before the record moves, so the sandbox keeps running
  if ((node.protocol ?? 0) < PAUSE_PROTOCOL) {
    throw new SpaceError(
      'NODE_UNSUPPORTED',
      `node ${node.id} runs agent protocol ${node.protocol ?? 0}; pausing needs ${PAUSE_PROTOCOL} (upgrade the node)`,
      { sandboxId: id, nodeId: node.id },
    );
  }
  const mode = choosePauseMode(op.args.mode, node, d.pause);
  const reason = op.args.reason === 'idle' || op.args.reason === 'timeout' ? op.args.reason : 'request';
  if (rec.state === 'running') {
    const moved = await d.sandboxes.transition(id, 'pausing', {
      pauseMode: mode,
      pauseReason: reason,
      retentionMs: String(d.pause.retentionSec * 1000),
    });
    if (!moved.ok) {
      throw new SpaceError('SANDBOX_NOT_RUNNING', `sandbox ${id} is ${moved.current}; it cannot be paused`, {
        sandboxId: id,
        state: moved.current,
      });
    }
  }
  const started = Date.now();
  let out: Awaited<ReturnType<AgentClient['pauseSandbox']>>;
  try {
    out = await dispatchUntilAnswered(d, node.id, (n) => d.agents.pauseSandbox(n, id, { mode }), log, node);
  } catch (err) {
    if (isRedisUnavailable(err)) throw err;
    await d.sandboxes.transition(id, 'running');
    d.onLifecycle?.('pause', mode, false, Date.now() - started);
    throw err;
  }
  d.onLifecycle?.('pause', out.mode, true, Date.now() - started);
  const fields: Record<string, string> = { pauseMode: out.mode };
  if (out.hibernation) {
    fields.hibernateStore = out.hibernation.store;
    fields.hibernatePath = out.hibernation.path;
  }
  const moved = await d.sandboxes.transition(id, 'paused', fields);
  if (!moved.ok) {
    // deleted meanwhile: its delete operation destroys what the node holds
    throw new SpaceError('SANDBOX_NOT_RUNNING', `sandbox ${id} was deleted while being paused`, {
      sandboxId: id,
    });
  }
  if (out.mode === 'hibernated') await d.sandboxes.unplace(id);
  // paused from when the node's instance stopped running, whichever run of this operation (on
  // whichever API) hears of it: a pause finished after an API died is not billed active (F9)
  await meter(d, rec, 'paused', undefined, out.pausedForMs);
  log.info({ mode: out.mode, reason, [F.durationMs]: Date.now() - started }, 'sandbox paused');
}

/**
 * The running lifetime a paused sandbox gets back when it resumes, s: what was left when it paused,
 * or its whole `timeoutSec` when the end of its lifetime paused it (`onTimeout: 'pause'`, as E2B
 * restarts it). transition.lua applies the same rule to the record.
 */
export function runningLeftSec(rec: SandboxRecord): number {
  if (!rec.pause || rec.pause.reason === 'timeout') return rec.timeoutSec;
  return rec.pause.timeLeftSec;
}

async function resume(d: LifecycleDeps, op: OperationRecord): Promise<void> {
  const id = op.target;
  const log = d.log.child({ [F.sandboxId]: id, [F.operationId]: op.id });
  let rec = await d.sandboxes.get(id);
  if (rec?.state === 'pausing') rec = await settle(d, id, 'pausing');
  if (!rec) throw new SpaceError('SANDBOX_NOT_FOUND', `sandbox ${id} vanished`);
  if (rec.state === 'running') {
    // its node confirms the instance runs (and thaws one left frozen, e.g. by an agent killed
    // mid-pause): a resume that succeeds means the sandbox runs
    const node = await d.nodes.requireAlive(rec.nodeId ?? '');
    if ((node.protocol ?? 0) >= PAUSE_PROTOCOL) await d.agents.resumeSandbox(node, id, {});
    return;
  }
  if (rec.state !== 'paused' && rec.state !== 'resuming') {
    throw new SpaceError('SANDBOX_NOT_RUNNING', `sandbox ${id} is ${rec.state}; it cannot be resumed`, {
      sandboxId: id,
      state: rec.state,
    });
  }
  if (rec.state === 'paused') {
    const moved = await d.sandboxes.transition(id, 'resuming');
    if (!moved.ok) {
      throw new SpaceError('SANDBOX_NOT_RUNNING', `sandbox ${id} is ${moved.current}`, {
        sandboxId: id,
        state: moved.current,
      });
    }
  }
  const started = Date.now();
  const hib = rec.pause?.mode === 'hibernated' ? rec.hibernation : null;
  let nodeId = rec.nodeId;
  let runningForMs: number | undefined;
  try {
    if (hib) {
      const placed = await d.sandboxes.place(rec, hib.store, d.nodes.outage);
      if (placed.nodeId === null) {
        throw new SpaceError(
          'NODE_CAPACITY_EXHAUSTED',
          'no node that reads its snapshot has room for the sandbox',
          {
            sandboxId: id,
            store: hib.store,
          },
        );
      }
      nodeId = placed.nodeId;
      const cur = (await d.sandboxes.get(id)) ?? rec;
      const credentials = await d.credentials.resolve(cur.grants);
      const answer = await dispatchUntilAnswered(
        d,
        nodeId,
        (node) =>
          d.agents.resumeSandbox(node, id, {
            restore: {
              sandboxId: id,
              sessionId: cur.sessionId,
              template: cur.template,
              vcpus: cur.vcpus,
              memoryMiB: cur.memoryMiB,
              env: cur.env,
              expiresAtMs: Date.now() + runningLeftSec(cur) * 1000,
              egress: cur.egress,
              credentials,
              hibernation: hib,
            },
          }),
        log,
      );
      runningForMs = answer.runningForMs;
    } else {
      const answer = await dispatchUntilAnswered(
        d,
        rec.nodeId ?? '',
        (node) => d.agents.resumeSandbox(node, id, {}),
        log,
      );
      runningForMs = answer.runningForMs;
    }
  } catch (err) {
    // Redis away: the worker runs the resume again once it is back (the sandbox stays `resuming`)
    if (isRedisUnavailable(err)) throw err;
    const e =
      err instanceof SpaceError ? err : new SpaceError('INTERNAL', 'resume failed', {}, { cause: err });
    if (!hib && (e.code === 'SANDBOX_NOT_FOUND' || e.code === 'INSTANCE_LOST')) {
      // the frozen instance is gone from its node: the sandbox cannot come back
      if ((await d.sandboxes.markKilling(id, 'crashed')).ok) {
        await teardown(d, id, 'crashed', {
          strict: false,
          message: `its instance was gone when it was resumed: ${e.message}`,
        }).catch((cleanupErr: unknown) =>
          log.error({ err: cleanupErr }, 'cleanup after failed resume failed'),
        );
      }
      throw e;
    }
    if (hib) await d.sandboxes.unplace(id);
    await d.sandboxes.transition(id, 'paused');
    d.onLifecycle?.('resume', hib ? 'hibernated' : 'frozen', false, Date.now() - started);
    throw e;
  }
  d.onLifecycle?.('resume', hib ? 'hibernated' : 'frozen', true, Date.now() - started);
  const moved = await d.sandboxes.transition(id, 'running');
  if (!moved.ok) {
    throw new SpaceError('SANDBOX_NOT_RUNNING', `sandbox ${id} was deleted while being resumed`, {
      sandboxId: id,
    });
  }
  await meter(d, rec, 'idle', 'paused', runningForMs);
  log.info(
    { mode: rec.pause?.mode, [F.nodeId]: nodeId, [F.durationMs]: Date.now() - started },
    'sandbox resumed',
  );
}

/** The handler table of the operation worker. */
export function lifecycleHandlers(d: LifecycleDeps): Record<OperationKind, OperationHandler> {
  return {
    'sandbox.create': (op, target) => create(d, op, target),
    'sandbox.delete': (op) => remove(d, op),
    'sandbox.pause': (op) => pause(d, op),
    'sandbox.resume': (op) => resume(d, op),
  };
}
