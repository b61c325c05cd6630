/**
 * The node's sandboxes: binds sandbox ids to instances (claimed from the warm pool or made by the
 * instance factory), runs their commands, pauses them (frozen in memory, or hibernated into the
 * store) and resumes them, and keeps a small record per sandbox on local disk so a restarted agent
 * re-adopts what is running. One file per verb beside this one (create, delete, pause, hibernate,
 * resume, watchdog, adopt); this class is their one door, over a shared {@link SandboxContext}.
 * Creates, deletes, pauses and resumes are idempotent per sandbox id; a delete leaves a tombstone
 * so a create that arrives late (or is still booting) is refused and its instance destroyed.
 */
import { readdir, rm, stat } from 'node:fs/promises';
import { join } from 'node:path';
import type { EgressPolicy } from '../../core/egress.ts';
import { SpaceError } from '../../core/errors.ts';
import { F } from '../../core/log-fields.ts';
import type { PauseMode } from '../../core/types.ts';
import { type Command, type StartCommand, startCommand } from '../commands/commands.ts';
import { outputsToReclaim } from '../commands/retention.ts';
import type { InstanceInfo, SnapshotRef } from '../drivers/driver.ts';
import { causedByDiskFull } from '../host/durable-file.ts';
import { InstanceFactory, type InstanceShape } from '../instances/factory.ts';
import { prepareSnapshot } from '../instances/snapshots.ts';
import type { StartGate } from '../instances/start-gate.ts';
import { WarmSlots } from '../instances/warm-slots.ts';
import { type Adopted, adopt, destroyAll, detachAll } from './adopt.ts';
import type { SandboxContext } from './context.ts';
import type { CrashReporter } from './crash-report.ts';
import { createSandbox } from './create.ts';
import { deleteSandbox } from './delete.ts';
import { EgressBinding } from './egress-binding.ts';
import { hibernatedView, sweepHibernated } from './hibernate.ts';
import type { HibernatedView } from './hibernated-view.ts';
import { convergePause, pauseSandbox } from './pause.ts';
import { SandboxRegistry } from './registry.ts';
import { resumeSandbox } from './resume.ts';
import { StateFiles } from './state-files.ts';
import type {
  CreateSandbox,
  Hibernation,
  LocalSandbox,
  PauseOutcome,
  ResumeOutcome,
  SandboxManagerOptions,
} from './types.ts';
import { guestFailed, watch } from './watchdog.ts';

export { WARM_SLOT_CHECK_MS } from '../instances/warm-slots.ts';
export type {
  CreateSandbox,
  Hibernation,
  InstanceSource,
  LocalSandbox,
  SandboxManagerOptions,
} from './types.ts';

export class SandboxManager {
  readonly #ctx: SandboxContext;
  /**
   * The warm pool's side of the node (its `boot`, `discard` and `schedule`): the pool takes its
   * slots from the instance factory through it, never through this class.
   */
  readonly warmSlots: WarmSlots;

