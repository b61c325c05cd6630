/**
 * Asking for a pause or a resume, and waiting for a sandbox to run: shared by the API (routes,
 * the auto-pause timer, commands on a paused sandbox) and the router (a request for a paused
 * sandbox resumes it). Both only write to Redis; the API's operation workers carry the work out.
 */
import { readFileSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Redis } from 'ioredis';
import { SpaceError } from './errors.ts';
import { newId } from './ids.ts';
import { KEY_PREFIX, keys } from './redis-keys.ts';
import type { SandboxState } from './types.ts';

const REQUEST_LUA = readFileSync(new URL('./scripts/request.lua', import.meta.url), 'utf8');

/** The operation a pause/resume request got: new, or the one already under way. */
export interface LifecycleRequest {
  operationId: string;
  /** The sandbox's state when asked. */
  state: SandboxState;
  /** False when an operation of this kind was already under way and is shared. */
  created: boolean;
}

/**
 * Queues `kind` for sandbox `id` unless one is already pending or running (then returns that one).
 * `args` reach the handler (e.g. `{ mode: 'hibernated', reason: 'idle' }`).
 * @throws SpaceError SANDBOX_NOT_FOUND (no record), SANDBOX_NOT_RUNNING (creating or ending).
 */
export async function requestLifecycle(
  redis: Redis,
  kind: 'sandbox.pause' | 'sandbox.resume',
  id: string,
  args: Record<string, string> = {},
): Promise<LifecycleRequest> {
  const [opId, state, created] = (await redis.eval(
    REQUEST_LUA,
    2,
    keys.sandbox(id),
    keys.operationQueue(),
    KEY_PREFIX,
    kind,
    newId('op'),
    String(Date.now()),
    JSON.stringify(args),
  )) as [string, string, number];
  if (!state) throw new SpaceError('SANDBOX_NOT_FOUND', `no sandbox ${id}`, { sandboxId: id });
  if (!opId) {
    throw new SpaceError('SANDBOX_NOT_RUNNING', `sandbox ${id} is ${state}`, { sandboxId: id, state });
  }
  return { operationId: opId, state: state as SandboxState, created: created === 1 };
}

/** Where a running sandbox is served. */
export interface SandboxLocation {
  nodeId: string;
  sessionId: string;
}

/**
 * Resolves when sandbox `id` is running, asking for a resume when it is paused (or pausing), and
 * returns where it runs. Polls its record every `pollMs` (default 25 ms) for at most `timeoutMs`.
 * `reason: 'traffic'` (the router's) resumes only a sandbox whose record allows it (`autoResume`,
 * absent = allowed); other reasons (a command through the API) always may.
 * @throws SpaceError SANDBOX_NOT_FOUND; SANDBOX_NOT_RUNNING when it is creating too long or ending,
 *   or when its resume failed; SANDBOX_PAUSED when it did not run within `timeoutMs`, or at once
 *   (`details.autoResume: false`) when traffic may not resume it.
 */
export async function ensureRunning(
  redis: Redis,
  id: string,
  opts: { timeoutMs: number; pollMs?: number; reason?: string },
): Promise<SandboxLocation> {
  const deadline = Date.now() + opts.timeoutMs;
  let resumeOp: string | null = null;
  for (;;) {
    const [state, nodeId, sessionId, autoResume] = await redis.hmget(
      keys.sandbox(id),
      'state',
      'nodeId',
      'sessionId',
      'autoResume',
    );
    if (!state) throw new SpaceError('SANDBOX_NOT_FOUND', `no sandbox ${id}`, { sandboxId: id });
    if (state === 'running' && nodeId) return { nodeId, sessionId: sessionId ?? '' };
    if (state === 'killing' || state === 'killed') {
      throw new SpaceError('SANDBOX_NOT_RUNNING', `sandbox ${id} is ${state}`, { sandboxId: id, state });
    }
    if ((state === 'paused' || state === 'pausing') && resumeOp === null && opts.reason === 'traffic') {
      if (autoResume === '0') {
        throw new SpaceError(
          'SANDBOX_PAUSED',
          `sandbox ${id} is ${state} and traffic does not resume it (created with autoResume off): resume it through the API`,
          { sandboxId: id, state, autoResume: false },
        );
      }
    }
    if ((state === 'paused' || state === 'pausing') && resumeOp === null) {
      resumeOp = (await requestLifecycle(redis, 'sandbox.resume', id, { reason: opts.reason ?? 'traffic' }))
        .operationId;
    } else if (resumeOp !== null) {
      const [opState, code, message] = await redis.hmget(
        keys.operation(resumeOp),
        'state',
        'errorCode',
        'errorMessage',
      );
      if (opState === 'failed') {
        throw new SpaceError('SANDBOX_NOT_RUNNING', `sandbox ${id} did not resume: ${message ?? code}`, {
          sandboxId: id,
          state,
          cause: code,
        });
      }
      // a resume that finished while a new pause began: ask again
      if (opState === 'succeeded' && state === 'paused') resumeOp = null;
    }
    if (Date.now() >= deadline) {
      throw new SpaceError('SANDBOX_PAUSED', `sandbox ${id} did not resume within ${opts.timeoutMs} ms`, {
        sandboxId: id,
        state,
      });
    }
    await sleep(opts.pollMs ?? 25);
  }
}
