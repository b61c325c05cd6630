/**
 * What the two API-driven VMM drivers (Firecracker, Cloud Hypervisor) share: one VMM process per
 * instance, configured over HTTP/1.1 on a Unix socket, and the lifecycle around it.
 *
 * {@link VmmDriver} holds the flow every such driver follows — files first, then the VMM process
 * (through an injectable {@link VmmLauncher}), then the API calls, then the guest daemon's /health —
 * with a {@link CleanupStack} per create/restore, a persisted record per instance for `list`/`adopt`
 * after an agent restart, and snapshots that carry a copy of the instance disk (neither VMM puts disks
 * into its snapshot). A subclass supplies only the VMM-specific parts (argv, file placement, the calls).
 *
 * Per instance, under `<stateDir>/<driver>/<id>/`: `instance.json` ({@link PersistedVm}, mode 0600) and
 * `console.log` (the VMM's stdout/stderr: the guest serial console); the driver puts the rest where its
 * VMM needs it.
 */
import { spawn } from 'node:child_process';
import { constants, existsSync } from 'node:fs';
import { access, link, mkdir, open, readdir, readFile, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { SpaceError } from '../../core/errors.ts';
import { GUEST_PORT } from '../../core/guest-protocol.ts';
import { hostExec } from '../host/host-exec.ts';
import {
  CleanupStack,
  type Driver,
  type DriverCapabilities,
  type DriverName,
  type InstanceInfo,
  type InstanceSpec,
  type InstanceStats,
  instanceInfo,
  type RestoreSpec,
  type SnapshotRef,
} from './driver.ts';
import { waitForHealth } from './guest-health.ts';

const run = hostExec;

/** What a driver asks its launcher to start. */
export interface VmmLaunch {
  /** Executable and argv (the jailer, or `nsenter … cloud-hypervisor …`). */
  cmd: string;
  args: string[];
  /** File that receives the process's stdout and stderr (appended). */
  logFile: string;
  /** Host path of the API socket the driver will connect to once the VMM is up. */
  apiSocket: string;
}

/**
 * Starts a VMM process detached from the agent (own session, so it outlives an agent restart).
 * @returns the pid of the process it started (for Firecracker under `--new-pid-ns`, the jailer's; the
 *   driver reads the VMM's own pid from the jailer's pid file).
 */
export type VmmLauncher = (launch: VmmLaunch) => Promise<{ pid: number }>;

/** The production launcher: `spawn` detached, stdio to `logFile`, not waited for. */
export const spawnLauncher: VmmLauncher = async (l) => {
  const log = await open(l.logFile, 'a', 0o600);
  try {
    const child = spawn(l.cmd, l.args, { detached: true, stdio: ['ignore', log.fd, log.fd] });
    const pid = await new Promise<number>((resolve, reject) => {
      child.once('error', reject);
      child.once('spawn', () => resolve(child.pid!));
    });
    child.unref();
    return { pid };
  } finally {
    await log.close();
  }
};

/** Waits for a guest daemon to answer (default: `waitForHealth` on the sandbox address). */
export type GuestWaiter = (host: string, timeoutMs: number, alive: () => Promise<boolean>) => Promise<void>;

import { readJsonFile, writeFileAtomic } from '../host/durable-file.ts';
// the API client lives in vmm-api.ts; re-exported for the drivers
import { waitForApiSocket } from './vmm-api.ts';

/** Whether a process with this pid exists (signal 0). */
export function pidAlive(pid: number | undefined): boolean {
  if (!pid || pid <= 0) return false;
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/** SIGKILLs `pid` (if alive) and waits up to `timeoutMs` for it to be gone. Never throws. */
export async function killAndWait(pid: number | undefined, timeoutMs = 5000): Promise<void> {
  if (!pidAlive(pid)) return;
  try {
    process.kill(pid!, 'SIGKILL');
  } catch {}
  const deadline = Date.now() + timeoutMs;
  while (pidAlive(pid) && Date.now() < deadline) {
    // a zombie of ours (test stand-ins) stays "alive" until reaped; /proc says so
    const st = await readFile(`/proc/${pid}/stat`, 'utf8').catch(() => '');
    if (!st || / Z /.test(st)) return;
    await new Promise((r) => setTimeout(r, 10));
  }
}

/** Resident set of a process from `/proc/<pid>/status` (`VmRSS`, kB), in bytes. @throws DRIVER_FAILED. */
export async function processRssBytes(pid: number, instanceId: string): Promise<number> {
  const text = await readFile(`/proc/${pid}/status`, 'utf8').catch(() => '');
  const m = /^VmRSS:\s+(\d+)\s+kB/m.exec(text);
  if (!m) throw new SpaceError('DRIVER_FAILED', `no memory figures for ${instanceId}'s VMM`, { instanceId });
  return Number(m[1]) * 1024;
}

/**
 * Copies a disk image keeping it sparse (`cp --sparse=always --reflink=auto`: a CoW clone where the
 * filesystem can). @throws Error with cp's message.
 */
export async function copyDisk(src: string, dst: string): Promise<void> {
  try {
    await run('cp', ['--sparse=always', '--reflink=auto', '--', src, dst]);
  } catch (err) {
    const e = err as { stderr?: string; message: string };
    throw new Error(`cp ${src} ${dst}: ${(e.stderr || e.message).trim()}`);
  }
}

/** Hard-links `src` to `dst` (same inode: shared page cache), or copies it across filesystems. */
export async function linkOrCopy(src: string, dst: string): Promise<void> {
  try {
    await link(src, dst);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code !== 'EXDEV' && code !== 'EPERM') throw err;
    await copyDisk(src, dst);
  }
}

/** What `instance.json` holds for a VMM instance. */
export interface PersistedVm {
  spec: InstanceSpec;
  /** Epoch ms. */
  createdAt: number;
  /** Host pid of the VMM process. */
  pid: number;
  /** Host path of its API socket. */
  apiSocket: string;
  /** Driver-specific fields (e.g. the jailer uid). */
  extra?: Record<string, number | string>;
}

/** Common configuration of the VMM drivers. */
export interface VmmDriverConfig {
  /** Driver state root; this driver's instances live in `<stateDir>/<driver name>/`. */
  stateDir: string;
  /** Starts the VMM process (default {@link spawnLauncher}; tests replace it). */
  launcher?: VmmLauncher;
  /** Waits for the guest daemon (default `waitForHealth` on the sandbox address, {@link GUEST_PORT}). */
  waitForGuest?: GuestWaiter;
  /** How long create/restore wait for the guest's /health, ms (default 30 000). */
  healthTimeoutMs?: number;
  /** How long to wait for the VMM's API socket, ms (default 10 000). */
  socketTimeoutMs?: number;
  log?: (msg: string, fields?: Record<string, unknown>) => void;
}

/** The VMM process a subclass prepared, ready to be launched. */
export interface PreparedVmm {
  launch: VmmLaunch;
  /** When set, the VMM's pid is read from this file (the jailer's) instead of the launcher's answer. */
  pidFile?: string;
  extra?: PersistedVm['extra'];
}

/**
 * What both VMM drivers can do. Guest links: `tcp` first, the one used (the guest daemon over the tap,
 * as with every driver); `vsock` is offered by both VMMs but no device is attached, because Node cannot
 * listen on AF_VSOCK and each VMM bridges vsock to a Unix socket with its own handshake. No balloon yet.
 */
export const VMM_CAPABILITIES: Readonly<DriverCapabilities> = {
  pause: true,
  snapshot: true,
  restore: true,
  memoryStats: true,
  balloon: false,
  guestLinks: ['tcp', 'vsock'],
  network: 'tap',
  rootfs: 'ext4',
  ownKernel: true,
};

/**
 * Maps a VMM's state word to the driver's: both name them `Running` and `Paused` (Firecracker's
 * definitions `InstanceInfo.state`; Cloud Hypervisor's `VmState`); anything else (`Not started`,
 * `Created`, `Shutdown`, `BreakPoint`) is not a usable instance. Pure.
 */
export function mapVmmState(state: string | undefined): 'running' | 'paused' | 'stopped' {
  if (state === 'Running') return 'running';
  if (state === 'Paused') return 'paused';
  return 'stopped';
}

/** Longest Unix socket path Linux accepts (`sun_path` is 108 bytes with its NUL). */
export const MAX_SOCKET_PATH = 107;

/** Instance ids the VMM drivers accept: the jailer's rule (alphanumerics and hyphens, ≤ 64). */
export const VMM_ID_RE = /^[A-Za-z0-9][A-Za-z0-9-]{0,63}$/;

/**
 * The lifecycle shared by API-driven VMM drivers. Subclasses implement the `protected abstract` parts.
 * Errors: `SpaceError` DRIVER_FAILED (with the VMM's fault message and the console's tail),
 * INSTANCE_LOST from {@link adopt}.
 */
export abstract class VmmDriver implements Driver {
  abstract readonly name: DriverName;
  abstract readonly capabilities: DriverCapabilities;
  protected readonly launcher: VmmLauncher;
  protected readonly waitForGuest: GuestWaiter;
  protected readonly healthTimeoutMs: number;
  protected readonly socketTimeoutMs: number;
  protected readonly log?: (msg: string, fields?: Record<string, unknown>) => void;
  readonly #stateDir: string;

  constructor(c: VmmDriverConfig) {
    this.#stateDir = c.stateDir;
    this.launcher = c.launcher ?? spawnLauncher;
    this.waitForGuest = c.waitForGuest ?? ((host, ms, alive) => waitForHealth(host, ms, alive));
    this.healthTimeoutMs = c.healthTimeoutMs ?? 30_000;
    this.socketTimeoutMs = c.socketTimeoutMs ?? 10_000;
    this.log = c.log;
  }

  /** Name used in messages (`firecracker`, `cloud-hypervisor`). */
  protected abstract readonly vmm: string;
  /** GET path that answers once the API is up (readiness probe and `adopt` check). */
  protected abstract readonly probePath: string;
  /** `[what, path]` of every binary the driver needs (checked by {@link preflight}). */
  protected abstract binaries(): [string, string][];
  /** Makes the VMM's files for a cold boot (registering undo steps) and returns how to launch it. */
  protected abstract prepareCreate(spec: InstanceSpec, undo: CleanupStack): Promise<PreparedVmm>;
  /** The API calls that configure and boot a freshly launched VMM. */
  protected abstract boot(p: PersistedVm): Promise<void>;
  /** Makes the files for a restore from `snap` and returns how to launch a fresh VMM. */
  protected abstract prepareRestore(
    snap: SnapshotRef,
    spec: InstanceSpec,
    undo: CleanupStack,
  ): Promise<PreparedVmm>;
  /** The API calls that load `snap` into a fresh VMM and resume it. */
  protected abstract load(p: PersistedVm, snap: SnapshotRef): Promise<void>;
  protected abstract pauseVm(p: PersistedVm): Promise<void>;
  protected abstract resumeVm(p: PersistedVm): Promise<void>;
  /** Writes the VMM's snapshot files into `dir` (the VM is paused). */
  protected abstract snapshotVm(p: PersistedVm, dir: string): Promise<void>;
  /** The VM's state as the VMM reports it. @throws when the API does not answer. */
  protected abstract vmState(p: PersistedVm): Promise<'running' | 'paused' | 'stopped'>;
  /** Host path of the instance's writable disk (copied into snapshots). */
  protected abstract diskPath(p: PersistedVm): string;
  /** Asks the VMM to stop (best effort; the process is killed afterwards regardless). */
  protected abstract shutdownVm(p: PersistedVm): Promise<void>;
  /** Removes what the subclass made outside the instance dir (chroot, cgroups). Idempotent. */
  protected abstract removeExtras(instanceId: string, p: PersistedVm | undefined): Promise<void>;

  /** `<stateDir>/<driver>/<id>`: instance.json and console.log. */
  instanceDir(id: string): string {
    return join(this.#stateDir, this.name, id);
  }

  /** Checks the binaries (executable) and /dev/kvm (read-write). @throws DRIVER_FAILED listing all that is missing. */
  async preflight(): Promise<void> {
    const missing: string[] = [];
    for (const [what, path] of this.binaries()) {
      await access(path, constants.X_OK).catch(() =>
        missing.push(`${what} not found or not executable at ${path}`),
      );
    }
    await access('/dev/kvm', constants.R_OK | constants.W_OK).catch(() =>
      missing.push('/dev/kvm is missing or not read-writable'),
    );
    if (missing.length) {
      throw new SpaceError('DRIVER_FAILED', `${this.name} preflight failed: ${missing.join('; ')}`, {
        driver: this.name,
        missing,
      });
    }
  }

  /**
   * Cold boot: files, VMM process, configuration calls, boot, guest /health.
   * @throws SpaceError DRIVER_FAILED (everything made by this call is undone first).
   */
  async create(spec: InstanceSpec): Promise<InstanceInfo> {
    this.checkSpec(spec);
    if (!spec.image.rootfsImage || !spec.image.kernel) {
      throw new SpaceError(
        'DRIVER_FAILED',
        `template image ${spec.image.digest} has no ${spec.image.rootfsImage ? 'kernel' : 'rootfs image'} for ${this.name}`,
        { instanceId: spec.instanceId },
      );
    }
    return this.start(
      spec,
      'create',
      (undo) => this.prepareCreate(spec, undo),
      (p) => this.boot(p),
    );
  }

  /**
   * Loads `snapshot` into a fresh VMM with `spec`'s id and network (same tap name and guest address
   * in every namespace, see `GUEST_NET`), on a copy of the snapshot's disk.
   * @throws SpaceError DRIVER_FAILED (wrong driver or image, or the load failed; all undone).
   */
  async restore(snapshot: SnapshotRef, r: RestoreSpec): Promise<InstanceInfo> {
    if (snapshot.driver !== this.name) {
      throw new SpaceError('DRIVER_FAILED', `snapshot ${snapshot.path} was taken by ${snapshot.driver}`, {
        snapshot: snapshot.path,
      });
    }
    if (snapshot.imageDigest !== r.image.digest) {
      throw new SpaceError(
        'DRIVER_FAILED',
        `snapshot ${snapshot.path} needs image ${snapshot.imageDigest}, got ${r.image.digest}`,
        { snapshot: snapshot.path },
      );
    }
    const spec: InstanceSpec = {
      ...r,
      vcpus: snapshot.vcpus,
      memoryMiB: snapshot.memoryMiB,
      diskMiB: snapshot.diskMiB,
      // recorded for adopt and returned; the guest holds the snapshot's until the caller rotates it
      guestToken: r.guestToken,
    };
    this.checkSpec(spec);
    return this.start(
      spec,
      'restore',
      (undo) => this.prepareRestore(snapshot, spec, undo),
      (p) => this.load(p, snapshot),
    );
  }

  private checkSpec(spec: InstanceSpec): void {
    const id = spec.instanceId;
    if (!VMM_ID_RE.test(id))
      throw new SpaceError('DRIVER_FAILED', `bad instance id ${id}`, { instanceId: id });
    if (existsSync(this.instanceDir(id)))
      throw new SpaceError('DRIVER_FAILED', `instance ${id} already exists`, { instanceId: id });
    if (!spec.network.tap)
      throw new SpaceError('DRIVER_FAILED', `instance ${id} has no tap attached (network.tap)`, {
        instanceId: id,
      });
  }

  /** The shared create/restore flow; `configure` runs the VMM-specific API calls. */
  private async start(
    spec: InstanceSpec,
    what: 'create' | 'restore',
    prepare: (undo: CleanupStack) => Promise<PreparedVmm>,
    configure: (p: PersistedVm) => Promise<void>,
  ): Promise<InstanceInfo> {
    const id = spec.instanceId;
    const dir = this.instanceDir(id);
    const createdAt = Date.now();
    const undo = new CleanupStack();
    let pid: number | undefined;
    try {
      await mkdir(dir, { recursive: true, mode: 0o700 });
      undo.push('instance dir', () => rm(dir, { recursive: true, force: true }));
      const prep = await prepare(undo);
      if (Buffer.byteLength(prep.launch.apiSocket) > MAX_SOCKET_PATH) {
        throw new Error(
          `API socket path ${prep.launch.apiSocket} exceeds the ${MAX_SOCKET_PATH}-byte Unix socket limit (shorten the state dir)`,
        );
      }
      const launched = await this.launcher(prep.launch);
      pid = launched.pid;
      undo.push('vmm process', () => killAndWait(pid));
      if (prep.pidFile) {
        pid = await this.readPidFile(prep.pidFile, launched.pid);
      }
      const p: PersistedVm = { spec, createdAt, pid, apiSocket: prep.launch.apiSocket, extra: prep.extra };
      await writeFileAtomic(join(dir, 'instance.json'), JSON.stringify(p));
      const alive = async () => pidAlive(p.pid);
      await waitForApiSocket(p.apiSocket, this.probePath, this.socketTimeoutMs, alive);
      await configure(p);
      await this.waitForGuest(spec.network.sandboxAddress, this.healthTimeoutMs, alive);
      undo.release();
      this.log?.(`instance ${what}d`, { id, ms: Date.now() - createdAt });
      return instanceInfo(p, 'running');
    } catch (err) {
      const diag = await this.consoleTail(id);
      const left = await undo.unwind();
      if (left.length) this.log?.(`cleanup after failed ${what} failed`, { id, left });
      throw new SpaceError(
        'DRIVER_FAILED',
        `${this.name} ${what} ${id} failed: ${(err as Error).message}${diag ? `\n${diag}` : ''}`,
        { instanceId: id, ...(left.length ? { leftBehind: left } : {}) },
        { cause: err },
      );
    }
  }

  /** Waits for a pid file the jailer writes; gives up when `launcherPid` exited without writing it. */
  private async readPidFile(file: string, launcherPid: number): Promise<number> {
    const deadline = Date.now() + this.socketTimeoutMs;
    while (Date.now() < deadline) {
      const text = await readFile(file, 'utf8').catch(() => '');
      const pid = Number(text.trim());
      if (Number.isInteger(pid) && pid > 0) return pid;
      if (!pidAlive(launcherPid) && !text) {
        // one more look: the launcher may have written it just before exiting
        const again = Number((await readFile(file, 'utf8').catch(() => '')).trim());
        if (Number.isInteger(again) && again > 0) return again;
        throw new Error(`the launcher exited without writing ${file}`);
      }
      await new Promise((r) => setTimeout(r, 10));
    }
    throw new Error(`no pid in ${file} within ${this.socketTimeoutMs} ms`);
  }

  /** Freezes the vCPUs. @throws DRIVER_FAILED (unknown instance or the VMM refused). */
  async pause(instanceId: string): Promise<void> {
    await this.pauseVm(await this.persisted(instanceId));
  }

  /** Thaws the vCPUs. @throws DRIVER_FAILED. */
  async resume(instanceId: string): Promise<void> {
    await this.resumeVm(await this.persisted(instanceId));
  }

  /**
   * Writes a snapshot into `dir`: the VMM's files (memory and device state, taken while paused) plus a
   * sparse copy of the instance disk (`disk.img`) made while still paused, and `snapshot.json` (0600).
   * A running instance is paused for it and resumed afterwards; a paused one stays paused.
   * @throws DRIVER_FAILED (a running instance is resumed even then).
   */
  async snapshot(instanceId: string, dir: string): Promise<SnapshotRef> {
    const p = await this.persisted(instanceId);
    const wasRunning = (await this.vmState(p)) === 'running';
    await mkdir(dir, { recursive: true, mode: 0o700 });
    if (wasRunning) await this.pauseVm(p);
    try {
      await this.snapshotVm(p, dir);
      await copyDisk(this.diskPath(p), join(dir, 'disk.img'));
    } catch (err) {
      if (err instanceof SpaceError) throw err;
      throw new SpaceError(
        'DRIVER_FAILED',
        `${this.name} snapshot ${instanceId}: ${(err as Error).message}`,
        { instanceId },
        { cause: err },
      );
    } finally {
      if (wasRunning) await this.resumeVm(p);
    }
    const ref: SnapshotRef = {
      driver: this.name,
      instanceId,
      template: p.spec.template,
      imageDigest: p.spec.image.digest,
      path: dir,
      vcpus: p.spec.vcpus,
      memoryMiB: p.spec.memoryMiB,
      diskMiB: p.spec.diskMiB,
      guestToken: p.spec.guestToken,
      createdAt: Date.now(),
    };
    await writeFileAtomic(join(dir, 'snapshot.json'), JSON.stringify(ref));
    return ref;
  }

  /**
   * Asks the VMM to stop, kills its process, removes the instance dir and the subclass's extras.
   * Idempotent. @throws DRIVER_FAILED only when a directory cannot be removed.
   */
  async destroy(instanceId: string): Promise<void> {
    const p = await this.persisted(instanceId).catch(() => undefined);
    if (p && pidAlive(p.pid)) {
      await this.shutdownVm(p).catch(() => {});
      await killAndWait(p.pid);
    }
    try {
      await this.removeExtras(instanceId, p);
      await rm(this.instanceDir(instanceId), { recursive: true, force: true });
    } catch (err) {
      throw new SpaceError(
        'DRIVER_FAILED',
        `cannot remove ${instanceId}: ${(err as Error).message}`,
        { instanceId },
        { cause: err },
      );
    }
    this.log?.('instance destroyed', { id: instanceId });
  }

  /** Instances with an `instance.json`; state from the VMM (`stopped` when its process or API is gone). */
  async list(): Promise<InstanceInfo[]> {
    const out: InstanceInfo[] = [];
    for (const p of await this.records()) out.push(instanceInfo(p, await this.liveState(p)));
    return out;
  }

  /** Every readable `instance.json` of this driver. */
  protected async records(): Promise<PersistedVm[]> {
    const ids = await readdir(join(this.#stateDir, this.name)).catch(() => [] as string[]);
    const out: PersistedVm[] = [];
    for (const id of ids) {
      const p = await this.persisted(id).catch(() => undefined);
      if (p) out.push(p);
    }
    return out;
  }

  /**
   * Re-attaches to an instance after an agent restart: its VMM process must be alive and its API
   * socket must answer. @throws SpaceError INSTANCE_LOST otherwise.
   */
  async adopt(instanceId: string): Promise<InstanceInfo> {
    const p = await this.persisted(instanceId).catch(() => undefined);
    const state = p ? await this.liveState(p) : 'stopped';
    if (!p || state === 'stopped') {
      throw new SpaceError('INSTANCE_LOST', `instance ${instanceId}'s ${this.vmm} is gone`, { instanceId });
    }
    return instanceInfo(p, state);
  }

  /** Host memory of the VMM process (`VmRSS`), bytes. @throws DRIVER_FAILED. */
  async stats(instanceId: string): Promise<InstanceStats> {
    const p = await this.persisted(instanceId);
    return { memoryBytes: await processRssBytes(p.pid, instanceId) };
  }

  /** The instance's record. @throws DRIVER_FAILED when unknown. */
  protected async persisted(instanceId: string): Promise<PersistedVm> {
    if (!VMM_ID_RE.test(instanceId))
      throw new SpaceError('DRIVER_FAILED', `bad instance id ${instanceId}`, { instanceId });
    const r = await readJsonFile<PersistedVm>(join(this.instanceDir(instanceId), 'instance.json')).catch(
      () => null,
    );
    if (!r?.ok)
      throw new SpaceError('DRIVER_FAILED', `no ${this.name} instance ${instanceId}`, { instanceId });
    return r.value;
  }

  private async liveState(p: PersistedVm): Promise<InstanceInfo['state']> {
    if (!pidAlive(p.pid)) return 'stopped';
    return this.vmState(p).catch(() => 'stopped' as const);
  }

  /** Last lines of the instance's console (VMM stdout/stderr), for error messages. */
  private async consoleTail(id: string): Promise<string> {
    const text = await readFile(join(this.instanceDir(id), 'console.log'), 'utf8').catch(() => '');
    return text.trim() ? `--- console ---\n${text.trim().split('\n').slice(-15).join('\n')}` : '';
  }
}
