/**
 * Resume: thaws a frozen sandbox, or restores a hibernated one from the store as a new instance
 * (new network and guest secret), with its egress applied again and its command pumps resumed at
 * the spooled offsets.
 */
import { cp, mkdir, readFile, rm } from 'node:fs/promises';
import { join, resolve, sep } from 'node:path';
import { SpaceError } from '../../core/errors.ts';
import { F } from '../../core/log-fields.ts';
import { GuestClient } from '../guest-client.ts';
import type { SandboxContext } from './context.ts';
import { msSince, thaw } from './pause.ts';
import type { HibernatedFile, SandboxFile } from './state-files.ts';
import {
  type CreateSandbox,
  type Hibernation,
  type LocalSandbox,
  localSandbox,
  type ResumeOutcome,
} from './types.ts';

/**
 * Resumes a sandbox. Without `restore`: thaws the frozen instance this node holds. With it:
 * restores the hibernated sandbox from `restore.hibernation` (which must be in this node's store).
 * Idempotent: a running sandbox answers at once — after its driver confirmed the instance runs (one
 * the driver holds paused though the sandbox is not, e.g. left so by an agent killed mid-pause, is
 * thawed), so a resume that answers means the instance runs. One pause/resume at a time per
 * sandbox. `runningForMs` in the answer: how long ago the instance ran again (the metering boundary).
 * @throws SpaceError NODE_UNAVAILABLE (shutting down), SANDBOX_NOT_FOUND (nothing to thaw or
 *   restore, or deleted), BAD_REQUEST (a path outside the store), DRIVER_FAILED (the thaw or the
 *   restore failed: the snapshot stays for a retry).
 */
export async function resumeSandbox(
  ctx: SandboxContext,
  id: string,
  restore?: CreateSandbox & { hibernation: Hibernation },
): Promise<ResumeOutcome> {
  const { o, reg } = ctx;
  if (reg.closing) throw new SpaceError('NODE_UNAVAILABLE', 'the node agent is shutting down');
  return reg.serial(id, async () => {
    const existing = reg.running.get(id);
    if (existing) {
      const how = existing.paused === 'frozen' || !restore ? ('thawed' as const) : ('restored' as const);
      if (existing.paused === 'frozen') {
        await thaw(ctx, existing);
      } else {
        const listed = (await o.driver.list()).find((i) => i.instanceId === existing.instance.instanceId);
        if (listed?.state === 'paused') {
          o.log.warn(
            { [F.sandboxId]: id, [F.instanceId]: listed.instanceId },
            'resume found the instance paused though its sandbox was not: thawing it',
          );
          await thaw(ctx, existing);
        }
      }
      return {
        instanceId: existing.instance.instanceId,
        how,
        ...(existing.resumedAt !== undefined ? { runningForMs: msSince(existing.resumedAt) } : {}),
      };
    }
    if (!restore) {
      throw new SpaceError('SANDBOX_NOT_FOUND', `sandbox ${id} is not on this node`, { sandboxId: id });
    }
    if (reg.tombstones.has(id)) {
      throw new SpaceError('SANDBOX_NOT_FOUND', `sandbox ${id} was deleted`, { sandboxId: id });
    }
    const sb = await restoreHibernated(ctx, restore);
    return {
      instanceId: sb.instance.instanceId,
      how: 'restored' as const,
      runningForMs: msSince(sb.resumedAt),
    };
  });
}

async function restoreHibernated(
  ctx: SandboxContext,
  req: CreateSandbox & { hibernation: Hibernation },
): Promise<LocalSandbox> {
  const { o } = ctx;
  const log = o.log.child({ [F.sandboxId]: req.sandboxId });
  const root = resolve(o.hibernateDir);
  const path = resolve(req.hibernation.path);
  if (req.hibernation.store !== o.hibernateStore || !path.startsWith(root + sep)) {
    throw new SpaceError('BAD_REQUEST', `hibernation ${req.hibernation.path} is not in this node's store`, {
      store: req.hibernation.store,
    });
  }
  const raw = await readFile(join(path, 'hibernated.json'), 'utf8').catch(() => null);
  if (!raw) {
    throw new SpaceError('SANDBOX_NOT_FOUND', `no hibernated sandbox ${req.sandboxId} in the store`, {
      sandboxId: req.sandboxId,
    });
  }
  const file = JSON.parse(raw) as HibernatedFile;
  const started = Date.now();
  const inst = await ctx.factory.starts.run('create', () => ctx.factory.restore(req.template, file.snapshot));
  const dir = ctx.files.dir(req.sandboxId);
  try {
    await rm(dir, { recursive: true, force: true });
    await mkdir(dir, { recursive: true });
    await cp(join(path, 'commands'), join(dir, 'commands'), { recursive: true }).catch(() =>
      mkdir(join(dir, 'commands'), { recursive: true }),
    );
    const rec: SandboxFile = {
      req: { ...req, env: {} },
      instance: inst,
      source: file.source,
      fromWarmPool: file.source === 'warm',
      createdAt: Date.now(),
    };
    await ctx.files.writeRecord(req.sandboxId, rec);
    const sb = localSandbox(req, inst, new GuestClient(inst.guest), file.source);
    sb.resumedAt = Date.now();
    await ctx.egress.apply(sb.id, inst, sb.egress, sb.credentials);
    o.activity?.track(sb.id, { reported: 'paused' });
    await ctx.files.adoptCommands(sb, o);
    ctx.reg.running.set(sb.id, sb);
    o.activity?.resumed(sb.id);
  } catch (err) {
    o.activity?.untrack(req.sandboxId);
    await ctx.egress.unregister(req.sandboxId, inst.network.sandboxAddress).catch(() => {});
    await ctx.slots.discard(inst).catch(() => {});
    await rm(dir, { recursive: true, force: true });
    throw err;
  }
  await rm(path, { recursive: true, force: true });
  log.info(
    { [F.instanceId]: inst.instanceId, [F.durationMs]: Date.now() - started },
    'sandbox restored from hibernation',
  );
  return ctx.reg.get(req.sandboxId);
}
