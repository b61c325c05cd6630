/**
 * Operations: the asynchronous half of every lifecycle change. An operation is written to Redis
 * and queued on a Redis stream in one step (a MULTI, or the script that writes what it acts on: a
 * sandbox's create is written by admit.lua with the sandbox); any API replica's worker picks it up.
 *
 * Each operation ends once. A run starts with `operation-start.lua`, which hands out a fencing
 * token (the run number); only the latest run may finish it, and only while it is unfinished
 * (`operation-finish.lua`), so a finished operation never changes state again. While a worker runs
 * an operation it renews its claim on the queue entry every {@link LEASE_RENEW_MS}; another
 * replica reclaims the entry (XAUTOCLAIM) only after it sat unrenewed for {@link RECLAIM_IDLE_MS}
 * — i.e. only when its owner died or lost Redis, never while the owner still works on it. Handlers
 * are idempotent (the node recognises a dispatch it already carried out), so a reclaimed
 * operation can run again. A Redis outage is never an outcome: the owner retries its bookkeeping
 * and runs a handler that failed only for want of Redis again (a new run) once Redis answers.
 * All of this is generic over operation kinds.
 */
import { EventEmitter } from 'node:events';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import { SpaceError } from '../core/errors.ts';
import { newId } from '../core/ids.ts';
import { F } from '../core/log-fields.ts';
import { isRedisUnavailable } from '../core/redis-errors.ts';
import { KEY_PREFIX, keys, OPERATION_GROUP, OPERATION_TTL_SEC } from '../core/redis-keys.ts';
import { awaitReplicas, type ReplicaAck } from '../core/replica-ack.ts';
import { currentTraceparent, inChildSpan, inSpan, recordSpan, traceContextFrom } from '../core/tracing.ts';
import type { Operation, OperationKind, OperationState } from '../core/types.ts';
import { flatToHash, type ScriptedRedis, withScripts } from './redis-scripts.ts';

/** A pending entry not renewed by its owner for this long is taken over by another worker (ms). */
export const RECLAIM_IDLE_MS = 30_000;
/** How often a worker renews its claim on the entries it is running (ms): well inside the reclaim idle time. */
export const LEASE_RENEW_MS = RECLAIM_IDLE_MS / 6;
/** Longest long-poll a client may ask for (ms). */
export const MAX_WAIT_MS = 60_000;

/** Operation plus the arguments its handler needs. */
export interface OperationRecord extends Operation {
  /** Handler arguments (e.g. the kill reason), JSON in Redis. */
  args: Record<string, string>;
  /**
   * Team owning the operation's sandbox, copied when the operation is written; null for
   * operations written before teams (their target sandbox's team then decides).
   */
  team: string | null;
  /** W3C `traceparent` of the request that queued it (tracing on), so the worker's spans join it. */
  traceparent?: string;
}

const iso = (ms: string | undefined) => new Date(Number(ms ?? 0)).toISOString();

function fromHash(h: Record<string, string>): OperationRecord | null {
  if (!h.id) return null;
  return {
    id: h.id,
    kind: h.kind as OperationKind,
    target: h.target ?? '',
    state: h.state as OperationState,
    error: h.errorCode ? { code: h.errorCode, message: h.errorMessage ?? '' } : null,
    createdAt: iso(h.createdAt),
    updatedAt: iso(h.updatedAt),
    args: JSON.parse(h.args ?? '{}') as Record<string, string>,
    team: h.team || null,
    ...(h.traceparent ? { traceparent: h.traceparent } : {}),
  };
}

/** An operation drafted but not written yet ({@link OperationStore.draft}). */
export interface DraftOperation {
  /** The operation as it will read once written. */
  record: OperationRecord;
  /** The fields of its Redis hash (`operation:<id>`). */
  hash: Record<string, string>;
}

/** Public JSON of an operation. */
export function operationToPublic(op: OperationRecord): Operation {
  const { args: _args, team: _team, traceparent: _tp, ...pub } = op;
  return pub;
}

export class OperationStore {
  readonly redis: ScriptedRedis;
  constructor(redis: Redis) {
    this.redis = withScripts(redis);
  }

