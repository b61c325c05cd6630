/**
 * A node agent's start and end: adopting what an earlier agent left running (from the state
 * files), letting go of every sandbox without destroying it (an agent restart that keeps them),
 * and destroying everything (a local stack's shutdown).
 */
import { existsSync } from 'node:fs';
import { readdir, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { F } from '../../core/log-fields.ts';
import { DETACH } from '../commands/commands.ts';
import type { InstanceInfo } from '../drivers/driver.ts';
import { GuestClient } from '../guest-client.ts';
import { type JsonRead, readJsonFile } from '../host/durable-file.ts';
import type { SandboxContext } from './context.ts';
import { readHibernation } from './hibernate.ts';
import type { SandboxFile } from './state-files.ts';
import { localSandbox } from './types.ts';

/** Whether an instance's guest daemon answers /health (the ground truth of "alive"). */
async function guestAnswers(inst: InstanceInfo): Promise<boolean> {
  const g = new GuestClient(inst.guest);
  try {
    await g.health();
    return true;
  } catch {
    return false;
  } finally {
    await g.close();
  }
}

/** What adoption did (ids of sandboxes), see {@link adopt}. */
export interface Adopted {
  /** Re-bound to their instance (running or frozen). */
  adopted: string[];
  /** Instances no sandbox owned (old warm slots), destroyed. */
  destroyed: string[];
  /** Their instance was gone: the sandbox ended while no agent watched. */
  lost: string[];
  /** A hibernation that had finished when the agent died: kept in the store, forgotten here. */
  hibernated: string[];
  /** A restore from hibernation that had not finished: its instance destroyed, the snapshot kept. */
  unrestored: string[];
}

/**
 * A record for sandbox `id`, whose `sandbox.json` was unreadable (`bad`, now quarantined), from
 * its instance (the folder's marker, among `instances`) and the control plane's record; written
 * back when the disk has room. Null when either is missing (logged either way).
 */
async function rebuild(
  ctx: SandboxContext,
  id: string,
  instances: ReadonlyMap<string, InstanceInfo>,
  bad: Extract<JsonRead<SandboxFile>, { missing: false }>,
): Promise<SandboxFile | null> {
  const log = ctx.o.log.child({ [F.sandboxId]: id });
  const instanceId = await ctx.files.instanceOf(id);
  const inst = instanceId ? instances.get(instanceId) : undefined;
  const req = inst ? await ctx.o.recorded?.(id).catch(() => null) : null;
  if (!inst || !req) {
    log.error(
      {
        reason: bad.reason,
        quarantined: bad.quarantined,
        instanceId,
        found: { instance: !!inst, record: !!req },
      },
      'sandbox state file unreadable and the sandbox cannot be rebuilt; reported lost',
    );
    return null;
  }
  const rec: SandboxFile = {
    req,
    instance: inst,
    source: 'boot',
    fromWarmPool: false,
    createdAt: inst.createdAt,
  };
  await ctx.files
    .writeRecord(id, rec)
    .catch((err: unknown) => log.warn({ err }, 'rebuilt sandbox record not written back; adopted anyway'));
  log.warn(
    { reason: bad.reason, quarantined: bad.quarantined, [F.instanceId]: inst.instanceId },
    'sandbox state file unreadable: quarantined, record rebuilt from its instance and the control plane',
  );
  return rec;
}

/**
 * After an agent restart: re-binds sandboxes whose instance still runs (reopening their command
 * spools; commands that were still running keep streaming from the exact spooled offset),
 * destroys instances no sandbox owns (old warm slots), and drops records whose instance is gone.
 * A sandbox caught in a pause, hibernation or restore by the previous agent's death ends in one
 * state its files and its instance agree on (case F7):
 * - its instance frozen (the driver says paused): adopted frozen — the agent's reconciliation
 *   thaws it when the control plane's record says it runs (the pause failed), and a retried pause
 *   finishes from there;
 * - a hibernation folder of its own instance beside a live instance (the hibernation stopped
 *   before the instance was destroyed, so no pause was ever answered): the folder is dropped;
 * - a complete hibernation of its instance and the instance gone (stopped after the destroy):
 *   hibernated — the store keeps it and a retried pause answers with it;
 * - a complete hibernation of another instance beside a live one (a restore that stopped before
 *   it removed the snapshot, so no resume was ever answered): the restored instance is destroyed
 *   and the snapshot kept for the retried resume.
 */
export async function adopt(ctx: SandboxContext): Promise<Adopted> {
  const { o, reg } = ctx;
  const instances = new Map((await o.driver.list()).map((i) => [i.instanceId, i]));
  const out: Adopted = { adopted: [], destroyed: [], lost: [], hibernated: [], unrestored: [] };
  const root = ctx.files.root;
  for (const id of existsSync(root) ? await readdir(root) : []) {
    const file = join(root, id, 'sandbox.json');
    const read = await readJsonFile<SandboxFile>(file).catch(
      (err: unknown): JsonRead<SandboxFile> => ({
        ok: false,
        missing: false,
        quarantined: null,
        reason: String(err),
      }),
    );
    if (!read.ok && read.missing) {
      // a claim or create that never wrote its record (its instance, if any, is unowned below)
      await rm(join(root, id), { recursive: true, force: true });
      continue;
    }
    const rec = read.ok ? read.value : await rebuild(ctx, id, instances, read);
    if (!rec) {
      // nothing to rebuild it from: reported lost (its instance, if any, is destroyed below)
      out.lost.push(id);
      await rm(join(root, id), { recursive: true, force: true });
      continue;
    }
    const log = o.log.child({ [F.sandboxId]: id });
    const hibDir = join(o.hibernateDir, id);
    const hib = existsSync(hibDir) ? await readHibernation(hibDir) : undefined;
    const listed = instances.get(rec.instance.instanceId);
    // a `runsc state` that failed reads as stopped: trust a guest that still answers; then
    // re-attach to the instance (a VMM's API socket)
    const inst =
      listed && (listed.state !== 'stopped' || (await guestAnswers(listed)))
        ? await o.driver.adopt(listed.instanceId).catch(() => null)
        : null;
    if (listed) instances.delete(listed.instanceId);
    if (!inst) {
      if (listed) await ctx.slots.discard(listed).catch(() => {});
      await rm(join(root, id), { recursive: true, force: true });
      if (hib && hib.snapshot.instanceId === rec.instance.instanceId) {
        out.hibernated.push(id);
        log.warn('a hibernation the previous agent finished is kept in the store');
      } else {
        out.lost.push(id);
      }
      continue;
    }
    if (hib && hib.snapshot.instanceId !== inst.instanceId) {
      await ctx.slots.discard(inst).catch(() => {});
      await rm(join(root, id), { recursive: true, force: true });
      out.unrestored.push(id);
      log.warn({ [F.instanceId]: inst.instanceId }, 'an unfinished restore was undone; its snapshot is kept');
      continue;
    }
    if (hib !== undefined) {
      await rm(hibDir, { recursive: true, force: true });
      log.warn('an unfinished hibernation was dropped; the sandbox stays on its instance');
    }
    const sb = localSandbox(
      { ...rec.req, sandboxId: id, credentials: rec.req.credentials ?? [] },
      inst,
      new GuestClient(inst.guest),
      rec.source ?? (rec.fromWarmPool ? 'warm' : 'boot'),
    );
    // the instance says whether it is frozen (a freeze not yet recorded reads as frozen now)
    sb.paused = inst.state === 'paused' ? 'frozen' : null;
    if (sb.paused) sb.pausedAt = rec.pausedAt ?? Date.now();
    if (sb.paused !== (rec.paused ?? null)) {
      // the instance is what the next start reads too: a record not written (a full disk) stops nothing
      await ctx.files
        .patch(id, { paused: sb.paused ?? undefined, pausedAt: sb.pausedAt })
        .catch((err: unknown) => log.warn({ err }, 'freeze state not written back; adopted anyway'));
    }
    await ctx.egress.apply(id, inst, sb.egress, sb.credentials);
    // the previous agent's open interval is closed by this agent's first report
    o.activity?.track(id, { paused: sb.paused !== null, reported: sb.paused ? 'paused' : null });
    await ctx.files.adoptCommands(sb, o);
    reg.running.set(id, sb);
    out.adopted.push(id);
  }
  out.destroyed = [...instances.keys()];
  for (const inst of instances.values()) await ctx.slots.discard(inst).catch(() => {});
  // the state directories of slots whose instance is already gone (see StateFiles.slotDir)
  await rm(ctx.files.slotsRoot, { recursive: true, force: true });
  await o.networks.sweep(reg.list().map((s) => s.instance.network.netns));
  o.log.info(
    {
      adopted: out.adopted.length,
      destroyed: out.destroyed.length,
      lost: out.lost.length,
      hibernated: out.hibernated.length,
      unrestored: out.unrestored.length,
    },
    'sandboxes re-adopted',
  );
  return out;
}

/**
 * Lets go of every sandbox without destroying it (agent restart with `keep`): stops spooling,
 * closes spools and guest connections. The next agent re-adopts them from disk.
 */
export async function detachAll(ctx: SandboxContext): Promise<void> {
  ctx.reg.closing = true;
  await Promise.allSettled([...ctx.reg.creating.values()]);
  for (const sb of ctx.reg.running.values()) {
    for (const c of sb.commands.values()) c.abort.abort(DETACH);
    await Promise.allSettled(
      [...sb.commands.values()].map(async (c) => {
        await c.done;
        await c.spool.close();
      }),
    );
    for (const a of sb.guestStreams) a.abort();
    await sb.guest.close();
  }
  ctx.reg.running.clear();
  await ctx.slots.closeGuests();
}

/**
 * Destroys every sandbox, including those still being created, and then every instance the
 * driver still has that no sandbox owns (local stack shutdown): nothing of this node is left.
 */
export async function destroyAll(ctx: SandboxContext): Promise<void> {
  const { o, reg } = ctx;
  reg.closing = true;
  const ids = new Set([...reg.running.keys(), ...reg.creating.keys()]);
  await Promise.allSettled([...ids].map((id) => ctx.delete(id)));
  const owned = new Set(reg.list().map((sb) => sb.instance.instanceId));
  const strays = (await o.driver.list().catch(() => [] as InstanceInfo[])).filter(
    (i) => !owned.has(i.instanceId),
  );
  await Promise.allSettled(strays.map((i) => ctx.slots.discard(i)));
  await ctx.slots.closeGuests();
  if (strays.length) o.log.info({ instances: strays.length }, 'unowned instances destroyed');
}
