/**
 * Create: binds a sandbox id to an instance, claimed from the warm pool or made by the factory
 * (a snapshot restore or a cold boot). Idempotent per id (a second create joins the first); a
 * delete leaves a tombstone, so a create that arrives late or is still booting is refused and its
 * instance destroyed — nothing is left behind on either order.
 */
import { rm } from 'node:fs/promises';
import { SpaceError } from '../../core/errors.ts';
import { F } from '../../core/log-fields.ts';
import { inSpan } from '../../core/tracing.ts';
import type { InstanceInfo } from '../drivers/driver.ts';
import { GuestClient } from '../guest-client.ts';
import { processAlive } from '../instances/process-alive.ts';
import type { SandboxContext } from './context.ts';
import { type CreateSandbox, type InstanceSource, type LocalSandbox, localSandbox } from './types.ts';
import { claimStepFailed, EGRESS_NOT_IN_FORCE } from './watchdog.ts';

/**
 * Creates (or returns) the sandbox.
 * @throws SpaceError NODE_UNAVAILABLE (shutting down), SANDBOX_NOT_FOUND (deleted meanwhile), or
 *   what making its instance throws (then nothing of it is left).
 */
export async function createSandbox(ctx: SandboxContext, req: CreateSandbox): Promise<LocalSandbox> {
  const { reg } = ctx;
  if (reg.closing) throw new SpaceError('NODE_UNAVAILABLE', 'the node agent is shutting down');
  if (reg.tombstones.has(req.sandboxId)) {
    throw new SpaceError('SANDBOX_NOT_FOUND', `sandbox ${req.sandboxId} was deleted`, {
      sandboxId: req.sandboxId,
    });
  }
  const existing = reg.running.get(req.sandboxId);
  if (existing) return existing;
  let p = reg.creating.get(req.sandboxId);
  if (!p) {
    ctx.slots.createSeen(); // a create came: not quiet yet
    p = claimOrMake(ctx, req)
      .finally(() => {
        // The pool is topped up once the creates are done, never while they run: a refill's
        // synchronous start (the start gate, the driver's first spawns) ran inside the claim's
        // reply and cost it ~8 ms of a ~14 ms warm claim, and inside a burst it held up the claims
        // after it (refillDelay). The refill is not part of this create's trace either.
        ctx.slots.createEnded();
      })
      .finally(() => reg.creating.delete(req.sandboxId));
    reg.creating.set(req.sandboxId, p);
  }
  return p;
}