  /**
   * A pending operation of team `team` (its target's), not yet written: `hash` is what Redis is to
   * hold, `record` the same as read back. Written by {@link enqueue}, or by a script that writes it
   * in the same step as what it acts on (admit.lua: a sandbox and its create). Pure but for the id
   * and the clock.
   */
  draft(kind: OperationKind, target: string, args: Record<string, string>, team: string): DraftOperation {
    const id = newId('op');
    const now = String(Date.now());
    const traceparent = currentTraceparent();
    const hash: Record<string, string> = {
      id,
      kind,
      target,
      state: 'pending',
      args: JSON.stringify(args),
      createdAt: now,
      updatedAt: now,
      team,
      ...(traceparent ? { traceparent } : {}),
    };
    // what is to be written, without reading it back (one round trip less on every create)
    return { record: fromHash(hash)!, hash };
  }

  /** Writes a pending operation of team `team` (its target's) and queues it, atomically. */
  async enqueue(
    kind: OperationKind,
    target: string,
    args: Record<string, string>,
    team: string,
  ): Promise<OperationRecord> {
    const { record, hash } = this.draft(kind, target, args, team);
    await this.redis
      .multi()
      .hset(keys.operation(record.id), hash)
      .xadd(keys.operationQueue(), '*', 'id', record.id)
      .exec();
    return record;
  }

  async get(id: string): Promise<OperationRecord | null> {
    return fromHash(await this.redis.hgetall(keys.operation(id)));
  }

  /**
   * Starts a run of operation `id` for `owner` (a worker id): moves it to `running` and returns the
   * run's fencing token with the operation as it is now and, for a `sandbox.*` operation, its target
   * sandbox's Redis hash as it is now (`{}` when it has none) — one round trip, no read before — or
   * null when the operation is unknown or already finished.
   */
  async start(
    id: string,
    owner: string,
    now = Date.now(),
  ): Promise<{ run: number; op: OperationRecord; target: Record<string, string> } | null> {
    const [run, opFlat = [], targetFlat = []] = await this.redis.spaceOperationStart(
      keys.operation(id),
      keys.operationChannel(id),
      String(now),
      owner,
      KEY_PREFIX,
    );
    if (run <= 0) return null;
    const op = fromHash(flatToHash(opFlat));
    return op ? { run, op, target: flatToHash(targetFlat) } : null;
  }

  /**
   * Ends operation `id` as `succeeded` or `failed` (with `error`) if run `run` is still its latest
   * run and it has not ended yet; announces the change to long-pollers. Returns false when nothing
   * changed (it had ended, or a newer run owns it): an ended operation never changes again. With
   * `entryId` (the caller's queue entry), the same step acknowledges and deletes that entry,
   * whatever the outcome.
   */
  async finish(
    id: string,
    run: number,
    state: 'succeeded' | 'failed',
    error?: SpaceError,
    now = Date.now(),
    entryId = '',
  ): Promise<boolean> {
    const done = await this.redis.spaceOperationFinish(
      keys.operation(id),
      keys.operationChannel(id),
      keys.operationQueue(),
      state,
      String(run),
      String(now),
      String(OPERATION_TTL_SEC),
      error?.code ?? '',
      error?.message ?? '',
      OPERATION_GROUP,
      entryId,
    );
    return done === 1;
  }
}

const TERMINAL: ReadonlySet<OperationState> = new Set(['succeeded', 'failed']);

/**
 * The finished operation a channel message carries (operation-finish.lua publishes HGETALL's flat
 * field/value array as JSON), or null for any other message (`running`, an older API's bare state).
 * Pure.
 */
export function publishedRecord(message: string): OperationRecord | null {
  if (!message.startsWith('[')) return null;
  let flat: unknown;
  try {
    flat = JSON.parse(message);
  } catch {
    return null;
  }
  if (!Array.isArray(flat) || flat.length % 2 !== 0 || !flat.every((v) => typeof v === 'string')) return null;
  const op = fromHash(flatToHash(flat as string[]));
  return op && TERMINAL.has(op.state) ? op : null;
}

/** Finished records kept from the operation channels, for waiters that come after the message. */
const RECENT_FINISHES = 4096;

/**
 * Long-polling: one subscriber connection per API process listens to every operation channel and
 * wakes local waiters. A waiter reads Redis after subscribing, or is handed a record its caller
 * read once {@link subscribed} had resolved, so no change is missed: a finish after that read is
 * published to this process, either to the waiter's listener or, when it came first, to the
 * last {@link RECENT_FINISHES} finished records this process was sent.
 */
