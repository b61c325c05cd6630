/**
 * Warm pool: per template, a few instances booted ahead of demand (guest answering), so a create
 * becomes a claim. Refilled in the background after every claim; the count of ready slots is
 * published in the node's heartbeat, where the API's placement script prefers nodes that have one.
 * A placement that counted on a slot another create took meanwhile simply boots cold here.
 */
import type { Logger } from 'pino';
import { F } from '../core/log-fields.ts';
import type { InstanceInfo } from './drivers/driver.ts';

/** Shape every warm instance of a pool has. */
export interface WarmShape {
  vcpus: number;
  memoryMiB: number;
}

export class WarmPool {
  readonly #ready = new Map<string, InstanceInfo[]>();
  readonly #filling = new Map<string, number>();
  readonly #boot: (template: string) => Promise<InstanceInfo>;
  readonly #discard: (inst: InstanceInfo) => Promise<void>;
  readonly #log: Logger;
  readonly templates: readonly string[];
  readonly size: number;
  readonly shape: WarmShape;
  #stopped = false;
  readonly #pending = new Set<Promise<void>>();

  constructor(o: {
    templates: readonly string[];
    size: number;
    shape: WarmShape;
    boot: (template: string) => Promise<InstanceInfo>;
    discard: (inst: InstanceInfo) => Promise<void>;
    log: Logger;
  }) {
    this.templates = o.templates;
    this.size = o.size;
    this.shape = o.shape;
    this.#boot = o.boot;
    this.#discard = o.discard;
    this.#log = o.log;
  }

  /** Ready slots per template (published in heartbeats). */
  counts(): Record<string, number> {
    return Object.fromEntries(this.templates.map((t) => [t, this.#ready.get(t)?.length ?? 0]));
  }

  /** Instance ids held by the pool (not bound to a sandbox). */
  instanceIds(): string[] {
    return [...this.#ready.values()].flat().map((i) => i.instanceId);
  }

  /**
   * Takes a ready instance of `template` with `shape`, or null. Does not refill: the caller calls
   * {@link refill} once its claim is done, so the boot that replaces the slot (network setup, a
   * runsc start: hundreds of ms of CPU) never competes with the claim it follows.
   */
  claim(template: string, shape: WarmShape): InstanceInfo | null {
    if (shape.vcpus !== this.shape.vcpus || shape.memoryMiB !== this.shape.memoryMiB) return null;
    return this.#ready.get(template)?.shift() ?? null;
  }

  /** Boots instances until every template has `size` ready or booting. */
  refill(): void {
    if (this.#stopped) return;
    for (const t of this.templates) {
      const have = (this.#ready.get(t)?.length ?? 0) + (this.#filling.get(t) ?? 0);
      for (let i = have; i < this.size; i++) {
        this.#filling.set(t, (this.#filling.get(t) ?? 0) + 1);
        const p = this.#boot(t)
          .then(async (inst) => {
            if (this.#stopped) return this.#discard(inst);
            const list = this.#ready.get(t) ?? [];
            list.push(inst);
            this.#ready.set(t, list);
            this.#log.debug({ [F.templateId]: t, [F.instanceId]: inst.instanceId }, 'warm slot ready');
          })
          .catch((err: unknown) => {
            this.#log.error({ err, [F.templateId]: t }, 'warm slot boot failed');
          })
          .finally(() => {
            this.#filling.set(t, (this.#filling.get(t) ?? 1) - 1);
            this.#pending.delete(p);
          });
        this.#pending.add(p);
      }
    }
  }

  /** Resolves once no boot is in flight (tests, shutdown). */
  async settle(): Promise<void> {
    while (this.#pending.size > 0) await Promise.allSettled([...this.#pending]);
  }

  /** Stops refilling and destroys every ready instance. */
  async drain(): Promise<void> {
    this.#stopped = true;
    await this.settle();
    const all = [...this.#ready.values()].flat();
    this.#ready.clear();
    await Promise.allSettled(all.map((i) => this.#discard(i)));
  }
}