  constructor(o: SandboxManagerOptions) {
    const reg = new SandboxRegistry();
    const files = new StateFiles(o.stateDir);
    const factory = new InstanceFactory(o);
    this.warmSlots = new WarmSlots({
      factory,
      files,
      log: o.log,
      busy: () => reg.creating.size > 0 || reg.closing,
      closing: () => reg.closing,
    });
    this.#ctx = {
      o,
      reg,
      files,
      factory,
      slots: this.warmSlots,
      egress: new EgressBinding({ networks: o.networks, gateway: o.gateway, log: o.log }),
      onCrash: null,
      delete: (id) => this.delete(id),
    };
  }

  get size(): number {
    return this.#ctx.reg.running.size;
  }

  list(): LocalSandbox[] {
    return this.#ctx.reg.list();
  }

  /** Memory the node's sandboxes reserve (their shapes), MiB; warm slots not included. */
  reservedMiB(): number {
    let mib = 0;
    for (const sb of this.#ctx.reg.running.values()) mib += sb.instance.memoryMiB;
    return mib;
  }

  /** Instance starts running and waiting at the start gate, by kind (metrics). */
  startStats(): ReturnType<StartGate['stats']> {
    return this.#ctx.factory.starts.stats();
  }

  /** The sandbox if this node runs it (paused or not), else undefined. */
  find(id: string): LocalSandbox | undefined {
    return this.#ctx.reg.running.get(id);
  }

  /** The running sandbox or SANDBOX_NOT_FOUND. */
  get(id: string): LocalSandbox {
    return this.#ctx.reg.get(id);
  }

  /** See hibernate.ts `hibernatedView`. */
  hibernated(id: string): Promise<HibernatedView | null> {
    return hibernatedView(this.#ctx, id);
  }

  /** See SandboxRegistry.holdGuest. @throws SpaceError SANDBOX_PAUSED, SANDBOX_NOT_FOUND. */
  holdGuest(id: string): { sb: LocalSandbox; release: () => void } {
    return this.#ctx.reg.holdGuest(id);
  }

  /** Counts one unit of work in sandbox `id` as activity; returns the function that ends it. */
  beginActivity(id: string): () => void {
    return this.#ctx.o.activity?.begin(id) ?? (() => {});
  }

  /**
   * See create.ts; refused first with NODE_DISK_FULL when the state disk is under its floor (a
   * create already running here, a retry of one, is answered as before).
   */
  async create(req: CreateSandbox): Promise<LocalSandbox> {
    const { reg, o } = this.#ctx;
    if (!reg.running.has(req.sandboxId) && !reg.creating.has(req.sandboxId)) await o.admitDisk?.();
    return createSandbox(this.#ctx, req).catch((err: unknown) => {
      // a driver that ran out of disk says DRIVER_FAILED: the client is told what it was
      if (causedByDiskFull(err) && !(err instanceof SpaceError && err.code === 'NODE_DISK_FULL'))
        throw new SpaceError(
          'NODE_DISK_FULL',
          `the node's disk is full: ${(err as Error).message}`,
          undefined,
          {
            cause: err,
          },
        );
      throw err;
    });
  }

  /** See delete.ts. */
  delete(id: string): Promise<void> {
    return deleteSandbox(this.#ctx, id);
  }

  /** See pause.ts (and hibernate.ts). */
  pause(id: string, mode: PauseMode): Promise<PauseOutcome> {
    return pauseSandbox(this.#ctx, id, mode);
  }

  /** See resume.ts; a restore from hibernation is refused first as a create is (see {@link create}). */
  async resume(id: string, restore?: CreateSandbox & { hibernation: Hibernation }): Promise<ResumeOutcome> {
    if (restore && !this.#ctx.reg.running.has(id)) await this.#ctx.o.admitDisk?.();
    return resumeSandbox(this.#ctx, id, restore);
  }

  /** See pause.ts `convergePause`. */
  convergePause(
    id: string,
    want: 'running' | 'frozen',
    stillWanted: () => Promise<boolean>,
  ): Promise<boolean> {
    return convergePause(this.#ctx, id, want, stillWanted);
  }

  /** See hibernate.ts. */
  sweepHibernated(isGone: (id: string) => Promise<boolean>): Promise<string[]> {
    return sweepHibernated(this.#ctx, isGone);
  }

  /** See instances/snapshots.ts. */
  prepareSnapshot(template: string, shape: InstanceShape): Promise<SnapshotRef | null> {
    const o = this.#ctx.o;
    const discard = (inst: InstanceInfo) => this.warmSlots.discard(inst);
    return prepareSnapshot(
      {
        factory: this.#ctx.factory,
        stateDir: o.stateDir,
        templateImage: o.templateImage,
        discard,
        log: o.log,
      },
      template,
      shape,
    );
  }

  /** The template snapshots this node restores from (template → snapshot). */
  snapshots(): ReadonlyMap<string, SnapshotRef> {
    return this.#ctx.factory.snapshots;
  }

  /** Destroys an instance and frees its network. Idempotent. */
  discard(inst: InstanceInfo): Promise<void> {
    return this.warmSlots.discard(inst);
  }

  /** See WarmSlots.check. */
  checkWarmSlots(now = Date.now()): Promise<string[]> {
    return this.warmSlots.check(now);
  }

  /** Replaces a running sandbox's egress policy (credential grants stay as they were). */
  async updateEgress(id: string, egress: EgressPolicy): Promise<void> {
    const { reg, files } = this.#ctx;
    const binding = this.#ctx.egress;
    const sb = reg.get(id);
    await binding.settled(id); // a claim's registration still in flight lands first
    // tracked: a watchdog pass meanwhile leaves the sandbox alone (it would send the old policy)
    await binding.track(id, binding.apply(id, sb.instance, egress, sb.credentials));
    sb.egress = egress;
    const rec = await files.read(id);
    await files.patch(id, { req: { ...rec.req, egress } });
  }

  /**
   * Reclaims command outputs past the retention rules (commands/retention.ts) in every sandbox not
   * being paused, resumed or deleted: each goes from the sandbox's command list and its spool and
   * record leave the disk. Returns how many went. Never throws (a file that cannot be removed now
   * is retried on the next pass).
   */
  async reclaimOutputs(now = Date.now()): Promise<number> {
    let n = 0;
    for (const sb of this.#ctx.reg.list()) n += await this.#reclaim(sb, now, 0);
    return n;
  }

  async #reclaim(sb: LocalSandbox, now: number, room: number): Promise<number> {
    const { o, reg, files } = this.#ctx;
    if (reg.inTransit(sb.id) || sb.paused === 'pausing') return 0;
    const r = o.spoolRetention;
    const kept = [...sb.commands.values()].map((c) => ({
      id: c.id,
      endedAt: c.spool.closed ? (c.spool.endedAt ?? now) : null,
      readToEndAt: c.spool.readToEndAt,
      readers: c.spool.readers,
      bytes: c.spool.size,
    }));
    const ids = outputsToReclaim(kept, { ...r, maxCommands: Math.max(0, r.maxCommands - room) }, now);
    const dir = join(files.dir(sb.id), 'commands');
    for (const cid of ids) {
      const c = sb.commands.get(cid);
      if (!c) continue;
      sb.commands.delete(cid);
      await c.spool.close().catch(() => {});
      await rm(join(dir, `${cid}.out`), { force: true }).catch(() => {});
      await rm(join(dir, `${cid}.json`), { force: true }).catch(() => {});
    }
    if (ids.length) o.log.debug({ [F.sandboxId]: sb.id, reclaimed: ids.length }, 'command outputs reclaimed');
    return ids.length;
  }

  /** Starts a command in a running sandbox (the command of the same id when it exists). */
  async startCommand(id: string, req: StartCommand): Promise<Command> {
    const { o, files } = this.#ctx;
    const { sb, release } = this.holdGuest(id);
    const existing = sb.commands.get(req.commandId);
    if (existing) {
      release();
      return existing;
    }
    // room for this one within the sandbox's bound on kept outputs
    await this.#reclaim(sb, Date.now(), 1).catch(() => 0);
    let cmd: Command;
    try {
      cmd = await startCommand({
        guest: sb.guest,
        sandboxId: id,
        dir: join(files.dir(id), 'commands'),
        req,
        spoolLimitBytes: o.spoolLimitBytes,
        log: o.log.child({ [F.sandboxId]: id }),
      });
    } catch (err) {
      throw await this.guestFailed(id, err);
    } finally {
      release();
    }
    sb.commands.set(cmd.id, cmd);
    try {
      await files.writeCommand(id, cmd);
    } catch (err) {
      // no record, no command: one an agent restart could not find again is ended now
      sb.commands.delete(cmd.id);
      cmd.abort.abort();
      await sb.guest.signal(cmd.pid, 'SIGKILL').catch(() => {});
      await cmd.done;
      await cmd.spool.close().catch(() => {});
      await rm(cmd.spool.path, { force: true }).catch(() => {});
      throw err;
    }
    const ended = o.activity?.begin(id);
    if (ended) void cmd.done.finally(ended);
    return cmd;
  }

  /** The command or COMMAND_NOT_FOUND. */
  command(sandboxId: string, commandId: string): Command {
    const cmd = this.get(sandboxId).commands.get(commandId);
    if (!cmd) throw new SpaceError('COMMAND_NOT_FOUND', `no command ${commandId} in sandbox ${sandboxId}`);
    return cmd;
  }

  /** See adopt.ts. */
  adopt(): Promise<Adopted> {
    return adopt(this.#ctx);
  }

  /** See adopt.ts `detachAll`. */
  detachAll(): Promise<void> {
    return detachAll(this.#ctx);
  }

  /** See adopt.ts `destroyAll`. */
  destroyAll(): Promise<void> {
    return destroyAll(this.#ctx);
  }

  /**
   * Sets where sandboxes that end on their own are reported (id, why), from now on: a claim step
   * that fails before the watchdog's first pass is recorded as crashed, not found missing later
   * as lost. {@link watch} sets it too.
   */
  reportCrashesTo(onCrash: CrashReporter): void {
    this.#ctx.onCrash = onCrash;
  }

  /** See watchdog.ts `watch`. */
  watch(onCrash: CrashReporter): Promise<string[]> {
    return watch(this.#ctx, onCrash);
  }

  /** See watchdog.ts `guestFailed`. */
  guestFailed(id: string, err: unknown): Promise<unknown> {
    return guestFailed(this.#ctx, id, err);
  }

  /** Refuses new creates from now on (shutdown). */
  stopAccepting(): void {
    this.#ctx.reg.closing = true;
  }

  /** Disk bytes used by a sandbox's spools (for metrics). */
  async spoolBytes(id: string): Promise<number> {
    let total = 0;
    const dir = join(this.#ctx.files.dir(id), 'commands');
    for (const n of await readdir(dir).catch(() => [] as string[])) total += (await stat(join(dir, n))).size;
    return total;
  }
}