export class OperationWaiter {
  readonly #sub: Redis;
  readonly #events = new EventEmitter();
  readonly #store: OperationStore;
  /** Finished records as published (operation-finish.lua), by channel, oldest first. */
  readonly #recent = new Map<string, string>();
  #ready: Promise<unknown> | null = null;

  constructor(subscriber: Redis, store: OperationStore) {
    this.#sub = subscriber;
    this.#store = store;
    this.#events.setMaxListeners(0);
    this.#sub.on('pmessage', (_pattern: string, channel: string, message: string) => {
      if (message.startsWith('[')) {
        this.#recent.set(channel, message);
        if (this.#recent.size > RECENT_FINISHES) this.#recent.delete(this.#recent.keys().next().value!);
      }
      this.#events.emit(channel, message);
    });
  }

  /** Resolves once this process receives every operation's changes (idempotent). */
  async subscribed(): Promise<void> {
    this.#ready ??= this.#sub.psubscribe(`${KEY_PREFIX}operation:*:events`);
    await this.#ready;
  }

  /**
   * Returns the operation once terminal or after `waitMs`, whichever is first. `known` is the
   * record as the caller read it after {@link subscribed} resolved (saves a read); without it the
   * waiter reads Redis itself.
   */
  async wait(id: string, waitMs: number, known?: OperationRecord): Promise<OperationRecord | null> {
    await this.subscribed();
    const channel = keys.operationChannel(id);
    const deadline = Date.now() + Math.min(waitMs, MAX_WAIT_MS);
    /** The latest record known; one that is not finished may be stale (the run started since). */
    let op = known ?? null;
    for (;;) {
      let wake: (message: string) => void = () => {};
      const changed = new Promise<string>((resolve) => {
        wake = resolve;
        this.#events.once(channel, wake);
      });
      const done = (answer: OperationRecord | null) => {
        this.#events.off(channel, wake);
        return answer;
      };
      // a finish publishes the finished record (operation-finish.lua): no read back
      const seen = this.#recent.get(channel);
      const finished = seen ? publishedRecord(seen) : null;
      if (finished) return done(finished);
      // the first look, or the answer at the deadline: as Redis holds it now
      if (!op || deadline <= Date.now()) op = await this.#store.get(id);
      const left = deadline - Date.now();
      if (!op || TERMINAL.has(op.state) || left <= 0) return done(op);
      let timer: NodeJS.Timeout | undefined;
      const message = await Promise.race([
        changed,
        new Promise<null>((r) => (timer = setTimeout(() => r(null), left))),
      ]);
      clearTimeout(timer);
      this.#events.off(channel, wake);
      const published = message === null ? null : publishedRecord(message);
      if (published) return published;
      // the run started ("running"), or the time is up: round again (one at the deadline reads)
    }
  }

  async close(): Promise<void> {
    this.#sub.disconnect();
  }
}

/**
 * A function that carries out one kind of operation; throws SpaceError to fail it. `target` is the
 * operation's target sandbox's Redis hash as the run's start read it (`{}` when there is none), so a
 * handler need not read it again; a handler that waits or retries reads it afresh.
 */
export type OperationHandler = (op: OperationRecord, target: Record<string, string>) => Promise<void>;

/**
 * Consumes the operation queue with bounded concurrency. Uses its own blocking connection.
 */
export class OperationWorker {
  readonly #conn: Redis;
  readonly #store: OperationStore;
  readonly #handlers: Record<OperationKind, OperationHandler>;
  readonly #log: Logger;
  readonly #concurrency: number;
  readonly #reclaimIdleMs: number;
  readonly #consumer = newId('worker', 10);
  readonly #inflight = new Set<Promise<void>>();
  readonly #replicaAck: ReplicaAck;
  readonly #onStoreOutage: () => void;
  #stopped = false;
  #loop: Promise<void> | null = null;