async function claimOrMake(ctx: SandboxContext, req: CreateSandbox): Promise<LocalSandbox> {
  const { o, reg } = ctx;
  const log = o.log.child({ [F.sandboxId]: req.sandboxId });
  const shape = { vcpus: req.vcpus, memoryMiB: req.memoryMiB };
  let inst: InstanceInfo | null = ctx.slots.claim(req.template, shape);
  let source: InstanceSource = 'warm';
  let guest: GuestClient | null = null;
  let registered = false;
  /** A warm claim's egress step, left to finish behind the create (see below). */
  let egress: Promise<void> | null = null;
  try {
    let init: Promise<void> | null = null;
    if (inst && inst.pid !== undefined && !processAlive(inst.pid)) {
      // a slot that died in the pool since the last watchdog pass (see WarmSlots.check)
      log.warn({ [F.instanceId]: inst.instanceId }, 'warm slot is gone; booting cold');
      await ctx.slots.discard(inst).catch(() => {});
      inst = null;
    }
    if (inst) {
      // A claim binds identity and applies what the request changes, nothing else: the warm
      // instance already has its network, default-deny rules and an answering guest (the
      // watchdog evicts slots whose guest stops answering). The create waits for the state file
      // only. The guest's env (when the request has one: a fresh guest's is empty) and the egress
      // policy (CIDR rules, gateway registration) go in the background, and every call to the
      // guest waits for both (GuestClient.holdUntil): nothing runs in the sandbox before its
      // policy is in force, and until then the slot's default-deny holds (the gateway refuses an
      // unregistered source). A step that fails ends the sandbox as crashed (claimStepFailed).
      // These were a round trip into the sandbox (15–30 ms under gVisor's ptrace platform on a
      // 2-core VM) and one to the gateway (~3 ms quiet) off every warm create.
      const claimed = inst;
      guest = ctx.slots.takeGuest(claimed) ?? new GuestClient(claimed.guest);
      const g = guest;
      if (Object.keys(req.env).length > 0) {
        init = inSpan('agent.guest.init', {}, () => g.initInBackground(req.env));
        init.catch(() => {}); // handled once the sandbox exists (below), or undone with it
      }
      registered = true;
      egress = ctx.egress.track(
        req.sandboxId,
        inSpan('agent.egress.apply', {}, () =>
          ctx.egress.apply(req.sandboxId, claimed, req.egress, req.credentials, { fresh: true }),
        ),
      );
      egress.catch(() => {}); // as the init's
      g.holdUntil(
        egress,
        (err) =>
          new SpaceError(
            'GUEST_UNAVAILABLE',
            `${EGRESS_NOT_IN_FORCE}: ${(err as Error).message}`,
            undefined,
            {
              cause: err,
            },
          ),
      );
      await ctx.files.write(req, claimed, 'warm');
    }
    if (!inst) {
      const made = await inSpan('agent.instance.make', { 'space.template': req.template }, () =>
        ctx.factory.make(req.template, shape, 'create'),
      );
      inst = made.inst;
      source = made.source;
      const g = new GuestClient(inst.guest);
      guest = g;
      registered = true;
      // both finish before anything is undone (a state file written after the cleanup would stay)
      const steps = await Promise.allSettled([
        inSpan('agent.guest.init', {}, () => g.init(req.env)),
        bindHost(ctx, req, inst, source),
      ]);
      for (const r of steps) if (r.status === 'rejected') throw r.reason;
    }
    const made = inst;
    if (reg.tombstones.has(req.sandboxId)) {
      throw new SpaceError('SANDBOX_NOT_FOUND', `sandbox ${req.sandboxId} was deleted while being created`);
    }
    const sb = localSandbox(req, made, guest!, source);
    reg.running.set(sb.id, sb);
    init?.catch((err: unknown) => claimStepFailed(ctx, sb, "the sandbox's guest did not start", err));
    egress?.catch((err: unknown) => claimStepFailed(ctx, sb, EGRESS_NOT_IN_FORCE, err));
    o.activity?.track(sb.id, { reported: null });
    log.info({ [F.instanceId]: made.instanceId, source }, 'sandbox created');
    return sb;
  } catch (err) {
    await guest?.close();
    if (inst) {
      // a registration that may have landed goes with the instance (its address is reused),
      // after one still in flight, so the unregistration is the gateway's last word
      await egress?.catch(() => {});
      if (registered) await ctx.egress.unregister(req.sandboxId, inst.network.sandboxAddress).catch(() => {});
      await ctx.slots.discard(inst).catch((e) => log.error({ err: e }, 'discard after failed create failed'));
    }
    await rm(ctx.files.dir(req.sandboxId), { recursive: true, force: true });
    throw err;
  }
}

/**
 * The host side of binding a freshly made (not warm) instance to a sandbox: its state file and
 * its egress policy. The policy must be in force before anything runs in the sandbox: its CIDR
 * rules and its gateway registration (DNS/80/443 of an unregistered source are refused). Without
 * this a new sandbox had no egress until a PATCH or the watchdog's next pass, and CIDR rules never
 * applied (found by test/attacks.int.test.ts). A warm claim applies the same policy behind the
 * create, holding guest calls until it is in force (claimOrMake). The state file and the policy
 * do not depend on each other: both at once. A fresh instance's network has no CIDR rules yet, so
 * none are replaced when the policy names none.
 */
async function bindHost(
  ctx: SandboxContext,
  req: CreateSandbox,
  inst: InstanceInfo,
  source: InstanceSource,
): Promise<void> {
  await Promise.all([
    ctx.files.write(req, inst, source),
    inSpan('agent.egress.apply', {}, () =>
      ctx.egress.apply(req.sandboxId, inst, req.egress, req.credentials, { fresh: true }),
    ),
  ]);
}
