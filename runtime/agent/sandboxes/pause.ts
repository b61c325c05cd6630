/**
 * Pause (frozen) and the steps a pause shares with hibernation: quiescing a sandbox's guest calls
 * and detaching its command pumps and guest connection.
 */
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { SpaceError } from '../../core/errors.ts';
import type { PauseMode } from '../../core/types.ts';
import { DETACH } from '../commands/commands.ts';
import type { SandboxContext } from './context.ts';
import { hibernate } from './hibernate.ts';
import type { Hibernation, LocalSandbox } from './types.ts';

/**
 * Pauses a sandbox. `frozen`: the driver freezes its instance (memory kept, streams and spools
 * stay attached). `hibernated`: see hibernate.ts (any node reading the store can resume it).
 * Idempotent: a sandbox already paused that way answers as such; a frozen one can still be
 * hibernated. One pause/resume at a time per sandbox.
 * @throws SpaceError SANDBOX_NOT_FOUND, SANDBOX_BUSY (guest calls did not end); SNAPSHOT_UNSUPPORTED
 *   / DRIVER_FAILED from the driver (the sandbox then runs on as before).
 */
export function pauseSandbox(
  ctx: SandboxContext,
  id: string,
  mode: PauseMode,
): Promise<{ mode: PauseMode; hibernation?: Hibernation }> {
  const { o, reg } = ctx;
  return reg.serial(id, async () => {
    const path = join(o.hibernateDir, id);
    if (!reg.running.has(id) && existsSync(join(path, 'hibernated.json'))) {
      return { mode: 'hibernated' as const, hibernation: { store: o.hibernateStore, path } };
    }
    const sb = reg.get(id);
    if (mode === 'frozen') {
      if (!sb.paused) {
        await quiesce(sb);
        try {
          await o.driver.pause(sb.instance.instanceId);
        } catch (err) {
          sb.paused = null;
          throw err;
        }
        sb.paused = 'frozen';
        o.activity?.paused(id);
        await ctx.files.patch(id, { paused: 'frozen' });
      }
      return { mode: 'frozen' as const };
    }
    return { mode: 'hibernated' as const, hibernation: await hibernate(ctx, sb) };
  });
}

/**
 * Refuses new guest calls and waits until those in flight end, for at most `timeoutMs`.
 * @throws SpaceError SANDBOX_BUSY when they do not (the sandbox runs on as before).
 */
export async function quiesce(sb: LocalSandbox, timeoutMs = 10_000): Promise<void> {
  sb.paused = 'pausing';
  const until = Date.now() + timeoutMs;
  // a claim's env may still be on its way into the guest: it lands before the guest is frozen
  await sb.guest.settled();
  while (sb.guestCalls > 0) {
    if (Date.now() > until) {
      sb.paused = null;
      throw new SpaceError('SANDBOX_BUSY', `sandbox ${sb.id} still had calls to its guest in flight`, {
        sandboxId: sb.id,
        calls: sb.guestCalls,
      });
    }
    await new Promise((r) => setTimeout(r, 10));
  }
}

/** Stops a sandbox's command pumps (spools stay resumable) and closes its guest connection. */
export async function detach(sb: LocalSandbox): Promise<void> {
  for (const c of sb.commands.values()) c.abort.abort(DETACH);
  await Promise.allSettled(
    [...sb.commands.values()].map(async (c) => {
      await c.done;
      await c.spool.close();
    }),
  );
  sb.commands.clear();
  for (const a of sb.guestStreams) a.abort();
  await sb.guest.close();
}