  constructor(opts: {
    connection: Redis;
    store: OperationStore;
    handlers: Record<OperationKind, OperationHandler>;
    log: Logger;
    concurrency: number;
    /** Idle time after which another worker's unrenewed entry is reclaimed, ms (default {@link RECLAIM_IDLE_MS}). */
    reclaimIdleMs?: number;
    /** Replicas that must hold an operation's end (and the writes before it) once it is written; default off. */
    replicaAck?: ReplicaAck;
    /**
     * Told each time a step fails because the store cannot serve (unreachable, or refusing
     * writes during a failover): the API's StoreOutage, so nodes that could not heartbeat
     * meanwhile are not judged by their expired alive keys.
     */
    onStoreOutage?: () => void;
  }) {
    this.#onStoreOutage = opts.onStoreOutage ?? (() => {});
    this.#replicaAck = opts.replicaAck ?? { replicas: 0, timeoutMs: 1 };
    this.#reclaimIdleMs = opts.reclaimIdleMs ?? RECLAIM_IDLE_MS;
    this.#conn = opts.connection;
    this.#store = opts.store;
    this.#handlers = opts.handlers;
    this.#log = opts.log;
    this.#concurrency = opts.concurrency;
  }

  async start(): Promise<void> {
    try {
      await this.#conn.xgroup('CREATE', keys.operationQueue(), OPERATION_GROUP, '0', 'MKSTREAM');
    } catch (err) {
      if (!String(err).includes('BUSYGROUP')) throw err;
    }
    this.#loop = this.#run();
  }

