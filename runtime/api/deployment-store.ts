/**
 * The deployment settings VM deployments read from Redis (runtime/core/REDIS.md): the version they
 * move to (`DEPLOY_TARGET_VERSION_KEY`) and the settings of each VM service as a JSON document
 * (`DEPLOY_VM_CONFIG_KEY`), which every VM's `space-config-sync` timer checks against its own
 * policy and applies (runtime/core/vm-config.ts).
 */
import type { Redis } from 'ioredis';
import { parseEnvFile } from '../core/env-file.ts';
import { DEPLOY_TARGET_VERSION_KEY, DEPLOY_VM_CONFIG_KEY } from '../core/redis-keys.ts';
import { vmServiceDocument } from '../core/vm-config.ts';

/** A stored field: a JSON document, or an env file as versions before the typed document stored. */
function parseField(text: string): Record<string, string> {
  try {
    const doc = JSON.parse(text) as unknown;
    if (typeof doc === 'object' && doc !== null && !Array.isArray(doc)) return doc as Record<string, string>;
  } catch {}
  return parseEnvFile(text);
}

/** Env of each VM service, by service name (`space-api`, `space-agent@<pool>`, …). */
export type VmServices = Record<string, Record<string, string>>;

export class DeploymentStore {
  readonly #redis: Redis;
  constructor(redis: Redis) {
    this.#redis = redis;
  }

  /** The SPACE version VM deployments move to (null when none was set). */
  targetVersion(): Promise<string | null> {
    return this.#redis.get(DEPLOY_TARGET_VERSION_KEY);
  }

  /** Sets the version VM deployments move to (a tag, checked by the caller). */
  async setTargetVersion(version: string): Promise<void> {
    await this.#redis.set(DEPLOY_TARGET_VERSION_KEY, version);
  }

  /** Every VM service's env (empty when none was set). */
  async vmConfig(): Promise<VmServices> {
    const h = await this.#redis.hgetall(DEPLOY_VM_CONFIG_KEY);
    return Object.fromEntries(Object.entries(h).map(([s, text]) => [s, parseField(text)]));
  }

  /**
   * Replaces the whole VM configuration in one step: a service missing from `services` is left as
   * its VMs have it (they keep their last env file).
   */
  async setVmConfig(services: VmServices): Promise<void> {
    const m = this.#redis.multi().del(DEPLOY_VM_CONFIG_KEY);
    const fields = Object.entries(services).flatMap(([s, env]) => [s, vmServiceDocument(env)]);
    if (fields.length) m.hset(DEPLOY_VM_CONFIG_KEY, ...fields);
    await m.exec();
  }
}
