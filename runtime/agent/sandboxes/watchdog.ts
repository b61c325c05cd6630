/**
 * The watchdog: finds sandboxes that ended on their own (out of memory, a fork bomb exhausting
 * pids, a kernel failure, a claim step that failed), reports why through the crash reporter and
 * deletes them; keeps the gateway's registrations current and the warm slots' guests checked.
 */
import { SpaceError } from '../../core/errors.ts';
import { F } from '../../core/log-fields.ts';
import type { EndReport } from '../../core/types.ts';
import type { SandboxContext } from './context.ts';
import { type CrashReporter, crashReport } from './crash-report.ts';
import type { LocalSandbox } from './types.ts';

/** Why a warm claim's sandbox cannot run anything (its calls' error, its crash message). */
export const EGRESS_NOT_IN_FORCE = "the sandbox's egress policy could not be put in force";

/** Whether the sandbox's guest answers /health now. */
function answers(sb: LocalSandbox): Promise<boolean> {
  return sb.guest.health().then(
    () => true,
    () => false,
  );
}

/**
 * One watchdog pass: a sandbox whose instance stopped on its own is torn down here — its streams
 * end with an exit event at once — and reported through `onCrash` so the control plane records
 * why it ended. A live sandbox the gateway may not hold is registered with it again: after a
 * gateway restart (its registry id changed), a registration that failed, or one this agent cannot
 * confirm. Returns the ids found crashed.
 */
export async function watch(ctx: SandboxContext, onCrash: CrashReporter): Promise<string[]> {
  const { o, reg } = ctx;
  ctx.onCrash = onCrash;
  await Promise.allSettled([
    ctx.egress.registerStale(reg.list(), (id) => reg.tombstones.has(id)),
    ctx.slots.check(),
  ]);
  // no sandbox, nothing to look up: the driver's list is one `runsc list` of every container,
  // warm slots included, every pass
  const states =
    reg.running.size === 0
      ? new Map<string, string>()
      : new Map((await o.driver.list()).map((i) => [i.instanceId, i.state]));
  const crashed: string[] = [];
  for (const sb of reg.list()) {
    const state = states.get(sb.instance.instanceId);
    if (state === 'running' || state === 'paused') continue;
    // an instance being made or destroyed by this agent is not one that stopped on its own
    if (reg.inTransit(sb.id)) continue;
    // the driver's view can be wrong under load (a `runsc state` that timed out reads as
    // stopped): a sandbox whose guest still answers is alive, whatever the driver said
    if (await answers(sb)) continue;
    if (reg.tombstones.has(sb.id)) continue; // deleted while its health was being asked
    crashed.push(sb.id);
    await endCrashed(ctx, sb, onCrash);
  }
  return crashed;
}

/**
 * A step a claim left to finish behind the create failed (GuestClient.holdUntil: the guest did
 * not take the sandbox's env, or its egress policy could not be put in force): the sandbox cannot
 * run what it is asked to, so it ends as crashed (reported through the watchdog's `onCrash`, then
 * deleted), as an instance that stopped on its own does. `what` opens the message. Nothing when
 * it is being deleted or has crashed already.
 */
export async function claimStepFailed(
  ctx: SandboxContext,
  sb: LocalSandbox,
  what: string,
  err: unknown,
): Promise<void> {
  const { o, reg } = ctx;
  if (reg.tombstones.has(sb.id) || reg.running.get(sb.id) !== sb || sb.crashed) return;
  const message = `${what}: ${(err as Error).message}`;
  sb.crashed = message;
  o.log.warn({ err, [F.sandboxId]: sb.id, [F.instanceId]: sb.instance.instanceId }, message);
  try {
    await ctx.onCrash?.(sb.id, { reason: 'crashed', message });
  } catch (e) {
    o.log.error({ err: e, [F.sandboxId]: sb.id }, 'reporting a sandbox whose claim step failed failed');
  }
  await ctx
    .delete(sb.id)
    .catch((e: unknown) =>
      o.log.error({ err: e, [F.sandboxId]: sb.id }, 'deleting a sandbox whose claim step failed failed'),
    );
}

