/**
 * The node's sandboxes: binds sandbox ids to driver instances (claimed from the warm pool or
 * booted cold), runs their commands, pauses them (frozen in memory, or hibernated: snapshotted
 * into the hibernation store with their command spools, instance destroyed) and resumes them, and
 * keeps a small record per sandbox on local disk so a restarted agent re-adopts what is running.
 * Creates, deletes, pauses and resumes are idempotent per sandbox id; a delete leaves a tombstone
 * so a create that arrives late (or is still booting) is refused and its instance destroyed —
 * nothing is left behind on either order.
 */
import { randomBytes } from 'node:crypto';
import { existsSync, renameSync, writeFileSync } from 'node:fs';
import { cp, mkdir, readdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { join, resolve, sep } from 'node:path';
import { isDeepStrictEqual } from 'node:util';
import type { Logger } from 'pino';
import type { CredentialGrant } from '../core/credentials.ts';
import type { EgressPolicy } from '../core/egress.ts';
import { SpaceError } from '../core/errors.ts';
import { newId } from '../core/ids.ts';
import { F } from '../core/log-fields.ts';
import { inSpan, untraced } from '../core/tracing.ts';
import type { EndReport, PauseMode } from '../core/types.ts';
import type { ActivityMeter } from './activity.ts';
import {
  type Command,
  type CommandConfig,
  DETACH,
  resumePump,
  type StartCommand,
  startCommand,
} from './commands.ts';
import { type CrashReporter, crashReport } from './crash-report.ts';
import type { Driver, InstanceInfo, SandboxNetwork, SnapshotRef, TemplateImage } from './drivers/driver.ts';
import type { GatewayClient } from './gateway-client.ts';
import { GuestClient } from './guest-client.ts';
import { type HibernatedView, readHibernatedView } from './hibernated-view.ts';
import type { SandboxNetworks } from './network.ts';
import { processAlive } from './process-alive.ts';
import { refillDelay } from './refill-pacing.ts';
import { Spool } from './spool.ts';
import { StartGate, type StartKind } from './start-gate.ts';
import type { WarmPool } from './warm-pool.ts';

/** What the API sends to create a sandbox. */
export interface CreateSandbox {
  sandboxId: string;
  sessionId: string;
  template: string;
  vcpus: number;
  memoryMiB: number;
  env: Record<string, string>;
  expiresAtMs: number;
  egress: EgressPolicy;
  credentials: CredentialGrant[];
}

/** How a sandbox's instance came to be: a warm-pool claim, a snapshot restore, or a cold boot. */
export type InstanceSource = 'warm' | 'snapshot' | 'boot';

/** On-disk record of a sandbox on this node (`<stateDir>/sandboxes/<id>/sandbox.json`). */
interface SandboxFile {
  req: CreateSandbox;
  instance: InstanceInfo;
  /** Absent in records written before snapshots existed (then `fromWarmPool` says). */
  source?: InstanceSource;
  fromWarmPool: boolean;
  createdAt: number;
  /** Set while the instance is frozen by a pause. */
  paused?: 'frozen';
}

/** `hibernated.json` in a hibernated sandbox's folder of the store. */
interface HibernatedFile {
  sandboxId: string;
  template: string;
  snapshot: SnapshotRef;
  source: InstanceSource;
  /** Epoch ms (this node's clock; informational). */
  hibernatedAt: number;
  /** The session its tokens carry (absent in files of agents before it was kept). */
  sessionId?: string;
}

/** Where a hibernated sandbox is: its store's name and its folder there. */
export interface Hibernation {
  store: string;
  path: string;
}

/** A sandbox this node runs. */
export interface LocalSandbox {
  id: string;
  sessionId: string;
  template: string;
  instance: InstanceInfo;
  guest: GuestClient;
  source: InstanceSource;
  commands: Map<string, Command>;
  /** Open data-plane streams (bounded by config). */
  streams: number;
  /**
   * Aborts of open guest streams that are not commands (directory watches): cut before the guest
   * connection closes, which would otherwise wait for them to end on their own.
   */
  guestStreams: Set<AbortController>;
  /**
   * `frozen` while a pause holds its instance in memory, `pausing` while a pause waits for the
   * guest calls in flight to finish (new ones are refused); null when it runs.
   */
  paused: 'frozen' | 'pausing' | null;
  /** Guest calls in flight (data-plane requests that need the guest, command starts). */
  guestCalls: number;
  /** Set once the sandbox was found dead on its own: why (its end message). */
  crashed?: string;
  egress: EgressPolicy;
  credentials: CredentialGrant[];
}

/** A running sandbox of request `req` on instance `inst`, with nothing open yet. Pure. */
function localSandbox(
  req: Pick<CreateSandbox, 'sandboxId' | 'sessionId' | 'template' | 'egress' | 'credentials'>,
  inst: InstanceInfo,
  guest: GuestClient,
  source: InstanceSource,
): LocalSandbox {
  return {
    id: req.sandboxId,
    sessionId: req.sessionId,
    template: req.template,
    instance: inst,
    guest,
    source,
    commands: new Map(),
    streams: 0,
    guestStreams: new Set(),
    guestCalls: 0,
    paused: null,
    egress: req.egress,
    credentials: req.credentials,
  };
}

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

/** Why a warm claim's sandbox cannot run anything (its calls' error, its crash message). */
const EGRESS_NOT_IN_FORCE = "the sandbox's egress policy could not be put in force";

/** Tombstones older than this are forgotten (ms): far longer than any create can take. */
const TOMBSTONE_TTL_MS = 24 * 3600 * 1000;

/**
 * Each ready warm slot's guest is asked whether it answers at most this often (ms), by the
 * watchdog, one slot at a time, and not while a create is in flight. Asking every slot on every
 * pass (5 s) cost a node with 32 slots ~0.4 s of CPU in a burst each pass — a request into a
 * gVisor sandbox is ~12 ms of CPU under the ptrace platform — and the creates that met the burst
 * waited: sequential warm creates took a median 18–24 ms on a 32-slot pool against 10–13 ms with
 * those checks off (`npm run bench -- latency --phases warm --concurrency 1`, 2-core VM). A slot
 * whose instance died is still caught at once by the claim (its process is gone); only a guest
 * that stopped answering inside a live instance may now wait up to this long to be replaced, and
 * the create that claims it first fails its guest calls and ends as crashed. Below the guest's
 * keep-alive (65 s), so the slot's connection stays open for its claim.
 */
export const WARM_SLOT_CHECK_MS = 30_000;

export interface SandboxManagerOptions {
  stateDir: string;
  driver: Driver;
  networks: SandboxNetworks;
  /** The image the driver boots for a template; throws TEMPLATE_NOT_FOUND / TEMPLATE_NOT_READY. */
  templateImage: (template: string) => Promise<TemplateImage>;
  pidsLimit: number;
  /** Writable disk per sandbox, MiB. */
  diskMiB: number;
  /** Instances started (booted or restored) at once (SPACE_CREATE_CONCURRENCY). */
  createConcurrency: number;
  /** Of those, warm-pool refills at once (SPACE_WARM_REFILL_CONCURRENCY, ≤ createConcurrency). */
  refillConcurrency: number;
  spoolLimitBytes: number;
  /** The node's egress gateway; null: sandboxes get no egress at all. */
  gateway: GatewayClient | null;
  /** Environment every command gets (e.g. NODE_EXTRA_CA_CERTS), under the sandbox's own. */
  baseEnv: Record<string, string>;
  /** Folder of the hibernation store: one folder per hibernated sandbox. */
  hibernateDir: string;
  /** Name of the store: nodes with the same name read the same folder (shared storage). */
  hibernateStore: string;
  /** Activity metering (null: not metered, e.g. in unit tests). */
  activity: ActivityMeter | null;
  log: Logger;
}

export class SandboxManager {
  readonly #o: SandboxManagerOptions;
  readonly #sandboxes = new Map<string, LocalSandbox>();
  readonly #creating = new Map<string, Promise<LocalSandbox>>();
  readonly #tombstones = new Map<string, number>();
  /** Deletes in progress: a second delete of the same sandbox (API retry, reconciliation) joins it. */
  readonly #deleting = new Map<string, Promise<void>>();
  /**
   * Registrations with the gateway in flight (a warm claim's, a policy change's, the watchdog's),
   * by sandbox id.
   */
  readonly #registering = new Map<string, Promise<void>>();
  /**
   * What the gateway last confirmed it holds for each sandbox, by sandbox id: the id of the
   * gateway's registry that answered (a restarted gateway has a new one and holds nothing) and the
   * policy and grants sent. Absent while unknown: never registered, a try in flight or failed, or
   * a gateway older than `registryId`. The watchdog registers again only sandboxes not held so.
   */
  readonly #atGateway = new Map<
    string,
    { registryId: string; policy: EgressPolicy; credentials: CredentialGrant[] }
  >();
  /** Pending warm pool top-up ({@link #refillSoon}) and when it was first asked for (ms since the epoch). */
  #refillTimer: NodeJS.Timeout | null = null;
  #refillAskedAt = 0;
  /** When a create last came or ended (ms since the epoch): refills wait for quiet after it. */
  #lastCreateAt = 0;
  readonly #snapshots = new Map<string, SnapshotRef>();
  /**
   * Guest clients of warm slots by instance id, connected when the slot was made and pinged by
   * the watchdog every {@link WARM_SLOT_CHECK_MS}, so a claim's first guest call reuses an open
   * connection; with when each last answered (ms since the epoch).
   */
  readonly #warmGuests = new Map<string, { guest: GuestClient; checkedAt: number }>();
  /** Pause/resume in flight per sandbox (one at a time). */
  readonly #lifecycle = new Map<string, Promise<unknown>>();
  /** Instance starts: creates go first, refills yield (start-gate.ts). */
  readonly #starts: StartGate;
  #warm: WarmPool | null = null;
  #closing = false;
  /** The crash reporter of the last watchdog pass, for crashes found between passes. */
  #onCrash: CrashReporter | null = null;

  constructor(o: SandboxManagerOptions) {
    this.#o = o;
    this.#starts = new StartGate(o.createConcurrency, Math.min(o.refillConcurrency, o.createConcurrency));
  }

  /** Attaches the warm pool (made after the manager, since it boots through it). */
  setWarmPool(pool: WarmPool): void {
    this.#warm = pool;
  }

  /** Tops the warm pool up at the next quiet moment between creates (the pool's `schedule`). */
  refillWhenQuiet(): void {
    this.#refillSoon();
  }

  #dir(id: string): string {
    return join(this.#o.stateDir, 'sandboxes', id);
  }

  get size(): number {
    return this.#sandboxes.size;
  }

  list(): LocalSandbox[] {
    return [...this.#sandboxes.values()];
  }

  /** Memory the node's sandboxes reserve (their shapes), MiB; warm slots not included. */
  reservedMiB(): number {
    let mib = 0;
    for (const sb of this.#sandboxes.values()) mib += sb.instance.memoryMiB;
    return mib;
  }

  /** Instance starts running and waiting at the start gate, by kind (metrics). */
  startStats(): ReturnType<StartGate['stats']> {
    return this.#starts.stats();
  }

  /** The sandbox if this node runs it (paused or not), else undefined. */
  find(id: string): LocalSandbox | undefined {
    return this.#sandboxes.get(id);
  }

  /**
   * The sandbox `id` as hibernated into this node's store, when it is there and this node does not
   * run it; null otherwise. Reads `hibernated.json` and the command records beside it (R27: its
   * spooled output stays readable on the agent's own URL while it is paused).
   */
  async hibernated(id: string): Promise<HibernatedView | null> {
    if (this.#sandboxes.has(id) || !/^[A-Za-z0-9_-]+$/.test(id)) return null;
    return readHibernatedView(id, this.#hibernationPath(id));
  }

  /** The running sandbox or SANDBOX_NOT_FOUND. */
  get(id: string): LocalSandbox {
    const sb = this.#sandboxes.get(id);
    if (!sb) throw new SpaceError('SANDBOX_NOT_FOUND', `no sandbox ${id} on this node`, { sandboxId: id });
    return sb;
  }

  /**
   * Holds the sandbox's guest for one call: a pause waits (bounded) until every hold is released
   * before it freezes the guest, so no call hangs on a frozen guest. Returns the sandbox and the
   * release function (idempotent).
   * @throws SpaceError SANDBOX_PAUSED while a pause holds or is taking it, SANDBOX_NOT_FOUND.
   */
  holdGuest(id: string): { sb: LocalSandbox; release: () => void } {
    const sb = this.get(id);
    if (sb.paused) {
      throw new SpaceError('SANDBOX_PAUSED', `sandbox ${id} is paused; resume it first`, { sandboxId: id });
    }
    sb.guestCalls += 1;
    let held = true;
    return {
      sb,
      release: () => {
        if (!held) return;
        held = false;
        sb.guestCalls -= 1;
      },
    };
  }

  /**
   * Refuses new guest calls and waits until those in flight end, for at most `timeoutMs`.
   * @throws SpaceError SANDBOX_BUSY when they do not (the sandbox runs on as before).
   */
  async #quiesce(sb: LocalSandbox, timeoutMs = 10_000): Promise<void> {
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

  /** Counts one unit of work in sandbox `id` as activity; returns the function that ends it. */
  beginActivity(id: string): () => void {
    return this.#o.activity?.begin(id) ?? (() => {});
  }

  /** Runs `fn` after any pause/resume of `id` in flight (one at a time per sandbox). */
  async #serial<T>(id: string, fn: () => Promise<T>): Promise<T> {
    const prior = this.#lifecycle.get(id) ?? Promise.resolve();
    const p = prior.catch(() => {}).then(fn);
    this.#lifecycle.set(id, p);
    try {
      return await p;
    } finally {
      if (this.#lifecycle.get(id) === p) this.#lifecycle.delete(id);
    }
  }

  #hibernationPath(id: string): string {
    return join(this.#o.hibernateDir, id);
  }

  /**
   * Pauses a sandbox. `frozen`: the driver freezes its instance (memory kept, streams and spools
   * stay attached). `hibernated`: its command pumps are detached, the instance is frozen and
   * snapshotted into the hibernation store together with its spools, then destroyed and the
   * sandbox forgotten here (any node reading the store can {@link resume} it). Idempotent: a
   * sandbox already paused that way answers as such; a frozen one can still be hibernated.
   * @throws SpaceError SANDBOX_NOT_FOUND; SNAPSHOT_UNSUPPORTED / DRIVER_FAILED from the driver (the
   *   sandbox then runs on as before).
   */
  async pause(id: string, mode: PauseMode): Promise<{ mode: PauseMode; hibernation?: Hibernation }> {
    return this.#serial(id, async () => {
      const path = this.#hibernationPath(id);
      if (!this.#sandboxes.has(id) && existsSync(join(path, 'hibernated.json'))) {
        return { mode: 'hibernated' as const, hibernation: { store: this.#o.hibernateStore, path } };
      }
      const sb = this.get(id);
      if (mode === 'frozen') {
        if (!sb.paused) {
          await this.#quiesce(sb);
          try {
            await this.#o.driver.pause(sb.instance.instanceId);
          } catch (err) {
            sb.paused = null;
            throw err;
          }
          sb.paused = 'frozen';
          this.#o.activity?.paused(id);
          await this.#patchFile(id, { paused: 'frozen' });
        }
        return { mode: 'frozen' as const };
      }
      return { mode: 'hibernated' as const, hibernation: await this.#hibernate(sb) };
    });
  }

  async #hibernate(sb: LocalSandbox): Promise<Hibernation> {
    const log = this.#o.log.child({ [F.sandboxId]: sb.id });
    const path = this.#hibernationPath(sb.id);
    const started = Date.now();
    const wasFrozen = sb.paused === 'frozen';
    /** Milliseconds per step, logged with the result (where a slow hibernation spends its time). */
    const steps: Record<string, number> = {};
    let mark = Date.now();
    const step = (name: string) => {
      steps[name] = Date.now() - mark;
      mark = Date.now();
    };
    if (!wasFrozen) await this.#quiesce(sb);
    step('quiesceMs');
    // detach first, while the guest still runs, so it sees the connections close; the spools stay
    // on disk and the guest keeps the output written meanwhile for the resumed pumps
    await this.#detach(sb);
    step('detachMs');
    try {
      if (!wasFrozen) await this.#o.driver.pause(sb.instance.instanceId);
      step('freezeMs');
      await rm(path, { recursive: true, force: true });
      await mkdir(path, { recursive: true, mode: 0o700 });
      const snapshot = await this.#o.driver.snapshot(sb.instance.instanceId, join(path, 'snapshot'));
      step('snapshotMs');
      await cp(join(this.#dir(sb.id), 'commands'), join(path, 'commands'), { recursive: true });
      const file: HibernatedFile = {
        sandboxId: sb.id,
        template: sb.template,
        snapshot,
        source: sb.source,
        hibernatedAt: Date.now(),
        sessionId: sb.sessionId,
      };
      await writeFile(join(path, 'hibernated.json'), JSON.stringify(file), { mode: 0o600 });
    } catch (err) {
      // the sandbox runs on as it was: nothing of the attempt is left
      await rm(path, { recursive: true, force: true });
      if (!wasFrozen) {
        await this.#o.driver.resume(sb.instance.instanceId).catch(() => {});
        sb.paused = null;
      }
      sb.guest = new GuestClient(sb.instance.guest);
      await this.#adoptCommands(sb);
      throw err;
    }
    this.#sandboxes.delete(sb.id);
    this.#o.activity?.untrack(sb.id);
    await this.#unregister(sb.id, sb.instance.network.sandboxAddress).catch(() => {});
    step('spoolsMs');
    await this.discard(sb.instance).catch((err: unknown) =>
      log.warn({ err }, 'destroying the hibernated instance failed'),
    );
    await rm(this.#dir(sb.id), { recursive: true, force: true });
    step('destroyMs');
    log.info({ path, [F.durationMs]: Date.now() - started, ...steps }, 'sandbox hibernated');
    return { store: this.#o.hibernateStore, path };
  }

  /**
   * Removes hibernated sandboxes from the store whose record `isGone` (deleted while no node that
   * reads the store was up). Returns the ids removed.
   */
  async sweepHibernated(isGone: (id: string) => Promise<boolean>): Promise<string[]> {
    const removed: string[] = [];
    for (const id of await readdir(this.#o.hibernateDir).catch(() => [] as string[])) {
      if (this.#sandboxes.has(id) || !(await isGone(id))) continue;
      await rm(this.#hibernationPath(id), { recursive: true, force: true });
      removed.push(id);
    }
    return removed;
  }

  /** Stops a sandbox's command pumps (spools stay resumable) and closes its guest connection. */
  async #detach(sb: LocalSandbox): Promise<void> {
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

  /** Rewrites fields of a sandbox's `sandbox.json`. */
  async #patchFile(id: string, patch: Partial<SandboxFile>): Promise<void> {
    const file = join(this.#dir(id), 'sandbox.json');
    const rec = JSON.parse(await readFile(file, 'utf8')) as SandboxFile;
    await writeFile(file, JSON.stringify({ ...rec, ...patch }), { mode: 0o600 });
  }

  /**
   * Resumes a sandbox. Without `restore`: thaws the frozen instance this node holds. With it:
   * restores the hibernated sandbox from `restore.hibernation` (which must be in this node's store)
   * as a new instance with a new network and guest secret, re-applies its egress, moves its spools
   * back and resumes its command pumps at the spooled offsets. Idempotent: a running sandbox
   * answers at once.
   * @throws SpaceError SANDBOX_NOT_FOUND (nothing to thaw or restore), BAD_REQUEST (a path outside
   *   the store), DRIVER_FAILED (the restore failed: the snapshot stays for a retry).
   */
  async resume(
    id: string,
    restore?: CreateSandbox & { hibernation: Hibernation },
  ): Promise<{ instanceId: string; how: 'thawed' | 'restored' }> {
    if (this.#closing) throw new SpaceError('NODE_UNAVAILABLE', 'the node agent is shutting down');
    return this.#serial(id, async () => {
      const existing = this.#sandboxes.get(id);
      if (existing) {
        if (existing.paused === 'frozen') {
          await this.#o.driver.resume(existing.instance.instanceId);
          existing.paused = null;
          await this.#patchFile(id, { paused: undefined });
          this.#o.activity?.resumed(id);
          return { instanceId: existing.instance.instanceId, how: 'thawed' as const };
        }
        return {
          instanceId: existing.instance.instanceId,
          how: restore ? ('restored' as const) : ('thawed' as const),
        };
      }
      if (!restore) {
        throw new SpaceError('SANDBOX_NOT_FOUND', `sandbox ${id} is not on this node`, { sandboxId: id });
      }
      if (this.#tombstones.has(id)) {
        throw new SpaceError('SANDBOX_NOT_FOUND', `sandbox ${id} was deleted`, { sandboxId: id });
      }
      const sb = await this.#restoreHibernated(restore);
      return { instanceId: sb.instance.instanceId, how: 'restored' as const };
    });
  }

  async #restoreHibernated(req: CreateSandbox & { hibernation: Hibernation }): Promise<LocalSandbox> {
    const log = this.#o.log.child({ [F.sandboxId]: req.sandboxId });
    const root = resolve(this.#o.hibernateDir);
    const path = resolve(req.hibernation.path);
    if (req.hibernation.store !== this.#o.hibernateStore || !path.startsWith(root + sep)) {
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
    const inst = await this.#starts.run('create', () =>
      this.#one(req.template, (spec) => this.#restore(file.snapshot, spec)),
    );
    try {
      const dir = this.#dir(req.sandboxId);
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
      await writeFile(join(dir, 'sandbox.json'), JSON.stringify(rec), { mode: 0o600 });
      const sb = localSandbox(req, inst, new GuestClient(inst.guest), file.source);
      await this.#applyEgress(sb.id, inst, sb.egress, sb.credentials);
      this.#o.activity?.track(sb.id, { reported: 'paused' });
      await this.#adoptCommands(sb);
      this.#sandboxes.set(sb.id, sb);
      this.#o.activity?.resumed(sb.id);
    } catch (err) {
      this.#o.activity?.untrack(req.sandboxId);
      await this.#unregister(req.sandboxId, inst.network.sandboxAddress).catch(() => {});
      await this.discard(inst).catch(() => {});
      await rm(this.#dir(req.sandboxId), { recursive: true, force: true });
      throw err;
    }
    await rm(path, { recursive: true, force: true });
    log.info(
      { [F.instanceId]: inst.instanceId, [F.durationMs]: Date.now() - started },
      'sandbox restored from hibernation',
    );
    return this.get(req.sandboxId);
  }

  /**
   * Makes one instance (network + driver): restored from the template's snapshot when there is one
   * of this shape, booted otherwise. Undoes the network if the driver fails.
   */
  async boot(template: string, shape: { vcpus: number; memoryMiB: number }): Promise<InstanceInfo> {
    const { inst } = await this.#make(template, shape, 'refill');
    // the slot's guest connection and state directory are made now, not by the claim (see
    // #warmGuests, #slotDir); a slot without its directory is still claimed (its claim makes one)
    const guest = new GuestClient(inst.guest);
    const slotDir = this.#slotDir(inst);
    await Promise.all([
      guest.health().catch(() => {}),
      // and the folder a claim renames it into
      Promise.all([
        mkdir(join(slotDir, 'commands'), { recursive: true }),
        mkdir(join(this.#o.stateDir, 'sandboxes'), { recursive: true }),
      ])
        .then(() => writeFile(join(slotDir, 'sandbox.json'), '', { mode: 0o600 }))
        .catch((err: unknown) => this.#o.log.warn({ err }, 'could not make a warm slot its state directory')),
    ]);
    this.#warmGuests.set(inst.instanceId, { guest, checkedAt: Date.now() });
    return inst;
  }

  async #make(
    template: string,
    shape: { vcpus: number; memoryMiB: number },
    kind: StartKind,
  ): Promise<{ inst: InstanceInfo; source: 'snapshot' | 'boot' }> {
    const image = await this.#o.templateImage(template);
    const snap = this.#snapshots.get(template);
    const restoreFrom =
      snap !== undefined &&
      snap.imageDigest === image.digest &&
      snap.vcpus === shape.vcpus &&
      snap.memoryMiB === shape.memoryMiB &&
      snap.diskMiB === this.#o.diskMiB
        ? snap
        : null;
    return this.#starts.run(kind, async () => {
      if (restoreFrom) {
        try {
          return {
            inst: await this.#one(template, (spec) => this.#restore(restoreFrom, spec)),
            source: 'snapshot',
          };
        } catch (err) {
          // a restore that fails costs time, never the create: boot instead (fresh id and network)
          this.#o.log.warn(
            { err, [F.templateId]: template, snapshot: restoreFrom.path },
            'snapshot restore failed; booting instead',
          );
        }
      }
      const inst = await this.#one(template, (spec) =>
        this.#o.driver.create({
          ...spec,
          image,
          vcpus: shape.vcpus,
          memoryMiB: shape.memoryMiB,
          diskMiB: this.#o.diskMiB,
        }),
      );
      return { inst, source: 'boot' as const };
    });
  }

  /**
   * One instance with a new id, secret and network (a tap for VM drivers), made by `make`; the
   * network is released when `make` fails.
   */
  async #one(
    template: string,
    make: (spec: {
      instanceId: string;
      template: string;
      pidsLimit: number;
      guestToken: string;
      network: SandboxNetwork;
    }) => Promise<InstanceInfo>,
  ): Promise<InstanceInfo> {
    const instanceId = newId('i', 12);
    const network = await inSpan('agent.network.allocate', {}, () => this.#o.networks.allocate(instanceId));
    try {
      if (this.#o.driver.capabilities.network === 'tap') {
        network.tap = await this.#o.networks.attachTap(network);
      }
      return await inSpan('agent.driver.start', { 'space.driver': this.#o.driver.name }, () =>
        make({
          instanceId,
          template,
          pidsLimit: this.#o.pidsLimit,
          guestToken: randomBytes(32).toString('hex'),
          network,
        }),
      );
    } catch (err) {
      await this.#o.networks.release(network).catch(() => {});
      throw err;
    }
  }

  /** Restores `snap` as a new instance and rotates its guest to the new instance's own secret. */
  async #restore(
    snap: SnapshotRef,
    spec: {
      instanceId: string;
      template: string;
      pidsLimit: number;
      guestToken: string;
      network: SandboxNetwork;
    },
  ): Promise<InstanceInfo> {
    const image = await this.#o.templateImage(spec.template);
    const inst = await this.#o.driver.restore(snap, { ...spec, image });
    await this.#rekey(inst, snap.guestToken, spec.guestToken);
    return inst;
  }

  /**
   * A restored guest still holds the snapshot's secret: replace it with this instance's own.
   * Destroys the instance when that fails.
   */
  async #rekey(inst: InstanceInfo, snapshotToken: string, token: string): Promise<void> {
    const old = new GuestClient({ ...inst.guest, token: snapshotToken });
    try {
      await old.rotateToken(token);
    } catch (err) {
      await this.#o.driver.destroy(inst.instanceId).catch(() => {});
      throw err;
    } finally {
      await old.close();
    }
  }

  /**
   * Makes the template's snapshot on this node when the driver can snapshot and restore: boots one
   * instance of `shape`, snapshots it once its guest answers, and throws the instance away. Later
   * cold creates of that shape restore from it instead of booting. Reuses a snapshot left on disk by
   * an earlier agent when it was taken from the same image and driver settings (`snapshotKey`). Returns null when the driver cannot.
   * @throws SpaceError DRIVER_FAILED / SNAPSHOT_UNSUPPORTED when making it fails (nothing is left).
   */
  async prepareSnapshot(
    template: string,
    shape: { vcpus: number; memoryMiB: number },
  ): Promise<SnapshotRef | null> {
    const caps = this.#o.driver.capabilities;
    if (!caps.snapshot || !caps.restore) return null;
    const image = await this.#o.templateImage(template);
    const dir = join(
      this.#o.stateDir,
      'snapshots',
      template,
      this.#o.driver.snapshotKey ? `${image.digest}-${this.#o.driver.snapshotKey}` : image.digest,
      `${shape.vcpus}x${shape.memoryMiB}x${this.#o.diskMiB}`,
    );
    const saved = await readFile(join(dir, 'snapshot.json'), 'utf8').catch(() => null);
    if (saved) {
      const ref = JSON.parse(saved) as SnapshotRef;
      if (ref.driver === this.#o.driver.name) {
        this.#snapshots.set(template, ref);
        return ref;
      }
    }
    await rm(dir, { recursive: true, force: true });
    this.#snapshots.delete(template);
    const { inst } = await this.#make(template, shape, 'create');
    try {
      const ref = await this.#o.driver.snapshot(inst.instanceId, dir);
      this.#snapshots.set(template, ref);
      this.#o.log.info({ [F.templateId]: template, path: dir }, 'template snapshot made');
      return ref;
    } catch (err) {
      await rm(dir, { recursive: true, force: true });
      throw err;
    } finally {
      await this.discard(inst).catch((e: unknown) =>
        this.#o.log.warn({ err: e }, 'discarding the snapshot source instance failed'),
      );
    }
  }

  /** The template snapshots this node restores from (template → snapshot). */
  snapshots(): ReadonlyMap<string, SnapshotRef> {
    return this.#snapshots;
  }

  /** Destroys an instance and frees its network. Idempotent. */
  async discard(inst: InstanceInfo): Promise<void> {
    await this.#takeWarmGuest(inst)?.close();
    await this.#o.driver.destroy(inst.instanceId);
    await this.#o.networks.release(inst.network);
    await rm(this.#slotDir(inst), { recursive: true, force: true });
  }

  /** Creates (or returns) the sandbox. Throws SANDBOX_NOT_FOUND if it was deleted meanwhile. */
  async create(req: CreateSandbox): Promise<LocalSandbox> {
    if (this.#closing) throw new SpaceError('NODE_UNAVAILABLE', 'the node agent is shutting down');
    if (this.#tombstones.has(req.sandboxId)) {
      throw new SpaceError('SANDBOX_NOT_FOUND', `sandbox ${req.sandboxId} was deleted`, {
        sandboxId: req.sandboxId,
      });
    }
    const existing = this.#sandboxes.get(req.sandboxId);
    if (existing) return existing;
    let p = this.#creating.get(req.sandboxId);
    if (!p) {
      this.#lastCreateAt = Date.now();
      if (this.#refillTimer) this.#refillSoon(); // a create came: not quiet yet
      p = this.#create(req).finally(() => this.#creating.delete(req.sandboxId));
      this.#creating.set(req.sandboxId, p);
    }
    return p;
  }

  async #create(req: CreateSandbox): Promise<LocalSandbox> {
    try {
      return await this.#claimOrMake(req);
    } finally {
      // The pool is topped up once the creates are done, never while they run: a refill's
      // synchronous start (the start gate, the driver's first spawns) ran inside the claim's reply
      // and cost it ~8 ms of a ~14 ms warm claim, and inside a burst it held up the claims after it
      // (refillDelay). The refill is not part of this create's trace either.
      this.#lastCreateAt = Date.now();
      this.#refillSoon();
    }
  }

  /**
   * Tops the warm pool up once no create has come or ended for a quiet time, or a bound after the
   * first call that asked, whichever is first (each create pushes the quiet moment out, never past
   * that bound; {@link refillDelay}). With no create lately, at once.
   */
  #refillSoon(): void {
    const warm = this.#warm;
    if (!warm) return;
    const now = Date.now();
    if (this.#refillTimer) clearTimeout(this.#refillTimer);
    else this.#refillAskedAt = now;
    this.#refillTimer = setTimeout(
      () => {
        this.#refillTimer = null;
        if (!this.#closing) untraced(() => warm.refill());
      },
      refillDelay({
        askedAtMs: this.#refillAskedAt,
        lastCreateMs: this.#lastCreateAt,
        nowMs: now,
      }),
    );
    this.#refillTimer.unref();
  }

  async #claimOrMake(req: CreateSandbox): Promise<LocalSandbox> {
    const log = this.#o.log.child({ [F.sandboxId]: req.sandboxId });
    const shape = { vcpus: req.vcpus, memoryMiB: req.memoryMiB };
    let inst: InstanceInfo | null = this.#warm?.claim(req.template, shape) ?? null;
    let source: InstanceSource = 'warm';
    let guest: GuestClient | null = null;
    let registered = false;
    const bind = (made: InstanceInfo, from: InstanceSource): Promise<void> => {
      registered = true;
      return this.#bindHost(req, made, from);
    };
    /** A warm claim's egress step, left to finish behind the create (see below). */
    let egress: Promise<void> | null = null;
    try {
      let init: Promise<void> | null = null;
      if (inst && inst.pid !== undefined && !processAlive(inst.pid)) {
        // a slot that died in the pool since the last watchdog pass (see checkWarmSlots)
        log.warn({ [F.instanceId]: inst.instanceId }, 'warm slot is gone; booting cold');
        await this.discard(inst).catch(() => {});
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
        // unregistered source). A step that fails ends the sandbox as crashed (#claimStepFailed).
        // These were a round trip into the sandbox (15–30 ms under gVisor's ptrace platform on a
        // 2-core VM) and one to the gateway (~3 ms quiet) off every warm create.
        const claimed = inst;
        guest = this.#takeWarmGuest(claimed) ?? new GuestClient(claimed.guest);
        const g = guest;
        if (Object.keys(req.env).length > 0) {
          init = inSpan('agent.guest.init', {}, () => g.initInBackground(req.env));
          init.catch(() => {}); // handled once the sandbox exists (below), or undone with it
        }
        registered = true;
        egress = this.#trackRegistration(
          req.sandboxId,
          inSpan('agent.egress.apply', {}, () =>
            this.#applyEgress(req.sandboxId, claimed, req.egress, req.credentials, { fresh: true }),
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
        await this.#writeState(req, claimed, 'warm');
      }
      if (!inst) {
        const made = await inSpan('agent.instance.make', { 'space.template': req.template }, () =>
          this.#make(req.template, shape, 'create'),
        );
        inst = made.inst;
        source = made.source;
        guest = new GuestClient(inst.guest);
        const booted = inst;
        // both finish before anything is undone (a state file written after the cleanup would stay)
        const steps = await Promise.allSettled([
          inSpan('agent.guest.init', {}, () => guest!.init(req.env)),
          bind(booted, source),
        ]);
        for (const r of steps) if (r.status === 'rejected') throw r.reason;
      }
      const made = inst;
      if (this.#tombstones.has(req.sandboxId)) {
        throw new SpaceError('SANDBOX_NOT_FOUND', `sandbox ${req.sandboxId} was deleted while being created`);
      }
      const sb = localSandbox(req, made, guest!, source);
      this.#sandboxes.set(sb.id, sb);
      init?.catch((err: unknown) => this.#claimStepFailed(sb, "the sandbox's guest did not start", err));
      egress?.catch((err: unknown) => this.#claimStepFailed(sb, EGRESS_NOT_IN_FORCE, err));
      this.#o.activity?.track(sb.id, { reported: null });
      log.info({ [F.instanceId]: made.instanceId, source }, 'sandbox created');
      return sb;
    } catch (err) {
      await guest?.close();
      if (inst) {
        // a registration that may have landed goes with the instance (its address is reused),
        // after one still in flight, so the unregistration is the gateway's last word
        await egress?.catch(() => {});
        if (registered) await this.#unregister(req.sandboxId, inst.network.sandboxAddress).catch(() => {});
        await this.discard(inst).catch((e) => log.error({ err: e }, 'discard after failed create failed'));
      }
      await rm(this.#dir(req.sandboxId), { recursive: true, force: true });
      throw err;
    }
  }

  /**
   * The host side of binding a freshly made (not warm) instance to a sandbox: its state file and
   * its egress policy. The policy must be in force before anything runs in the sandbox: its CIDR
   * rules and its gateway registration (DNS/80/443 of an unregistered source are refused). Without
   * this a new sandbox had no egress until a PATCH or the watchdog's next pass, and CIDR rules never
   * applied (found by test/attacks.int.test.ts). A warm claim applies the same policy behind the
   * create, holding guest calls until it is in force (#claimOrMake). The state file and the policy
   * do not depend on each other: both at once. A fresh instance's network has no CIDR rules yet, so
   * none are replaced when the policy names none.
   */
  async #bindHost(req: CreateSandbox, inst: InstanceInfo, source: InstanceSource): Promise<void> {
    await Promise.all([
      this.#writeState(req, inst, source),
      inSpan('agent.egress.apply', {}, () =>
        this.#applyEgress(req.sandboxId, inst, req.egress, req.credentials, { fresh: true }),
      ),
    ]);
  }

  /** Writes the sandbox's state file (what an agent restart adopts it from; env left out). */
  async #writeState(req: CreateSandbox, inst: InstanceInfo, source: InstanceSource): Promise<void> {
    const dir = this.#dir(req.sandboxId);
    const file: SandboxFile = {
      req: { ...req, env: {} },
      instance: inst,
      source,
      fromWarmPool: source === 'warm',
      createdAt: Date.now(),
    };
    const text = JSON.stringify(file);
    if (source === 'warm') {
      // The slot's directory, made when it was booted, becomes the sandbox's (see #slotDir).
      // Synchronously: this rename and this write are the only waits of a warm claim, and through
      // the thread pool they were four hand-offs (rename, open, write, close). Inline, they block
      // the loop for well under a millisecond for a usual request: a local directory and a small
      // file (the request without its env), and about 1 MiB at most (the agent's body limit
      // bounds the request). The claim's span fell from a median 3.6 to 1.4 ms (16 settled
      // sequential creates on each of 2 × 2 interleaved `space up --warm 8` stacks, 2-core VM,
      // 2026-12-05).
      let claimed = true;
      try {
        renameSync(this.#slotDir(inst), dir);
      } catch {
        claimed = false;
      }
      if (claimed) {
        writeFileSync(join(dir, 'sandbox.json'), text, { mode: 0o600 });
        return;
      }
    }
    await mkdir(join(dir, 'commands'), { recursive: true });
    await writeFile(join(dir, 'sandbox.json'), text, { mode: 0o600 });
  }

  /**
   * The state directory made ahead for a warm slot: `<stateDir>/warm/<instanceId>/`, holding an
   * empty `commands/` and an empty `sandbox.json`. A claim renames it to the sandbox's directory
   * and overwrites the file, instead of making both: making a directory and a file is two inode
   * allocations, which where the state directory sits in a crowded ext4 block group cost ~1.5 ms
   * of kernel CPU per create (measured on a 2-core VM in `~/.space`, the local stack's: mkdir +
   * new file 1.3–1.9 ms, rename + overwrite 0.13–0.17 ms; in `/var/lib/space` on the same disk the
   * two allocations took ~0.08 ms). An empty `sandbox.json` is not JSON, so a directory renamed by
   * a claim that crashed before writing it is dropped by {@link adopt}.
   */
  #slotDir(inst: InstanceInfo): string {
    return join(this.#o.stateDir, 'warm', inst.instanceId);
  }

  /**
   * Destroys the sandbox (all its processes, files, network) and leaves a tombstone. Idempotent,
   * and it finishes whatever side step fails: a gateway that cannot be told (it is down or
   * restarting — a restarted gateway holds no registration anyway) is logged and skipped; when the
   * instance itself cannot be destroyed the sandbox stays listed (so the node still reports it and
   * the next delete, or the agent's reconciliation, tries again) and the error is thrown.
   * @throws SpaceError DRIVER_FAILED (or the driver's error) when the instance is still there.
   */
  async delete(id: string): Promise<void> {
    let p = this.#deleting.get(id);
    if (!p) {
      p = this.#delete(id).finally(() => this.#deleting.delete(id));
      this.#deleting.set(id, p);
    }
    return p;
  }

  async #delete(id: string): Promise<void> {
    this.#tombstones.set(id, Date.now());
    this.#pruneTombstones();
    const creating = this.#creating.get(id);
    if (creating) await creating.catch(() => {}); // its own tombstone check destroys what it made
    await this.#lifecycle.get(id)?.catch(() => {});
    this.#o.activity?.untrack(id);
    const sb = this.#sandboxes.get(id);
    if (sb) {
      const log = this.#o.log.child({ [F.sandboxId]: id });
      await this.#reportEndBeforeDelete(sb);
      for (const c of sb.commands.values()) c.abort.abort();
      for (const a of sb.guestStreams) a.abort();
      await sb.guest.close();
      await this.#unregister(id, sb.instance.network.sandboxAddress).catch((err: unknown) =>
        log.warn({ err }, 'gateway unregistration failed; destroying anyway'),
      );
      // only once the instance is gone does the sandbox leave this node's inventory
      await this.discard(sb.instance);
      this.#sandboxes.delete(id);
      await Promise.allSettled(
        [...sb.commands.values()].map(async (c) => {
          await c.done;
          await c.spool.close();
        }),
      );
      log.info('sandbox destroyed');
    }
    await rm(this.#dir(id), { recursive: true, force: true });
    await rm(join(this.#o.hibernateDir, id), { recursive: true, force: true });
  }

  #pruneTombstones(): void {
    const cutoff = Date.now() - TOMBSTONE_TTL_MS;
    for (const [id, t] of this.#tombstones) if (t < cutoff) this.#tombstones.delete(id);
  }

  /** Pushes a sandbox's egress policy to the packet layer (CIDR rules) and to the gateway (names). */
  async #applyEgress(
    sandboxId: string,
    inst: InstanceInfo,
    egress: EgressPolicy,
    credentials: CredentialGrant[],
    opts: { fresh?: boolean } = {},
  ): Promise<void> {
    // `fresh`: the network was just made (no CIDR rules): an empty list changes nothing there
    const cidrs =
      opts.fresh && egress.cidrs.length === 0
        ? undefined
        : this.#o.networks.setCidrAllows(inst.network, egress.cidrs);
    await Promise.all([cidrs, this.#register(sandboxId, inst.network.sandboxAddress, egress, credentials)]);
  }

  /**
   * Registers sandbox `id` at source `address` with the gateway (policy and grants), and records
   * what the gateway then holds (#atGateway): nothing while the call is in flight or after it
   * failed, so a watchdog pass registers it again. Nothing without a gateway.
   * @throws what GatewayClient.register throws.
   */
  async #register(
    id: string,
    address: string,
    policy: EgressPolicy,
    credentials: CredentialGrant[],
  ): Promise<void> {
    const gateway = this.#o.gateway;
    if (!gateway) return;
    this.#atGateway.delete(id);
    const { registryId } = await gateway.register(address, { sandboxId: id, policy, credentials });
    if (registryId !== undefined) this.#atGateway.set(id, { registryId, policy, credentials });
  }

  /**
   * Forgets sandbox `id`'s registration at `address` with the gateway, and the record of it, after
   * any registration of it still in flight (#trackRegistration): the unregistration is always the
   * gateway's last word on that address, whichever path ends the sandbox.
   */
  async #unregister(id: string, address: string): Promise<void> {
    await this.#registering.get(id);
    this.#atGateway.delete(id);
    await this.#o.gateway?.unregister(address);
  }

  /**
   * Whether the gateway holds `sb`'s current policy and grants, as far as this agent knows: its
   * last registration succeeded, sent what `sb` holds now, and was answered by the registry
   * `registryId` the gateway reports now (undefined: unknown, so not held).
   */
  #heldByGateway(sb: LocalSandbox, registryId: string | undefined): boolean {
    const at = this.#atGateway.get(sb.id);
    return (
      registryId !== undefined &&
      at?.registryId === registryId &&
      isDeepStrictEqual(at.policy, sb.egress) &&
      isDeepStrictEqual(at.credentials, sb.credentials)
    );
  }

  /** Replaces a running sandbox's egress policy (credential grants stay as they were). */
  async updateEgress(id: string, egress: EgressPolicy): Promise<void> {
    const sb = this.get(id);
    await this.#registering.get(id); // a claim's registration still in flight lands first
    // tracked: a watchdog pass meanwhile leaves the sandbox alone (it would send the old policy)
    await this.#trackRegistration(id, this.#applyEgress(id, sb.instance, egress, sb.credentials));
    sb.egress = egress;
    const file = join(this.#dir(id), 'sandbox.json');
    const rec = JSON.parse(await readFile(file, 'utf8')) as SandboxFile;
    rec.req.egress = egress;
    await writeFile(file, JSON.stringify(rec), { mode: 0o600 });
  }

  /** Starts a command in a running sandbox. */
  async startCommand(id: string, req: StartCommand): Promise<Command> {
    const { sb, release } = this.holdGuest(id);
    const existing = sb.commands.get(req.commandId);
    if (existing) {
      release();
      return existing;
    }
    let cmd: Command;
    try {
      cmd = await startCommand({
        guest: sb.guest,
        sandboxId: id,
        dir: join(this.#dir(id), 'commands'),
        req,
        spoolLimitBytes: this.#o.spoolLimitBytes,
        log: this.#o.log.child({ [F.sandboxId]: id }),
      });
    } catch (err) {
      throw await this.guestFailed(id, err);
    } finally {
      release();
    }
    sb.commands.set(cmd.id, cmd);
    const ended = this.#o.activity?.begin(id);
    if (ended) void cmd.done.finally(ended);
    await writeFile(
      join(this.#dir(id), 'commands', `${cmd.id}.json`),
      JSON.stringify({ pid: cmd.pid, startedAt: cmd.startedAt, config: cmd.config }),
    );
    return cmd;
  }

  /** The command or COMMAND_NOT_FOUND. */
  command(sandboxId: string, commandId: string): Command {
    const cmd = this.get(sandboxId).commands.get(commandId);
    if (!cmd) throw new SpaceError('COMMAND_NOT_FOUND', `no command ${commandId} in sandbox ${sandboxId}`);
    return cmd;
  }

  /**
   * After an agent restart: re-binds sandboxes whose instance still runs (reopening their command
   * spools; commands that were still running keep streaming from the exact spooled offset),
   * destroys instances no sandbox owns (old warm slots), and drops records whose instance is gone.
   * Returns what it did.
   */
  async adopt(): Promise<{ adopted: string[]; destroyed: string[]; lost: string[] }> {
    const instances = new Map((await this.#o.driver.list()).map((i) => [i.instanceId, i]));
    const adopted: string[] = [];
    const lost: string[] = [];
    const root = join(this.#o.stateDir, 'sandboxes');
    for (const id of existsSync(root) ? await readdir(root) : []) {
      const file = join(root, id, 'sandbox.json');
      let rec: SandboxFile;
      try {
        rec = JSON.parse(await readFile(file, 'utf8')) as SandboxFile;
      } catch {
        await rm(join(root, id), { recursive: true, force: true });
        continue;
      }
      const listed = instances.get(rec.instance.instanceId);
      // a `runsc state` that failed reads as stopped: trust a guest that still answers; then
      // re-attach to the instance (a VMM's API socket)
      const inst =
        listed && (listed.state !== 'stopped' || (await guestAnswers(listed)))
          ? await this.#o.driver.adopt(listed.instanceId).catch(() => null)
          : null;
      if (!inst) {
        lost.push(id);
        if (listed) {
          instances.delete(listed.instanceId);
          await this.discard(listed).catch(() => {});
        }
        await rm(join(root, id), { recursive: true, force: true });
        continue;
      }
      instances.delete(inst.instanceId);
      const sb = localSandbox(
        { ...rec.req, sandboxId: id, credentials: rec.req.credentials ?? [] },
        inst,
        new GuestClient(inst.guest),
        rec.source ?? (rec.fromWarmPool ? 'warm' : 'boot'),
      );
      sb.paused = listed?.state === 'paused' ? 'frozen' : null;
      await this.#applyEgress(id, inst, sb.egress, sb.credentials);
      // the previous agent's open interval is closed by this agent's first report
      this.#o.activity?.track(id, { paused: sb.paused !== null, reported: sb.paused ? 'paused' : null });
      await this.#adoptCommands(sb);
      this.#sandboxes.set(id, sb);
      adopted.push(id);
    }
    const destroyed = [...instances.keys()];
    for (const inst of instances.values()) await this.discard(inst).catch(() => {});
    // the state directories of slots whose instance is already gone (see #slotDir)
    await rm(join(this.#o.stateDir, 'warm'), { recursive: true, force: true });
    await this.#o.networks.sweep(this.list().map((s) => s.instance.network.netns));
    this.#o.log.info(
      { adopted: adopted.length, destroyed: destroyed.length, lost: lost.length },
      'sandboxes re-adopted',
    );
    return { adopted, destroyed, lost };
  }

  async #adoptCommands(sb: LocalSandbox): Promise<void> {
    const dir = join(this.#dir(sb.id), 'commands');
    const activity = this.#o.activity;
    for (const name of await readdir(dir).catch(() => [] as string[])) {
      if (!name.endsWith('.json')) continue;
      const id = name.slice(0, -'.json'.length);
      const meta = JSON.parse(await readFile(join(dir, name), 'utf8')) as {
        pid: number;
        startedAt: number;
        /** Absent in records of agents before commands were listed. */
        config?: CommandConfig;
      };
      const spool = await Spool.open(join(dir, `${id}.out`));
      const cmd: Command = {
        id,
        sandboxId: sb.id,
        pid: meta.pid,
        startedAt: meta.startedAt,
        config: meta.config ?? { cmd: '', args: [], env: {} },
        spool,
        exit: null,
        abort: new AbortController(),
        done: Promise.resolve(),
      };
      if (!spool.closed) {
        cmd.done = resumePump(
          sb.guest,
          cmd,
          this.#o.spoolLimitBytes,
          this.#o.log.child({ [F.sandboxId]: sb.id }),
        );
        const ended = activity?.begin(sb.id);
        if (ended) void cmd.done.finally(ended);
      }
      sb.commands.set(id, cmd);
    }
  }

  /**
   * Lets go of every sandbox without destroying it (agent restart with `keep`): stops spooling,
   * closes spools and guest connections. The next agent re-adopts them from disk.
   */
  async detachAll(): Promise<void> {
    this.stopAccepting();
    await Promise.allSettled([...this.#creating.values()]);
    for (const sb of this.#sandboxes.values()) {
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
    this.#sandboxes.clear();
    await this.#closeWarmGuests();
  }

  async #closeWarmGuests(): Promise<void> {
    const slots = [...this.#warmGuests.values()];
    this.#warmGuests.clear();
    await Promise.allSettled(slots.map((s) => s.guest.close()));
  }

  /**
   * Sets where sandboxes that end on their own are reported (id, why), from now on: a claim step
   * that fails before the watchdog's first pass (#claimStepFailed) is recorded as crashed, not
   * found missing later as lost. {@link watch} sets it too.
   */
  reportCrashesTo(onCrash: CrashReporter): void {
    this.#onCrash = onCrash;
  }

  /**
   * One watchdog pass: a sandbox whose instance stopped on its own (out of memory, a fork bomb
   * exhausting pids, a kernel failure) is torn down here — its streams end with an exit event at
   * once — and reported through `onCrash` so the control plane records why it ended. A live
   * sandbox the gateway may not hold is registered with it again: after a gateway restart (its
   * registry id changed), a registration that failed, or one this agent cannot confirm. Returns
   * the ids found crashed.
   */
  async watch(onCrash: CrashReporter): Promise<string[]> {
    this.#onCrash = onCrash;
    await Promise.allSettled([this.#registerStale(), this.checkWarmSlots()]);
    // no sandbox, nothing to look up: the driver's list is one `runsc list` of every container,
    // warm slots included, every pass
    const states =
      this.#sandboxes.size === 0
        ? new Map<string, string>()
        : new Map((await this.#o.driver.list()).map((i) => [i.instanceId, i.state]));
    const crashed: string[] = [];
    for (const sb of this.list()) {
      const state = states.get(sb.instance.instanceId);
      if (state === 'running' || state === 'paused') continue;
      // an instance being made or destroyed by this agent is not one that stopped on its own
      if (this.#creating.has(sb.id) || this.#tombstones.has(sb.id)) continue;
      // the driver's view can be wrong under load (a `runsc state` that timed out reads as
      // stopped): a sandbox whose guest still answers is alive, whatever the driver said
      if (
        await sb.guest.health().then(
          () => true,
          () => false,
        )
      )
        continue;
      if (this.#tombstones.has(sb.id)) continue; // deleted while its health was being asked
      crashed.push(sb.id);
      await this.#endCrashed(sb, onCrash);
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
  async #claimStepFailed(sb: LocalSandbox, what: string, err: unknown): Promise<void> {
    if (this.#tombstones.has(sb.id) || this.#sandboxes.get(sb.id) !== sb || sb.crashed) return;
    const message = `${what}: ${(err as Error).message}`;
    sb.crashed = message;
    this.#o.log.warn({ err, [F.sandboxId]: sb.id, [F.instanceId]: sb.instance.instanceId }, message);
    try {
      await this.#onCrash?.(sb.id, { reason: 'crashed', message });
    } catch (e) {
      this.#o.log.error(
        { err: e, [F.sandboxId]: sb.id },
        'reporting a sandbox whose claim step failed failed',
      );
    }
    await this.delete(sb.id).catch((e: unknown) =>
      this.#o.log.error(
        { err: e, [F.sandboxId]: sb.id },
        'deleting a sandbox whose claim step failed failed',
      ),
    );
  }

  /**
   * Health-checks the ready warm slots whose guest last answered {@link WARM_SLOT_CHECK_MS} ago or
   * more (keeping their connections open for the claim), longest-unchecked first, one at a time,
   * stopping when a create comes in; replaces the slots whose guest does not answer: a claim no
   * longer asks the guest before it answers, so a dead slot must leave the pool here.
   * @returns the instance ids checked, in order (tests).
   */
  async checkWarmSlots(now = Date.now()): Promise<string[]> {
    const due = [...this.#warmGuests]
      .filter(([, slot]) => now - slot.checkedAt >= WARM_SLOT_CHECK_MS)
      .sort(([, a], [, b]) => a.checkedAt - b.checkedAt);
    const checked: string[] = [];
    for (const [instanceId, slot] of due) {
      if (this.#creating.size > 0 || this.#closing) break; // a create goes first; the rest wait a pass
      if (!this.#warmGuests.has(instanceId)) continue; // claimed meanwhile
      checked.push(instanceId);
      if (
        await slot.guest.health().then(
          () => true,
          () => false,
        )
      ) {
        slot.checkedAt = Date.now();
        continue;
      }
      const inst = this.#warm?.evict(instanceId);
      if (!inst) continue; // claimed meanwhile: the claim owns it now
      this.#o.log.warn({ [F.instanceId]: instanceId }, 'warm slot stopped answering; replacing it');
      await this.discard(inst).catch((err: unknown) =>
        this.#o.log.warn({ err, [F.instanceId]: instanceId }, 'discarding a dead warm slot failed'),
      );
      this.#warm?.refill();
    }
    return checked;
  }

  /** The warm slot's guest client, now owned by the caller (undefined for other instances). */
  #takeWarmGuest(inst: InstanceInfo): GuestClient | undefined {
    const slot = this.#warmGuests.get(inst.instanceId);
    this.#warmGuests.delete(inst.instanceId);
    return slot?.guest;
  }

  /**
   * Records `p`, a registration of sandbox `id` with the gateway, as in flight (with any already
   * in flight), so a delete or a policy change waits for it: the gateway's last word on an address
   * is always the latest one sent. Returns `p`.
   */
  #trackRegistration(id: string, p: Promise<void>): Promise<void> {
    const all = Promise.allSettled([this.#registering.get(id), p]).then(() => {
      if (this.#registering.get(id) === all) this.#registering.delete(id);
    });
    this.#registering.set(id, all);
    return p;
  }

  /**
   * Registers again, all at once, every live sandbox the gateway may not hold (#heldByGateway)
   * and that has no registration in flight (that one records its own outcome). Before
   * `registryId` this was every sandbox on every pass: one control call per sandbox every 5 s.
   * A sandbox being deleted is left out (#registerAgain).
   */
  async #registerStale(): Promise<void> {
    const gateway = this.#o.gateway;
    if (!gateway || this.#sandboxes.size === 0) return;
    const registryId = await gateway.registryId().catch((err: unknown) => {
      this.#o.log.warn({ err }, 'the gateway did not say its registry id; registering every sandbox again');
      return undefined;
    });
    const stale = this.list().filter(
      (sb) => !this.#registering.has(sb.id) && !this.#heldByGateway(sb, registryId),
    );
    await Promise.allSettled(stale.map((sb) => this.#registerAgain(sb)));
  }

  /**
   * Registers a live sandbox with the gateway again (the watchdog). Skipped once a delete has begun
   * (its tombstone is set before it unregisters); a delete waits for one still in flight, so the
   * unregistration is always the gateway's last word on that address.
   */
  #registerAgain(sb: LocalSandbox): Promise<void> {
    if (this.#tombstones.has(sb.id)) return Promise.resolve();
    return this.#trackRegistration(
      sb.id,
      this.#register(sb.id, sb.instance.network.sandboxAddress, sb.egress, sb.credentials).catch(
        (err: unknown) => this.#o.log.warn({ err, [F.sandboxId]: sb.id }, 'gateway re-registration failed'),
      ),
    );
  }

  /**
   * Ends a sandbox whose instance stopped on its own: reads why from the driver (before the delete
   * removes the evidence), reports it through `onCrash` and deletes it. Returns the message.
   */
  async #endCrashed(sb: LocalSandbox, onCrash: CrashReporter): Promise<string> {
    const report = await this.#crashed(sb);
    await onCrash(sb.id, report);
    await this.delete(sb.id);
    return report.message;
  }

  /** Marks `sb` as ended on its own, with the cause the driver read (logged). */
  async #crashed(sb: LocalSandbox): Promise<EndReport> {
    const cause = await this.#o.driver.endCause?.(sb.instance.instanceId).catch(() => undefined);
    const report = crashReport(cause);
    sb.crashed = report.message;
    this.#o.log.warn(
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
  async #reportEndBeforeDelete(sb: LocalSandbox): Promise<void> {
    if (sb.crashed || sb.paused || !this.#onCrash || !this.#o.driver.endCause) return;
    try {
      const cause = await this.#o.driver.endCause(sb.instance.instanceId);
      if (!cause) return;
      const state = (await this.#o.driver.list()).find((i) => i.instanceId === sb.instance.instanceId)?.state;
      if (state === 'running' || state === 'paused') return;
      await this.#onCrash(sb.id, await this.#crashed(sb));
    } catch (err) {
      this.#o.log.warn({ err, [F.sandboxId]: sb.id }, 'reading whether a deleted sandbox had ended failed');
    }
  }

  /**
   * Called when the guest did not answer a call: if the instance has stopped, the sandbox is ended
   * now (as a watchdog pass would) and SANDBOX_CRASHED is returned for the caller to throw instead of
   * GUEST_UNAVAILABLE, so requests to a dead sandbox fail at once with the cause. Otherwise `err`.
   */
  async guestFailed(id: string, err: unknown): Promise<unknown> {
    if (!(err instanceof SpaceError) || err.code !== 'GUEST_UNAVAILABLE') return err;
    const sb = this.#sandboxes.get(id);
    // already found dead (by the watchdog or an earlier call), maybe still being torn down
    if (sb?.crashed) return new SpaceError('SANDBOX_CRASHED', sb.crashed, { sandboxId: id }, { cause: err });
    // an instance being made or destroyed by this agent is not one that stopped on its own
    if (!sb || this.#creating.has(id) || this.#tombstones.has(id) || sb.paused) return err;
    const state = (await this.#o.driver.list().catch(() => [])).find(
      (i) => i.instanceId === sb.instance.instanceId,
    )?.state;
    if (state === 'running' || state === 'paused' || state === undefined) return err;
    // as in the watchdog: the driver's view can be wrong under load; a guest that answers is alive
    if (
      await sb.guest.health().then(
        () => true,
        () => false,
      )
    )
      return err;
    if (this.#tombstones.has(id)) return err; // deleted while its health was being asked
    const message =
      sb.crashed ??
      (this.#onCrash ? await this.#endCrashed(sb, this.#onCrash) : crashReport(undefined).message);
    return new SpaceError('SANDBOX_CRASHED', message, { sandboxId: id }, { cause: err });
  }

  /** Refuses new creates from now on (shutdown). */
  stopAccepting(): void {
    this.#closing = true;
  }

  /**
   * Destroys every sandbox, including those still being created, and then every instance the
   * driver still has that no sandbox owns (local stack shutdown): nothing of this node is left.
   */
  async destroyAll(): Promise<void> {
    this.stopAccepting();
    const ids = new Set([...this.#sandboxes.keys(), ...this.#creating.keys()]);
    await Promise.allSettled([...ids].map((id) => this.delete(id)));
    const owned = new Set(this.list().map((sb) => sb.instance.instanceId));
    const strays = (await this.#o.driver.list().catch(() => [] as InstanceInfo[])).filter(
      (i) => !owned.has(i.instanceId),
    );
    await Promise.allSettled(strays.map((i) => this.discard(i)));
    await this.#closeWarmGuests();
    if (strays.length) this.#o.log.info({ instances: strays.length }, 'unowned instances destroyed');
  }

  /** Disk bytes used by a sandbox's spools (for metrics). */
  async spoolBytes(id: string): Promise<number> {
    let total = 0;
    const dir = join(this.#dir(id), 'commands');
    for (const n of await readdir(dir).catch(() => [] as string[])) total += (await stat(join(dir, n))).size;
    return total;
  }
}
