/**
 * The instance factory: makes the instances sandboxes run on. One instance is a network (a
 * namespace and veth, plus a tap for VM drivers) and a driver instance (booted, or restored from a
 * snapshot and rekeyed to its own guest secret), made under one {@link CleanupStack}: when any step
 * fails, exactly what was made is undone, last first. The start gate bounds how many start at
 * once (creates first, warm refills yield; start-gate.ts).
 */
import { randomBytes } from 'node:crypto';
import { newId } from '../../core/ids.ts';
import { F } from '../../core/log-fields.ts';
import { inSpan } from '../../core/tracing.ts';
import {
  CleanupStack,
  type Driver,
  type InstanceInfo,
  type RestoreSpec,
  type SnapshotRef,
} from '../drivers/driver.ts';
import { GuestClient } from '../guest-client.ts';
import type { TemplateStart } from '../image/templates.ts';
import type { SandboxManagerOptions } from '../sandboxes/types.ts';
import { StartGate, type StartKind } from './start-gate.ts';
import { startTemplate } from './template-start.ts';

/** The shape of an instance: vCPUs and memory (MiB). */
export interface InstanceShape {
  vcpus: number;
  memoryMiB: number;
}

/** Options of an {@link InstanceFactory}: the manager's own, those that make instances. */
export type InstanceFactoryOptions = Pick<
  SandboxManagerOptions,
  | 'driver'
  | 'networks'
  | 'templateImage'
  | 'pidsLimit'
  | 'diskMiB'
  | 'createConcurrency'
  | 'refillConcurrency'
  | 'log'
>;

export class InstanceFactory {
  readonly #o: InstanceFactoryOptions;
  /** Instance starts: creates go first, refills yield (start-gate.ts). */
  readonly starts: StartGate;
  /** The template snapshots this node restores from (template → snapshot; snapshots.ts fills it). */
  readonly snapshots = new Map<string, SnapshotRef>();

  constructor(o: InstanceFactoryOptions) {
    this.#o = o;
    this.starts = new StartGate(o.createConcurrency, Math.min(o.refillConcurrency, o.createConcurrency));
  }

  get driver(): Driver {
    return this.#o.driver;
  }

  get diskMiB(): number {
    return this.#o.diskMiB;
  }

  /**
   * Makes one instance of `template` and `shape` at the start gate as `kind`: restored from the
   * template's snapshot when there is one of this shape (a failed restore costs time, never the
   * create: it boots instead), booted otherwise. A booted instance of a template with a start
   * command is returned once its ready check passed (a snapshot is taken after it: restored ones
   * are ready already).
   * @throws what the template image, the network or the driver throws; TEMPLATE_START_FAILED when
   *   the template's start is not ready in time (nothing is left).
   */
  async make(
    template: string,
    shape: InstanceShape,
    kind: StartKind,
  ): Promise<{ inst: InstanceInfo; source: 'snapshot' | 'boot' }> {
    const image = await this.#o.templateImage(template);
    const snap = this.snapshots.get(template);
    const restoreFrom =
      snap !== undefined &&
      snap.imageDigest === image.digest &&
      snap.vcpus === shape.vcpus &&
      snap.memoryMiB === shape.memoryMiB &&
      snap.diskMiB === this.#o.diskMiB
        ? snap
        : null;
    return this.starts.run(kind, async () => {
      if (restoreFrom) {
        try {
          return { inst: await this.restore(template, restoreFrom), source: 'snapshot' };
        } catch (err) {
          // a restore that fails costs time, never the create: boot instead (fresh id and network)
          this.#o.log.warn(
            { err, [F.templateId]: template, snapshot: restoreFrom.path },
            'snapshot restore failed; booting instead',
          );
        }
      }
      const inst = await this.#one(template, (spec) =>
        this.#o.driver.create({
          ...spec,
          image,
          vcpus: shape.vcpus,
          memoryMiB: shape.memoryMiB,
          diskMiB: this.#o.diskMiB,
        }),
      );
      if (image.start) await this.#serve(inst, template, image.start);
      return { inst, source: 'boot' as const };
    });
  }

  /**
   * Restores `snap` as a new instance (new id, network and guest secret): the guest is rotated from
   * the snapshot's secret to the instance's own. Not gated: callers run it at the start gate.
   * @throws what the driver or the guest's rotation throws (nothing is left).
   */
  async restore(template: string, snap: SnapshotRef): Promise<InstanceInfo> {
    return this.#one(
      template,
      async (spec) => this.#o.driver.restore(snap, { ...spec, image: await this.#o.templateImage(template) }),
      snap.guestToken,
    );
  }

  /**
   * One instance with a new id, secret and network (a tap for VM drivers), made by `make`, and
   * rekeyed from `rekeyFrom` (a restored guest's old secret) when given; everything made is undone
   * when a later step fails.
   */
  async #one(
    template: string,
    make: (spec: Omit<RestoreSpec, 'image'>) => Promise<InstanceInfo>,
    rekeyFrom?: string,
  ): Promise<InstanceInfo> {
    const instanceId = newId('i', 12);
    const cleanup = new CleanupStack();
    const network = await inSpan('agent.network.allocate', {}, () => this.#o.networks.allocate(instanceId));
    cleanup.push('network', () => this.#o.networks.release(network));
    try {
      if (this.#o.driver.capabilities.network === 'tap') {
        network.tap = await this.#o.networks.attachTap(network);
      }
      const guestToken = randomBytes(32).toString('hex');
      return await inSpan('agent.driver.start', { 'space.driver': this.#o.driver.name }, async () => {
        const inst = await make({ instanceId, template, pidsLimit: this.#o.pidsLimit, guestToken, network });
        cleanup.push('instance', () => this.#o.driver.destroy(inst.instanceId));
        if (rekeyFrom !== undefined) await rekey(inst, rekeyFrom, guestToken);
        cleanup.release();
        return inst;
      });
    } catch (err) {
      const left = await cleanup.unwind();
      if (left.length)
        this.#o.log.warn({ err, [F.instanceId]: instanceId, left }, 'undoing a failed start left');
      throw err;
    }
  }

  /**
   * Runs the template's start command on a booted instance and waits for its ready check
   * (template-start.ts); when that fails the instance is destroyed and its network freed.
   * @throws SpaceError TEMPLATE_START_FAILED, GUEST_UNAVAILABLE.
   */
  async #serve(inst: InstanceInfo, template: string, start: TemplateStart): Promise<void> {
    const guest = new GuestClient(inst.guest);
    try {
      await inSpan('agent.template.start', { 'space.template': template }, () =>
        startTemplate(guest, template, start),
      );
    } catch (err) {
      await this.destroy(inst).catch((e: unknown) =>
        this.#o.log.warn(
          { err: e, [F.instanceId]: inst.instanceId },
          'destroying an instance whose start failed failed',
        ),
      );
      throw err;
    } finally {
      await guest.close();
    }
  }

  /** Destroys an instance and frees its network. Idempotent. */
  async destroy(inst: InstanceInfo): Promise<void> {
    await this.#o.driver.destroy(inst.instanceId);
    await this.#o.networks.release(inst.network);
  }
}

/** A restored guest still holds the snapshot's secret: replaces it with `token`, the instance's own. */
async function rekey(inst: InstanceInfo, snapshotToken: string, token: string): Promise<void> {
  const old = new GuestClient({ ...inst.guest, token: snapshotToken });
  try {
    await old.rotateToken(token);
  } finally {
    await old.close();
  }
}
