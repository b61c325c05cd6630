/**
 * Use case: create a sandbox. Checks the ask against the nodes (placement pre-check), the team's
 * credentials and the lifetime limit before anything is written, then admits the sandbox and its
 * create operation in one step (admit.lua), placing it on a node with room now — or refusing at
 * once with NODE_CAPACITY_EXHAUSTED and `Retry-After`, or, with `roomWaitMs`, asking again until
 * room frees or the wait passes. With an Idempotency-Key, the same step claims the key or returns
 * the first request's sandbox (claim-or-return: no polling). The worker then boots it on its node
 * (lifecycle.ts). Called by `POST /v1/sandboxes` and by the E2B layer's create.
 */
import { createHash, randomBytes } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import type { CreateSandboxBody } from '../../core/api-schemas.ts';
import { normalisePolicy } from '../../core/egress.ts';
import { SpaceError } from '../../core/errors.ts';
import { newId, newSandboxId } from '../../core/ids.ts';
import { F } from '../../core/log-fields.ts';
import { PORT_TOKEN_TTL_SEC } from '../../core/ports.ts';
import { IDEMPOTENCY_TTL_SEC, keys } from '../../core/redis-keys.ts';
import { mintSessionToken } from '../../core/tokens.ts';
import { inSpan } from '../../core/tracing.ts';
import type { Operation, Sandbox } from '../../core/types.ts';
import type { Principal } from '../api-keys.ts';
import type { ApiDeps } from '../app.ts';
import { allowCredentialHosts } from '../credential-store.ts';
import { type DraftOperation, type OperationRecord, operationToPublic } from '../operations.ts';
import { precheckPlacement } from '../placement.ts';
import { type SandboxRecord, toPublic } from '../sandbox-store.ts';
import type { UseCaseLog } from './log.ts';

/** What a create is asked: the validated body (schema defaults applied) and how to answer. */
export interface CreateRequest {
  who: Principal;
  body: CreateSandboxBody;
  /** Answer once the create operation ends or this many ms pass (0: at once). */
  waitMs?: number;
  /**
   * When no node has room now, keep asking for this many ms (at most {@link MAX_ROOM_WAIT_MS})
   * before refusing with NODE_CAPACITY_EXHAUSTED (0: refuse at once).
   */
  roomWaitMs?: number;
  /** The client's Idempotency-Key header (1–128 chars), if any. */
  idempotencyKey?: string;
  /** The request's logger. */
  log: UseCaseLog;
  /** Told the new (or replayed) sandbox's id as soon as it is known (the audit's target). */
  onTarget?: (sandboxId: string) => void;
}

/** Longest wait for room a create may ask for (`roomWaitMs`, ms). */
export const MAX_ROOM_WAIT_MS = 60_000;
/** How often a create waiting for room asks again, at first and at most (ms; doubling between). */
const ROOM_POLL_MS = { first: 100, most: 1_000 } as const;

