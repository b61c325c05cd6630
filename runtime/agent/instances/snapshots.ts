/**
 * Template snapshots: when the driver can snapshot and restore, one instance per template and shape
 * is booted once and snapshotted, and later cold creates of that shape restore from it instead of
 * booting (the factory's `make`).
 */
import { rm } from 'node:fs/promises';
import { join } from 'node:path';
import type { Logger } from 'pino';
import { F } from '../../core/log-fields.ts';
import type { InstanceInfo, SnapshotRef, TemplateImage } from '../drivers/driver.ts';
import { readJsonFile } from '../host/durable-file.ts';
import type { InstanceFactory, InstanceShape } from './factory.ts';

/**
 * Makes the template's snapshot on this node when the driver can snapshot and restore: boots one
 * instance of `shape`, snapshots it once its guest answers, and throws the instance away (through
 * `discard`). Reuses a snapshot left on disk (`<stateDir>/snapshots/…`) by an earlier agent when it
 * was taken from the same image and driver settings (`snapshotKey`). Records it in
 * `factory.snapshots`. Returns null when the driver cannot.
 * @throws SpaceError DRIVER_FAILED / SNAPSHOT_UNSUPPORTED when making it fails (nothing is left).
 */
export async function prepareSnapshot(
  o: {
    factory: InstanceFactory;
    stateDir: string;
    templateImage: (template: string) => Promise<TemplateImage>;
    discard: (inst: InstanceInfo) => Promise<void>;
    log: Logger;
  },
  template: string,
  shape: InstanceShape,
): Promise<SnapshotRef | null> {
  const { factory } = o;
  const driver = factory.driver;
  if (!driver.capabilities.snapshot || !driver.capabilities.restore) return null;
  const image = await o.templateImage(template);
  const dir = join(
    o.stateDir,
    'snapshots',
    template,
    driver.snapshotKey ? `${image.digest}-${driver.snapshotKey}` : image.digest,
    `${shape.vcpus}x${shape.memoryMiB}x${factory.diskMiB}`,
  );
  // a torn one is quarantined and the snapshot made again
  const saved = await readJsonFile<SnapshotRef>(join(dir, 'snapshot.json')).catch(() => null);
  if (saved?.ok) {
    const ref = saved.value;
    if (ref.driver === driver.name) {
      factory.snapshots.set(template, ref);
      return ref;
    }
  }
  await rm(dir, { recursive: true, force: true });
  factory.snapshots.delete(template);
  const { inst } = await factory.make(template, shape, 'create');
  try {
    const ref = await driver.snapshot(inst.instanceId, dir);
    factory.snapshots.set(template, ref);
    o.log.info({ [F.templateId]: template, path: dir }, 'template snapshot made');
    return ref;
  } catch (err) {
    await rm(dir, { recursive: true, force: true });
    throw err;
  } finally {
    await o
      .discard(inst)
      .catch((e: unknown) => o.log.warn({ err: e }, 'discarding the snapshot source instance failed'));
  }
}
