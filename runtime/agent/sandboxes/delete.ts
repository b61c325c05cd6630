/**
 * Delete: destroys a sandbox (its processes, files, network, gateway registration) and leaves a
 * tombstone, so a create still in flight or arriving late is refused and destroys what it made.
 */
import { rm } from 'node:fs/promises';
import { join } from 'node:path';
import { F } from '../../core/log-fields.ts';
import type { SandboxContext } from './context.ts';
import { reportEndBeforeDelete } from './watchdog.ts';

/**
 * Destroys the sandbox `id` and leaves a tombstone. Idempotent (a second delete joins the one in
 * flight), and it finishes whatever side step fails: a gateway that cannot be told (it is down or
 * restarting — a restarted gateway holds no registration anyway) is logged and skipped; when the
 * instance itself cannot be destroyed the sandbox stays listed (so the node still reports it and
 * the next delete, or the agent's reconciliation, tries again) and the error is thrown.
 * @throws SpaceError DRIVER_FAILED (or the driver's error) when the instance is still there.
 */
export function deleteSandbox(ctx: SandboxContext, id: string): Promise<void> {
  let p = ctx.reg.deleting.get(id);
  if (!p) {
    p = destroy(ctx, id).finally(() => ctx.reg.deleting.delete(id));
    ctx.reg.deleting.set(id, p);
  }
  return p;
}

async function destroy(ctx: SandboxContext, id: string): Promise<void> {
  const { o, reg } = ctx;
  reg.tombstone(id);
  const creating = reg.creating.get(id);
  if (creating) await creating.catch(() => {}); // its own tombstone check destroys what it made
  await reg.lifecycle.get(id)?.catch(() => {});
  o.activity?.untrack(id);
  const sb = reg.running.get(id);
  if (sb) {
    const log = o.log.child({ [F.sandboxId]: id });
    await reportEndBeforeDelete(ctx, sb);
    for (const c of sb.commands.values()) c.abort.abort();
    for (const a of sb.guestStreams) a.abort();
    await sb.guest.close();
    await ctx.egress
      .unregister(id, sb.instance.network.sandboxAddress)
      .catch((err: unknown) => log.warn({ err }, 'gateway unregistration failed; destroying anyway'));
    // only once the instance is gone does the sandbox leave this node's inventory
    await ctx.slots.discard(sb.instance);
    reg.running.delete(id);
    await Promise.allSettled(
      [...sb.commands.values()].map(async (c) => {
        await c.done;
        await c.spool.close();
      }),
    );
    log.info('sandbox destroyed');
  }
  await rm(ctx.files.dir(id), { recursive: true, force: true });
  await rm(join(o.hibernateDir, id), { recursive: true, force: true });
}