/** Canonical JSON (sorted keys) so the same body always hashes the same. Pure. */
export function canonical(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(canonical).join(',')}]`;
  if (v && typeof v === 'object') {
    return `{${Object.keys(v)
      .sort()
      .map((k) => `${JSON.stringify(k)}:${canonical((v as Record<string, unknown>)[k])}`)
      .join(',')}}`;
  }
  return JSON.stringify(v);
}

/**
 * Creates a sandbox (asynchronous: answered with its `creating` record and pending operation, or
 * with `waitMs`, as they are once the operation ended or the wait passed). A repeated request with
 * the same Idempotency-Key and body answers with the first one's sandbox and operation.
 * An admitted create holds its node's share from the start, so it never fails later for want of
 * room.
 * @throws SpaceError TEMPLATE_NOT_FOUND / TEMPLATE_NOT_READY / NODE_UNAVAILABLE / SHAPE_TOO_LARGE /
 *   SHAPE_UNSUPPORTED (placement.ts), NODE_CAPACITY_EXHAUSTED (no node has room now, nor within
 *   `roomWaitMs`; `details.retryAfterSec`), BAD_REQUEST (timeoutSec over the maximum), the credential
 *   store's errors for unknown credentials, QUOTA_EXCEEDED / RATE_LIMITED, IDEMPOTENCY_CONFLICT.
 */
export async function createSandbox(
  deps: ApiDeps,
  r: CreateRequest,
): Promise<{ sandbox: Sandbox; operation: Operation }> {
  const { body, who } = r;
  const waitMs = r.waitMs ?? 0;
  // subscribed before the records are written, so no finish can be missed
  if (waitMs > 0) await deps.waiter.subscribed();
  // the team's quotas are read beside the node list: one Redis round trip, not two
  const quotasRead = deps.teams.quotas(who.team);
  quotasRead.catch(() => {}); // awaited below; a refusal on the template must not leave it unhandled
  const vcpus = body.vcpus ?? 1;
  const memoryMiB = body.memoryMiB ?? 512;
  const nodes = await inSpan('redis.nodes.list', {}, () => deps.nodes.list());
  precheckPlacement(nodes, { template: body.template, vcpus, memoryMiB });
  const timeoutSec = body.timeoutSec ?? deps.config.defaultTimeoutSec;
  if (timeoutSec > deps.config.maxTimeoutSec) {
    throw new SpaceError('BAD_REQUEST', `timeoutSec must be at most ${deps.config.maxTimeoutSec}`);
  }
  // validate everything before anything is written: bad input loses nothing
  // only the team's own credentials can be granted (another team's name is not found)
  const grants = await deps.credentials.grant(who.team, body.credentials ?? []);
  const quotas = await quotasRead;
  const egress = allowCredentialHosts(normalisePolicy(body.egress), grants);
  const id = newSandboxId();
  r.onTarget?.(id);
  const sessionId = newId('ses');
  // the routers' credential for this sandbox's port tunnels (never handed out), and the traffic
  // token a private sandbox's servers are reached with (core/ports.ts)
  const { token: portToken } = await mintSessionToken(deps.signingKey, {
    sandboxId: id,
    sessionId,
    team: who.team,
    scopes: ['ports'],
    ttlSec: PORT_TOKEN_TTL_SEC,
  });
  const trafficToken = body.ports?.public === false ? randomBytes(24).toString('hex') : undefined;
  const idempotency = r.idempotencyKey
    ? {
        key: keys.idempotency(who.team, r.idempotencyKey),
        bodyHash: createHash('sha256').update(canonical(body)).digest('hex'),
        ttlSec: IDEMPOTENCY_TTL_SEC,
      }
    : undefined;
  // the sandbox and its create operation are written in one step (admit.lua); the operation
  // carries this span's context, so the worker's spans join the trace here
  let create: DraftOperation | undefined;
  const admit = () =>
    inSpan('redis.sandbox.create', {}, () => {
      create = deps.operations.draft('sandbox.create', id, {}, who.team);
      return deps.sandboxes.admit(
        {
          id,
          template: body.template,
          vcpus,
          memoryMiB,
          timeoutSec,
          // no idle pause by default for a sandbox traffic does not resume: its next request would
          // find it paused and be refused
          autoPauseSec:
            body.autoPauseSec ?? (body.autoResume === false ? 0 : deps.config.defaultAutoPauseSec),
          onTimeout: body.onTimeout ?? 'kill',
          autoResume: body.autoResume ?? true,
          apiKey: who.keyId,
          team: who.team,
          metadata: body.metadata ?? {},
          // the sandbox sees placeholders, never credential values
          env: {
            ...(body.env ?? {}),
            ...Object.fromEntries(grants.map((g) => [g.envVar, g.placeholder])),
          },
          sessionId,
          egress,
          grants,
          portToken,
          ...(trafficToken ? { trafficToken } : {}),
        },
        quotas,
        Date.now(),
        create,
        idempotency,
        { outage: deps.nodes.outage },
      );
    });
  const res = await untilRoom(admit, Math.min(r.roomWaitMs ?? 0, MAX_ROOM_WAIT_MS)).catch((err: unknown) => {
    if (
      err instanceof SpaceError &&
      (err.code === 'NODE_CAPACITY_EXHAUSTED' || err.code === 'NODE_UNAVAILABLE')
    ) {
      deps.metrics.createsRefused.inc({ code: err.code });
    }
    throw err;
  });
  if ('replay' in res) {
    r.onTarget?.(res.replay.sandboxId);
    const [sb, op] = await Promise.all([
      deps.sandboxes.get(res.replay.sandboxId),
      deps.operations.get(res.replay.operationId),
    ]);
    if (!sb || !op) {
      throw new SpaceError('INTERNAL', 'the first request with this Idempotency-Key left no sandbox');
    }
    return settled(deps, sb, op, waitMs);
  }
  const op = create!.record;
  deps.metrics.sandboxesCreated.inc({ template: body.template });
  r.log.info(
    { [F.sandboxId]: id, [F.operationId]: op.id, [F.templateId]: body.template },
    'sandbox accepted',
  );
  return settled(deps, res.admitted, op, waitMs);
}

/**
 * Runs `admit` again while it is refused only for want of room (NODE_CAPACITY_EXHAUSTED), asking
 * every 100 ms → 1 s, until it admits, fails otherwise, or `waitMs` has passed (then the last
 * refusal is thrown). A refused admission writes nothing, so asking again is safe.
 */
async function untilRoom<T>(admit: () => Promise<T>, waitMs: number): Promise<T> {
  const until = Date.now() + waitMs;
  for (let pause: number = ROOM_POLL_MS.first; ; pause = Math.min(pause * 2, ROOM_POLL_MS.most)) {
    try {
      return await admit();
    } catch (err) {
      const left = until - Date.now();
      if (!(err instanceof SpaceError) || err.code !== 'NODE_CAPACITY_EXHAUSTED' || left <= 0) throw err;
      await sleep(Math.min(pause, left));
    }
  }
}

/**
 * The answer: the records as written, or with `waitMs`, as they are once the create operation has
 * ended (or the wait has passed). One request instead of create + long-poll.
 */
async function settled(
  deps: ApiDeps,
  sb: SandboxRecord,
  op: OperationRecord,
  waitMs: number,
): Promise<{ sandbox: Sandbox; operation: Operation }> {
  // the waiter answers at once for an operation that has ended already (a replay)
  const ended =
    waitMs > 0 ? await inSpan('api.operation.wait', {}, () => deps.waiter.wait(op.id, waitMs, op)) : op;
  if (!ended || ended === op) return { sandbox: toPublic(sb), operation: operationToPublic(op) };
  const now = (await deps.sandboxes.get(sb.id)) ?? sb;
  return { sandbox: toPublic(now), operation: operationToPublic(ended) };
}