  async #run(): Promise<void> {
    let lastReclaim = 0;
    while (!this.#stopped) {
      try {
        const free = this.#concurrency - this.#inflight.size;
        if (free <= 0) {
          await Promise.race(this.#inflight);
          continue;
        }
        let entries: [string, string[]][] = [];
        if (Date.now() - lastReclaim > this.#reclaimIdleMs / 3) {
          lastReclaim = Date.now();
          const res = (await this.#conn.xautoclaim(
            keys.operationQueue(),
            OPERATION_GROUP,
            this.#consumer,
            this.#reclaimIdleMs,
            '0',
            'COUNT',
            free,
          )) as [string, [string, string[]][]];
          entries = res[1] ?? [];
          if (entries.length > 0) this.#log.info({ count: entries.length }, 'operations reclaimed');
        }
        if (entries.length === 0) {
          const res = (await this.#conn.xreadgroup(
            'GROUP',
            OPERATION_GROUP,
            this.#consumer,
            'COUNT',
            free,
            'BLOCK',
            500,
            'STREAMS',
            keys.operationQueue(),
            '>',
          )) as [string, [string, string[]][]][] | null;
          entries = res?.[0]?.[1] ?? [];
        }
        for (const [entryId, fields] of entries) {
          if (!fields) continue;
          const opId = fields[fields.indexOf('id') + 1] ?? '';
          const p = this.#process(entryId, opId).finally(() => this.#inflight.delete(p));
          this.#inflight.add(p);
        }
      } catch (err) {
        if (this.#stopped) break;
        this.#log.error({ err }, 'operation queue read failed');
        await new Promise((r) => setTimeout(r, 500));
      }
    }
  }

  /**
   * Runs `step` (a Redis round trip of the bookkeeping) again while it fails only because Redis
   * is away, backing off 100 ms → 2 s, until it succeeds, fails otherwise, or the worker stops.
   * @throws what `step` throws when that is not a Redis outage, or the outage error once stopped.
   */
  async #untilRedis<T>(step: () => Promise<T>): Promise<T> {
    for (let wait = 100; ; wait = Math.min(wait * 2, 2000)) {
      try {
        return await step();
      } catch (err) {
        if (this.#stopped || !isRedisUnavailable(err)) throw err;
        this.#onStoreOutage();
        await sleep(wait);
      }
    }
  }

  /** Resolves once Redis answers a PING again (or the worker stops). */
  async #redisBack(): Promise<void> {
    await this.#untilRedis(() => this.#store.redis.ping()).catch(() => {});
  }

  async #process(entryId: string, opId: string): Promise<void> {
    const log = this.#log.child({ [F.operationId]: opId });
    // renew this worker's claim while the handler runs, so no other replica reclaims a live run
    const lease = setInterval(
      () => {
        this.#conn
          .xclaim(keys.operationQueue(), OPERATION_GROUP, this.#consumer, 0, entryId, 'JUSTID')
          .catch((err: unknown) => log.warn({ err }, 'operation lease renewal failed'));
      },
      this.#reclaimIdleMs / (RECLAIM_IDLE_MS / LEASE_RENEW_MS),
    );
    try {
      // Redis may drop at any step (a restart, a failover). The owner itself carries on once it is
      // back — it does not leave the operation to another replica's reclaim 30 s later: each
      // bookkeeping step is retried, and a handler that failed only because Redis was away runs
      // again as a new run (handlers are idempotent), so the outage never becomes the outcome.
      const startMs = performance.now();
      const started = await this.#untilRedis(() => this.#store.start(opId, this.#consumer));
      const op = started?.op ?? null;
      let run = started?.run ?? null;
      let target = started?.target ?? {};
      // the context the operation was queued in: its start script is known to belong there only now
      const queuedIn = op?.traceparent ? traceContextFrom({ traceparent: op.traceparent }) : undefined;
      if (queuedIn) recordSpan('redis.operation.start', {}, startMs, performance.now(), queuedIn);
      if (op && run !== null) {
        const startedAt = Date.now();
        let outcome: { state: 'succeeded' } | { state: 'failed'; error: SpaceError } | null = null;
        while (outcome === null && run !== null) {
          try {
            await inSpan(
              `operation.${op.kind}`,
              { 'space.operation.id': op.id, 'space.target': op.target },
              () => this.#handlers[op.kind](op, target),
              queuedIn,
            );
            outcome = { state: 'succeeded' };
          } catch (err) {
            if (isRedisUnavailable(err)) {
              // stopping: leave it pending for the next owner rather than record the outage
              if (this.#stopped) throw err;
              this.#onStoreOutage();
              log.warn({ run, cause: String(err) }, 'operation interrupted by a redis outage; it runs again');
              await this.#redisBack();
              // a new run (fencing token): null when it ended meanwhile, e.g. run by a replica
              const restarted = await this.#untilRedis(() => this.#store.start(op.id, this.#consumer));
              run = restarted?.run ?? null;
              target = restarted?.target ?? {};
              continue;
            }
            const e =
              err instanceof SpaceError
                ? err
                : new SpaceError('INTERNAL', 'operation failed unexpectedly', {}, { cause: err });
            if (!(err instanceof SpaceError)) log.error({ err }, 'operation crashed');
            outcome = { state: 'failed', error: e };
          }
        }
        if (outcome !== null && run !== null) {
          const final = outcome;
          const fence = run;
          // the queue entry is acknowledged in the same step (operation-finish.lua)
          const finish = () =>
            this.#untilRedis(() =>
              this.#store.finish(
                op.id,
                fence,
                final.state,
                final.state === 'failed' ? final.error : undefined,
                Date.now(),
                entryId,
              ),
            );
          const ended = queuedIn
            ? await inChildSpan('redis.operation.finish', {}, finish, queuedIn)
            : await finish();
          const fields = {
            kind: op.kind,
            [F.sandboxId]: op.target,
            [F.durationMs]: Date.now() - startedAt,
            run,
            ...(final.state === 'failed' ? { code: final.error.code, msg: final.error.message } : {}),
          };
          if (!ended) log.warn(fields, 'operation outcome dropped: it had ended or a newer run owns it');
          else log.info(fields, `operation ${final.state}`);
          if (ended) {
            // the end and the handler's writes before it (same connection) on a replica: a failover
            // after this cannot bring the operation back to run again (core/replica-ack.ts)
            await this.#untilRedis(() => awaitReplicas(this.#store.redis, this.#replicaAck)).catch(
              (err: unknown) =>
                log.warn({ ...fields, cause: String(err) }, 'operation end not acknowledged by a replica'),
            );
          }
          return;
        }
        log.info({ kind: op.kind }, 'operation ended by another run during a redis outage');
      }
      // nothing to finish (unknown, or ended already): the entry is done with
      await this.#untilRedis(() =>
        this.#store.redis
          .multi()
          .xack(keys.operationQueue(), OPERATION_GROUP, entryId)
          .xdel(keys.operationQueue(), entryId)
          .exec(),
      );
    } catch (err) {
      // left pending: another worker reclaims it once its lease lapses
      log.error({ err }, 'operation bookkeeping failed');
    } finally {
      clearInterval(lease);
    }
  }

  /** Stops taking work and waits for in-flight operations. */
  async stop(): Promise<void> {
    this.#stopped = true;
    await this.#loop;
    await Promise.allSettled([...this.#inflight]);
    this.#conn.disconnect();
  }
}
