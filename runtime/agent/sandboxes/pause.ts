/**
 * Pause (frozen) and the steps a pause shares with hibernation: quiescing a sandbox's guest calls,
 * freezing and thawing its instance (recorded in its state file, for an agent restart) and
 * detaching its command pumps and guest connection.
 */
import { join } from 'node:path';
import { SpaceError } from '../../core/errors.ts';
import type { PauseMode } from '../../core/types.ts';
import { DETACH } from '../commands/commands.ts';
import type { SandboxContext } from './context.ts';
import { hibernate, readHibernation } from './hibernate.ts';
import type { LocalSandbox, PauseOutcome } from './types.ts';

/**
 * Pauses a sandbox. `frozen`: the driver freezes its instance (memory kept, streams and spools
 * stay attached). `hibernated`: see hibernate.ts (any node reading the store can resume it).
 * Idempotent: a sandbox already paused that way answers as such (with how long ago its instance
 * stopped running); a frozen one can still be hibernated. One pause/resume at a time per sandbox.
 * @throws SpaceError SANDBOX_NOT_FOUND, SANDBOX_BUSY (guest calls did not end); SNAPSHOT_UNSUPPORTED
 *   / DRIVER_FAILED from the driver (the sandbox then runs on as before).
 */
export function pauseSandbox(ctx: SandboxContext, id: string, mode: PauseMode): Promise<PauseOutcome> {
  const { o, reg } = ctx;
  return reg.serial(id, async () => {
    const path = join(o.hibernateDir, id);
    if (!reg.running.has(id)) {
      const done = await readHibernation(path);
      if (done) {
        return {
          mode: 'hibernated' as const,
          hibernation: { store: o.hibernateStore, path },
          pausedForMs: msSince(done.pausedAt ?? done.hibernatedAt),
        };
      }
    }
    const sb = reg.get(id);
    if (mode === 'frozen') {
      if (!sb.paused) await freeze(ctx, sb);
      return { mode: 'frozen' as const, pausedForMs: msSince(sb.pausedAt) };
    }
    const h = await hibernate(ctx, sb);
    return { mode: 'hibernated' as const, hibernation: h.hibernation, pausedForMs: msSince(h.pausedAt) };
  });
}

/** Milliseconds from `at` (epoch ms, this node's clock) to now, never negative; undefined stays so. */
export function msSince(at: number | undefined, now = Date.now()): number | undefined {
  return at === undefined ? undefined : Math.max(0, now - at);
}

/**
 * Freezes a running sandbox's instance (quiesced first) and records it in its state file with the
 * moment, so an agent restart knows the freeze happened. Called with the sandbox's serial held.
 * @throws SpaceError SANDBOX_BUSY, DRIVER_FAILED (the sandbox then runs on as before).
 */
export async function freeze(ctx: SandboxContext, sb: LocalSandbox): Promise<void> {
  await quiesce(sb);
  try {
    await ctx.o.driver.pause(sb.instance.instanceId);
  } catch (err) {
    sb.paused = null;
    throw err;
  }
  sb.paused = 'frozen';
  sb.pausedAt = Date.now();
  ctx.o.activity?.paused(sb.id);
  // the instance is frozen whatever the file says (an agent start reads the instance's state): a
  // record the disk has no room for must not turn a done freeze into a failed pause
  await ctx.files
    .patch(sb.id, { paused: 'frozen', pausedAt: sb.pausedAt })
    .catch((err: unknown) =>
      ctx.o.log.warn({ err, sandboxId: sb.id }, 'freeze not recorded in the state file'),
    );
}

/**
 * Thaws a sandbox's frozen instance and clears the freeze from its state file. Called with the
 * sandbox's serial held. @throws DRIVER_FAILED (the sandbox stays frozen).
 */
export async function thaw(ctx: SandboxContext, sb: LocalSandbox): Promise<void> {
  await ctx.o.driver.resume(sb.instance.instanceId);
  sb.paused = null;
  sb.pausedAt = undefined;
  sb.resumedAt = Date.now();
  await ctx.files
    .patch(sb.id, { paused: undefined, pausedAt: undefined })
    .catch((err: unknown) =>
      ctx.o.log.warn({ err, sandboxId: sb.id }, 'thaw not recorded in the state file'),
    );
  ctx.o.activity?.resumed(sb.id);
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

/**
 * Brings a sandbox's instance to what the control plane's record says (the agent's reconciliation):
 * `running` thaws one that is frozen (a pause whose operation failed after the node froze it, e.g.
 * an agent killed mid-pause), `frozen` freezes one that runs (a resume whose operation failed after
 * the node thawed it). `stillWanted` reads the record again inside the sandbox's serial section, so
 * a pause or resume dispatched meanwhile wins. Returns whether the instance was changed.
 * @throws what {@link freeze} / {@link thaw} throw.
 */
export function convergePause(
  ctx: SandboxContext,
  id: string,
  want: 'running' | 'frozen',
  stillWanted: () => Promise<boolean>,
): Promise<boolean> {
  return ctx.reg.serial(id, async () => {
    const sb = ctx.reg.running.get(id);
    if (!sb || (want === 'running' ? sb.paused !== 'frozen' : sb.paused !== null)) return false;
    if (!(await stillWanted())) return false;
    if (want === 'running') await thaw(ctx, sb);
    else await freeze(ctx, sb);
    return true;
  });
}
