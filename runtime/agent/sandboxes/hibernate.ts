/**
 * Hibernate: a sandbox's command pumps are detached, its instance frozen and snapshotted into the
 * hibernation store together with its spools, then destroyed and the sandbox forgotten here (any
 * node reading the store can resume it, resume.ts). Also what is left of hibernations: the view the
 * data plane serves of one, and the sweep of those whose sandbox is gone.
 */
import { cp, mkdir, readdir, readFile, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { F } from '../../core/log-fields.ts';
import { GuestClient } from '../guest-client.ts';
import { writeFileAtomic } from '../host/durable-file.ts';
import type { SandboxContext } from './context.ts';
import { type HibernatedView, readHibernatedView } from './hibernated-view.ts';
import { detach, quiesce } from './pause.ts';
import type { HibernatedFile } from './state-files.ts';
import type { Hibernation, LocalSandbox } from './types.ts';

/**
 * Hibernates `sb` into the store (called by the pause verb, one at a time per sandbox). On failure
 * the sandbox runs on as it was (thawed when it was not frozen before) and nothing of the attempt
 * is left in the store. A hibernation is complete once `hibernated.json` exists (written last, by a
 * rename); an agent killed before that leaves a folder adoption drops (adopt.ts). Returns where it
 * is and when (epoch ms, this node's clock) the instance was frozen for it.
 * @throws SpaceError SANDBOX_BUSY, SNAPSHOT_UNSUPPORTED / DRIVER_FAILED from the driver.
 */
export async function hibernate(
  ctx: SandboxContext,
  sb: LocalSandbox,
): Promise<{ hibernation: Hibernation; pausedAt: number }> {
  const { o } = ctx;
  const log = o.log.child({ [F.sandboxId]: sb.id });
  const path = join(o.hibernateDir, sb.id);
  const started = Date.now();
  const wasFrozen = sb.paused === 'frozen';
  /** Milliseconds per step, logged with the result (where a slow hibernation spends its time). */
  const steps: Record<string, number> = {};
  let mark = Date.now();
  const step = (name: string) => {
    steps[name] = Date.now() - mark;
    mark = Date.now();
  };
  if (!wasFrozen) await quiesce(sb);
  step('quiesceMs');
  // detach first, while the guest still runs, so it sees the connections close; the spools stay
  // on disk and the guest keeps the output written meanwhile for the resumed pumps
  await detach(sb);
  step('detachMs');
  let pausedAt = sb.pausedAt ?? Date.now();
  try {
    if (!wasFrozen) {
      await o.driver.pause(sb.instance.instanceId);
      pausedAt = Date.now();
      // an agent killed from here on finds the freeze recorded (adopt.ts)
      sb.pausedAt = pausedAt;
      await ctx.files.patch(sb.id, { paused: 'frozen', pausedAt });
    }
    step('freezeMs');
    await rm(path, { recursive: true, force: true });
    await mkdir(path, { recursive: true, mode: 0o700 });
    const snapshot = await o.driver.snapshot(sb.instance.instanceId, join(path, 'snapshot'));
    step('snapshotMs');
    await cp(join(ctx.files.dir(sb.id), 'commands'), join(path, 'commands'), { recursive: true });
    const file: HibernatedFile = {
      sandboxId: sb.id,
      template: sb.template,
      snapshot,
      source: sb.source,
      hibernatedAt: Date.now(),
      pausedAt,
      sessionId: sb.sessionId,
    };
    await writeFileAtomic(join(path, 'hibernated.json'), JSON.stringify(file));
  } catch (err) {
    // the sandbox runs on as it was: nothing of the attempt is left
    await rm(path, { recursive: true, force: true });
    if (!wasFrozen) {
      await o.driver.resume(sb.instance.instanceId).catch(() => {});
      sb.paused = null;
      sb.pausedAt = undefined;
      await ctx.files.patch(sb.id, { paused: undefined, pausedAt: undefined }).catch(() => {});
    }
    sb.guest = new GuestClient(sb.instance.guest);
    await ctx.files.adoptCommands(sb, o);
    throw err;
  }
  ctx.reg.running.delete(sb.id);
  o.activity?.untrack(sb.id);
  await ctx.egress.unregister(sb.id, sb.instance.network.sandboxAddress).catch(() => {});
  step('spoolsMs');
  await ctx.slots
    .discard(sb.instance)
    .catch((err: unknown) => log.warn({ err }, 'destroying the hibernated instance failed'));
  await rm(ctx.files.dir(sb.id), { recursive: true, force: true });
  step('destroyMs');
  log.info({ path, [F.durationMs]: Date.now() - started, ...steps }, 'sandbox hibernated');
  return { hibernation: { store: o.hibernateStore, path }, pausedAt };
}

/**
 * The `hibernated.json` of the hibernation folder `path`, or null when there is none (no folder, or
 * a hibernation that did not finish) or it cannot be parsed.
 */
export async function readHibernation(path: string): Promise<HibernatedFile | null> {
  const raw = await readFile(join(path, 'hibernated.json'), 'utf8').catch(() => null);
  if (!raw) return null;
  try {
    return JSON.parse(raw) as HibernatedFile;
  } catch {
    return null;
  }
}

/**
 * The sandbox `id` as hibernated into this node's store, when it is there and this node does not
 * run it; null otherwise. Reads `hibernated.json` and the command records beside it (R27: its
 * spooled output stays readable on the agent's own URL while it is paused).
 */
export async function hibernatedView(ctx: SandboxContext, id: string): Promise<HibernatedView | null> {
  if (ctx.reg.running.has(id) || !/^[A-Za-z0-9_-]+$/.test(id)) return null;
  return readHibernatedView(id, join(ctx.o.hibernateDir, id));
}

/**
 * Removes hibernated sandboxes from the store whose record `isGone` (deleted while no node that
 * reads the store was up). Returns the ids removed.
 */
export async function sweepHibernated(
  ctx: SandboxContext,
  isGone: (id: string) => Promise<boolean>,
): Promise<string[]> {
  const removed: string[] = [];
  for (const id of await readdir(ctx.o.hibernateDir).catch(() => [] as string[])) {
    if (ctx.reg.running.has(id) || !(await isGone(id))) continue;
    await rm(join(ctx.o.hibernateDir, id), { recursive: true, force: true });
    removed.push(id);
  }
  return removed;
}
