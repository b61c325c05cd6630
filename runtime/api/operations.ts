/**
 * Operations: the asynchronous half of every lifecycle change. An operation is written to Redis
 * and queued on a Redis stream in one MULTI; any API replica's worker picks it up. A worker that
 * dies mid-way leaves the entry pending in the consumer group and another replica reclaims it
 * after {@link RECLAIM_IDLE_MS} (XAUTOCLAIM), so operations survive API restarts. Handlers are
 * idempotent, so running one twice is safe.
 */
import { EventEmitter } from 'node:events';
import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import { SpaceError } from '../core/errors.ts';
import { newId } from '../core/ids.ts';
import { F } from '../core/log-fields.ts';
import { KEY_PREFIX, keys, OPERATION_GROUP, OPERATION_TTL_SEC } from '../core/redis-keys.ts';
import type { Operation, OperationKind, OperationState } from '../core/types.ts';

/** A pending entry idle this long is taken over by another worker (ms). */
export const RECLAIM_IDLE_MS = 30_000;
/** Longest long-poll a client may ask for (ms). */
export const MAX_WAIT_MS = 60_000;

/** Operation plus the arguments its handler needs. */
export interface OperationRecord extends Operation {
  /** Handler arguments (e.g. the kill reason), JSON in Redis. */
  args: Record<string, string>;
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
  };
}

/** Public JSON of an operation. */
export function operationToPublic(op: OperationRecord): Operation {
  const { args: _args, ...pub } = op;
  return pub;
}

export class OperationStore {
  readonly redis: Redis;
  constructor(redis: Redis) {
    this.redis = redis;
  }

  /** Writes a pending operation and queues it, atomically. */
  async enqueue(
    kind: OperationKind,
    target: string,
    args: Record<string, string> = {},
  ): Promise<OperationRecord> {
    const id = newId('op');
    const now = String(Date.now());
    await this.redis
      .multi()
      .hset(keys.operation(id), {
        id,
        kind,
        target,
        state: 'pending',
        args: JSON.stringify(args),
        createdAt: now,
        updatedAt: now,
      })
      .xadd(keys.operationQueue(), '*', 'id', id)
      .exec();
    return (await this.get(id))!;
  }

  async get(id: string): Promise<OperationRecord | null> {
    return fromHash(await this.redis.hgetall(keys.operation(id)));
  }

  /** Sets the state (and error) and announces the change to long-pollers. */
  async setState(id: string, state: OperationState, error?: SpaceError): Promise<void> {
    const fields: Record<string, string> = { state, updatedAt: String(Date.now()) };
    if (error) Object.assign(fields, { errorCode: error.code, errorMessage: error.message });
    const m = this.redis.multi().hset(keys.operation(id), fields).publish(keys.operationChannel(id), state);
    if (state === 'succeeded' || state === 'failed') m.expire(keys.operation(id), OPERATION_TTL_SEC);
    await m.exec();
  }
}

const TERMINAL: ReadonlySet<OperationState> = new Set(['succeeded', 'failed']);

/**
 * Long-polling: one subscriber connection per API process listens to every operation channel and
 * wakes local waiters; a waiter re-reads Redis after subscribing, so no change is missed.
 */
export class OperationWaiter {
  readonly #sub: Redis;
  readonly #events = new EventEmitter();
  readonly #store: OperationStore;
  #ready: Promise<unknown> | null = null;

  constructor(subscriber: Redis, store: OperationStore) {
    this.#sub = subscriber;
    this.#store = store;
    this.#events.setMaxListeners(0);
    this.#sub.on('pmessage', (_pattern: string, channel: string) => this.#events.emit(channel));
  }

  /** Returns the operation once terminal or after `waitMs`, whichever is first. */
  async wait(id: string, waitMs: number): Promise<OperationRecord | null> {
    this.#ready ??= this.#sub.psubscribe(`${KEY_PREFIX}operation:*:events`);
    await this.#ready;
    const channel = keys.operationChannel(id);
    const deadline = Date.now() + Math.min(waitMs, MAX_WAIT_MS);
    for (;;) {
      let wake: () => void = () => {};
      const changed = new Promise<void>((resolve) => {
        wake = resolve;
        this.#events.once(channel, wake);
      });
      const op = await this.#store.get(id);
      const left = deadline - Date.now();
      if (!op || TERMINAL.has(op.state) || left <= 0) {
        this.#events.off(channel, wake);
        return op;
      }
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([changed, new Promise<void>((r) => (timer = setTimeout(r, left)))]);
      clearTimeout(timer);
      this.#events.off(channel, wake);
    }
  }

  async close(): Promise<void> {
    this.#sub.disconnect();
  }
}

/** A function that carries out one kind of operation; throws SpaceError to fail it. */
export type OperationHandler = (op: OperationRecord) => Promise<void>;

/**
 * Consumes the operation queue with bounded concurrency. Uses its own blocking connection.
 */
export class OperationWorker {
  readonly #conn: Redis;
  readonly #store: OperationStore;
  readonly #handlers: Record<OperationKind, OperationHandler>;
  readonly #log: Logger;
  readonly #concurrency: number;
  readonly #consumer = newId('worker', 10);
  readonly #inflight = new Set<Promise<void>>();
  #stopped = false;
  #loop: Promise<void> | null = null;

  constructor(opts: {
    connection: Redis;
    store: OperationStore;
    handlers: Record<OperationKind, OperationHandler>;
    log: Logger;
    concurrency: number;
  }) {
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
        if (Date.now() - lastReclaim > RECLAIM_IDLE_MS / 3) {
          lastReclaim = Date.now();
          const res = (await this.#conn.xautoclaim(
            keys.operationQueue(),
            OPERATION_GROUP,
            this.#consumer,
            RECLAIM_IDLE_MS,
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

  async #process(entryId: string, opId: string): Promise<void> {
    const op = await this.#store.get(opId);
    const log = this.#log.child({ [F.operationId]: opId });
    try {
      if (op && !TERMINAL.has(op.state)) {
        await this.#store.setState(op.id, 'running');
        const started = Date.now();
        try {
          await this.#handlers[op.kind](op);
          await this.#store.setState(op.id, 'succeeded');
          log.info(
            { kind: op.kind, [F.sandboxId]: op.target, [F.durationMs]: Date.now() - started },
            'operation succeeded',
          );
        } catch (err) {
          const e =
            err instanceof SpaceError
              ? err
              : new SpaceError('INTERNAL', 'operation failed unexpectedly', {}, { cause: err });
          if (!(err instanceof SpaceError)) log.error({ err }, 'operation crashed');
          await this.#store.setState(op.id, 'failed', e);
          log.info({ kind: op.kind, code: e.code, msg: e.message }, 'operation failed');
        }
      }
      await this.#store.redis
        .multi()
        .xack(keys.operationQueue(), OPERATION_GROUP, entryId)
        .xdel(keys.operationQueue(), entryId)
        .exec();
    } catch (err) {
      // left pending: another worker reclaims it after RECLAIM_IDLE_MS
      log.error({ err }, 'operation bookkeeping failed');
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
