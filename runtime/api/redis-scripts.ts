/** Loads the Lua scripts beside this file into an ioredis client as typed commands. */
import { readFileSync } from 'node:fs';
import type { Redis } from 'ioredis';

const here = new URL('./scripts/', import.meta.url);
const src = (name: string) => readFileSync(new URL(`${name}.lua`, here), 'utf8');
/** A script that places sandboxes, with the placement functions (placement-lib.lua) in front. */
const placing = (name: string) => `${src('placement-lib')}\n${src(name)}`;

/** The atomic flows of the control plane (see runtime/core/REDIS.md). */
export interface SpaceScripts {
  spaceTransition(sandboxKey: string, deadlinesKey: string, ...argv: string[]): Promise<[number, string]>;
  spacePlace(
    nodeIndex: string,
    sandboxKey: string,
    prefix: string,
    id: string,
    template: string,
    vcpusMilli: string,
    memoryMiB: string,
    drivers: string,
    hibernateStore: string,
    rules: string,
    ...outage: string[]
  ): Promise<[string, number | string, string?, number?]>;
  spaceRelease(sandboxKey: string, prefix: string): Promise<number>;
  spaceAdmit(
    sandboxKey: string,
    indexKey: string,
    teamReservedKey: string,
    teamCreatesKey: string,
    teamIndexKey: string,
    operationKey: string,
    queueKey: string,
    teamLiveKey: string,
    idempotencyKey: string,
    nodeIndex: string,
    ...argv: string[]
  ): Promise<
    | [1]
    | [1, string, number]
    | [0, string, number, number]
    | [2, string, string]
    | [3]
    | [4, string]
    | [5, string]
  >;
  spaceExpire(
    deadlinesKey: string,
    queueKey: string,
    prefix: string,
    now: string,
    limit: string,
    pauseRetryMs: string,
  ): Promise<[killed: string[], paused: string[]]>;
  spaceExtend(
    sandboxKey: string,
    deadlinesKey: string,
    deadlineMs: string,
    timeoutSec: string,
    now: string,
  ): Promise<[number, string]>;
  spaceOperationStart(
    opKey: string,
    channel: string,
    now: string,
    owner: string,
    prefix: string,
  ): Promise<[number, string[]?, string[]?]>;
  spaceNodes(nodeIndex: string, prefix: string): Promise<(string | number | string[])[]>;
  spaceOperationFinish(
    opKey: string,
    channel: string,
    queueKey: string,
    state: string,
    run: string,
    now: string,
    ttlSec: string,
    errorCode: string,
    errorMessage: string,
    group: string,
    entryId: string,
  ): Promise<number>;
}

export type ScriptedRedis = Redis & SpaceScripts;
/** A flat field/value array (HGETALL inside a script) as an object. Pure. */
export function flatToHash(flat: readonly string[]): Record<string, string> {
  const h: Record<string, string> = {};
  for (let i = 0; i + 1 < flat.length; i += 2) h[flat[i]!] = flat[i + 1]!;
  return h;
}

/** Defines the scripts on `redis` (idempotent: redefining is harmless) and returns it typed. */
export function withScripts(redis: Redis): ScriptedRedis {
  const r = redis as ScriptedRedis;
  if (typeof r.spaceTransition === 'function') return r;
  redis.defineCommand('spaceTransition', { numberOfKeys: 2, lua: src('transition') });
  redis.defineCommand('spacePlace', { numberOfKeys: 2, lua: placing('place') });
  redis.defineCommand('spaceAdmit', { numberOfKeys: 10, lua: placing('admit') });
  redis.defineCommand('spaceRelease', { numberOfKeys: 1, lua: src('release') });
  redis.defineCommand('spaceExpire', { numberOfKeys: 2, lua: src('expire') });
  redis.defineCommand('spaceExtend', { numberOfKeys: 2, lua: src('extend') });
  redis.defineCommand('spaceOperationStart', { numberOfKeys: 2, lua: src('operation-start') });
  redis.defineCommand('spaceNodes', { numberOfKeys: 1, lua: src('nodes') });
  redis.defineCommand('spaceOperationFinish', { numberOfKeys: 3, lua: src('operation-finish') });
  return r;
}