/**
 * Ends a sandbox whose instance stopped on its own: reads why from the driver (before the delete
 * removes the evidence), reports it through `onCrash` and deletes it. Returns the message.
 */
async function endCrashed(ctx: SandboxContext, sb: LocalSandbox, onCrash: CrashReporter): Promise<string> {
  const report = await crashed(ctx, sb);
  await onCrash(sb.id, report);
  await ctx.delete(sb.id);
  return report.message;
}

/** Marks `sb` as ended on its own, with the cause the driver read (logged). */
async function crashed(ctx: SandboxContext, sb: LocalSandbox): Promise<EndReport> {
  const cause = await ctx.o.driver.endCause?.(sb.instance.instanceId).catch(() => undefined);
  const report = crashReport(cause);
  sb.crashed = report.message;
  ctx.o.log.warn(
    { [F.sandboxId]: sb.id, [F.instanceId]: sb.instance.instanceId, cause },
    'sandbox stopped on its own',
  );
  return report;
}

/**
 * Before a delete destroys the evidence: a sandbox whose instance already ended on its own (the
 * host counted an OOM kill or a refused fork, and the instance no longer runs) is reported as
 * such, so a delete that raced the crash never turns its cause into `request` (case R21). Only
 * the cheap counters are read first; the driver is asked for the state only when they name a
 * cause. Never throws.
 */
export async function reportEndBeforeDelete(ctx: SandboxContext, sb: LocalSandbox): Promise<void> {
  const { driver, log } = ctx.o;
  if (sb.crashed || sb.paused || !ctx.onCrash || !driver.endCause) return;
  try {
    const cause = await driver.endCause(sb.instance.instanceId);
    if (!cause) return;
    const state = (await driver.list()).find((i) => i.instanceId === sb.instance.instanceId)?.state;
    if (state === 'running' || state === 'paused') return;
    await ctx.onCrash(sb.id, await crashed(ctx, sb));
  } catch (err) {
    log.warn({ err, [F.sandboxId]: sb.id }, 'reading whether a deleted sandbox had ended failed');
  }
}

/**
 * Called when the guest did not answer a call: if the instance has stopped, the sandbox is ended
 * now (as a watchdog pass would) and SANDBOX_CRASHED is returned for the caller to throw instead of
 * GUEST_UNAVAILABLE, so requests to a dead sandbox fail at once with the cause. Otherwise `err`.
 */
export async function guestFailed(ctx: SandboxContext, id: string, err: unknown): Promise<unknown> {
  if (!(err instanceof SpaceError) || err.code !== 'GUEST_UNAVAILABLE') return err;
  const { o, reg } = ctx;
  const sb = reg.running.get(id);
  // already found dead (by the watchdog or an earlier call), maybe still being torn down
  if (sb?.crashed) return new SpaceError('SANDBOX_CRASHED', sb.crashed, { sandboxId: id }, { cause: err });
  // an instance being made or destroyed by this agent is not one that stopped on its own
  if (!sb || reg.inTransit(id) || sb.paused) return err;
  const state = (await o.driver.list().catch(() => [])).find(
    (i) => i.instanceId === sb.instance.instanceId,
  )?.state;
  if (state === 'running' || state === 'paused' || state === undefined) return err;
  // as in the watchdog: the driver's view can be wrong under load; a guest that answers is alive
  if (await answers(sb)) return err;
  if (reg.tombstones.has(id)) return err; // deleted while its health was being asked
  const message =
    sb.crashed ?? (ctx.onCrash ? await endCrashed(ctx, sb, ctx.onCrash) : crashReport(undefined).message);
  return new SpaceError('SANDBOX_CRASHED', message, { sandboxId: id }, { cause: err });
}
