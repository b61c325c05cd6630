/**
 * The gVisor driver: one `runsc` container per instance, with gVisor's own network stack on the
 * namespace prepared by `host/network.ts` (the OCI spec names `/var/run/netns/<netns>`).
 *
 * Per instance, under `<stateDir>/instances/<id>/`:
 * ```
 * instance.json   persisted {@link PersistedInstance} (spec + createdAt), for re-adoption
 * disk.img disk/  the sandbox's own ext4 disk (upper/ and work/ of the overlay: its writes)
 * rootfs/         overlay mount point (lowers = the image's guest layer over the template tree)
 * config.json     OCI bundle spec (the instance dir is the bundle)
 * console.log     the guest's stdout/stderr
 * logs/           runsc --debug-log files (boot, gofer, run …) for failure diagnosis
 * ```
 * A snapshot directory (see {@link GvisorDriver.snapshot}):
 * ```
 * checkpoint.img  runsc checkpoint image (the sentry's memory and kernel state, netstack included)
 * disk.img        copy of the instance's disk.img taken while it was paused for the checkpoint
 * snapshot.json   the {@link SnapshotRef}, mode 0600 (it holds the guest token inside the snapshot)
 * ```
 * runsc state lives in `runscRoot` (default `<stateDir>/runsc`). Needs runsc 2024-07-29 or later
 * ({@link MIN_RUNSC_RELEASE}: checkpoint with live TCP endpoints, systrap). The platform is
 * {@link DEFAULT_GVISOR_PLATFORM} by default (the KVM platform hung on the machines SPACE was measured on; `npm run bench:gvisor` compares the
 * platforms). Nothing
 * from the host is mounted into the sandbox: the guest daemon, its Node and tini come from the image's
 * guest layer (`image/images.ts`).
 *
 * Network on restore: runsc (2024-07-29, checked) rebuilds the sandbox's NICs, addresses and routes
 * from the namespace it is restored into, so a restored instance simply has its new network's
 * address; no fixed inner address is needed. The snapshot's `/etc/resolv.conf` still names the old
 * host end, which is harmless: nftables hands DNS to the gateway whatever address it was sent to.
 */
import { createHash } from 'node:crypto';
import { existsSync } from 'node:fs';
import { mkdir, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { SpaceError } from '../../core/errors.ts';
import { hostExec } from '../host/host-exec.ts';
import { GUEST_ARGV, GUEST_PATHS } from '../image/images.ts';
import {
  CleanupStack,
  type Driver,
  type DriverCapabilities,
  INSTANCE_ID_RE,
  type InstanceEndCause,
  type InstanceInfo,
  type InstanceSpec,
  type InstanceStats,
  instanceInfo,
  type RestoreSpec,
  type SnapshotRef,
} from './driver.ts';
import { waitForHealth } from './guest-health.ts';
import { giveBackAddress, removeCgroups, sh, unmountIfMounted } from './gvisor-host.ts';
import { cgroupV1File, instanceEndCause, instanceMemoryCharge } from './gvisor-limits.ts';
import { DEFAULT_GVISOR_PLATFORM } from './gvisor-platform.ts';

const run = hostExec;

/** The guest daemon under tini, from the image's guest layer. */
export const DEFAULT_GUEST_ARGV = GUEST_ARGV;

/** What instance.json holds. */
export interface PersistedInstance {
  spec: InstanceSpec;
  /** Epoch ms. */
  createdAt: number;
}

import { readJsonFile, writeFileAtomic } from '../host/durable-file.ts';
// the pure parts (its configuration, the OCI spec, runsc command lines) live in gvisor-runsc.ts;
import {
  buildOciSpec,
  checkpointFailureReason,
  type GvisorConfig,
  MIN_RUNSC_RELEASE,
  mapRunscStatus,
  overlayOptions,
  runscCheckpointArgs,
  runscCmdArgs,
  runscGlobalArgs,
  runscRelease,
  runscRestoreCommand,
  runscRunCommand,
  runscStartCommand,
  SANDBOX_PID_FILE,
} from './gvisor-runsc.ts';

/** gVisor implementation of {@link Driver}. */
export class GvisorDriver implements Driver {
  readonly name = 'gvisor' as const;
  readonly capabilities: DriverCapabilities = {
    pause: true,
    snapshot: false,
    restore: false,
    memoryStats: true,
    balloon: false,
    guestLinks: ['tcp'],
    network: 'veth',
    rootfs: 'directory',
    ownKernel: false,
  };
  private readonly cfg: Required<Omit<GvisorConfig, 'log'>> & Pick<GvisorConfig, 'log'>;
  /** Digest of the guest argv and platform: what a checkpoint holds beyond the image. */
  readonly snapshotKey: string;

  constructor(config: GvisorConfig) {
    this.capabilities.snapshot = this.capabilities.restore = config.snapshots ?? false;
    this.cfg = {
      ...config,
      runscRoot: config.runscRoot ?? join(config.stateDir, 'runsc'),
      runscBinary: config.runscBinary ?? 'runsc',
      platform: config.platform ?? DEFAULT_GVISOR_PLATFORM,
      guestArgv: config.guestArgv ?? DEFAULT_GUEST_ARGV,
      healthTimeoutMs: config.healthTimeoutMs ?? 30_000,
      debug: config.debug ?? false,
      checkpointCompression: config.checkpointCompression ?? 'none',
      snapshots: config.snapshots ?? false,
    };
    this.snapshotKey = createHash('sha256')
      .update(JSON.stringify({ argv: this.cfg.guestArgv, platform: this.cfg.platform }))
      .digest('hex')
      .slice(0, 16);
  }

  /**
   * Checks root and runsc (present, release ≥ {@link MIN_RUNSC_RELEASE}).
   * @throws SpaceError DRIVER_FAILED listing what is missing.
   */
  async preflight(): Promise<void> {
    const missing: string[] = [];
    if (process.getuid?.() !== 0) missing.push('must run as root');
    const version = await run(this.cfg.runscBinary, ['--version']).then(
      (r) => r.stdout,
      () => undefined,
    );
    if (version === undefined) {
      missing.push(`${this.cfg.runscBinary} (install: scripts/host-deps.sh)`);
    } else {
      const release = runscRelease(version);
      if (release === undefined || release < MIN_RUNSC_RELEASE) {
        missing.push(
          `${this.cfg.runscBinary} release ${release ?? 'unknown'} is older than ${MIN_RUNSC_RELEASE} ` +
            '(no checkpoint with live TCP endpoints, no systrap; install: scripts/host-deps.sh)',
        );
      }
    }
    if (missing.length) {
      throw new SpaceError('DRIVER_FAILED', `gvisor preflight failed: ${missing.join('; ')}`, { missing });
    }
  }

  /** `<stateDir>/instances/<id>`. */
  instanceDir(id: string): string {
    return join(this.cfg.stateDir, 'instances', id);
  }

  /**
   * Mounts the overlay, writes the bundle, runs the container and waits for the guest's /health.
   * @throws SpaceError DRIVER_FAILED (cleans up everything it made, network excluded; message has the
   *   tail of the guest console and runsc logs).
   */
  async create(spec: InstanceSpec): Promise<InstanceInfo> {
    const id = spec.instanceId;
    if (!INSTANCE_ID_RE.test(id))
      throw new SpaceError('DRIVER_FAILED', `bad instance id ${id}`, { instanceId: id });
    const dir = this.instanceDir(id);
    if (existsSync(dir))
      throw new SpaceError('DRIVER_FAILED', `instance ${id} already exists`, { instanceId: id });
    const createdAt = Date.now();
    const undo = new CleanupStack();
    undo.push('namespace address', () => giveBackAddress(spec.network));
    undo.push('instance', () => this.destroy(id));
    try {
      await this.prepareBundle(spec, dir);
      await writeFileAtomic(
        join(dir, 'instance.json'),
        JSON.stringify({ spec, createdAt } satisfies PersistedInstance),
      );
      await this.startContainer(dir, runscRunCommand(this.cfg.runscBinary, this.globalArgs(id), dir, id));
      await waitForHealth(spec.network.sandboxAddress, this.cfg.healthTimeoutMs, async () => {
        const status = await this.runscStatus(id);
        return status === 'running' || status === 'created';
      });
    } catch (err) {
      const diag = await this.diagnostics(dir);
      const left = await undo.unwind();
      if (left.length) this.cfg.log?.('cleanup after failed create failed', { id, left });
      throw new SpaceError(
        'DRIVER_FAILED',
        `gvisor create ${id} failed: ${(err as Error).message}${diag ? `\n${diag}` : ''}`,
        { instanceId: id },
        { cause: err },
      );
    }
    this.cfg.log?.('instance created', { id, ms: Date.now() - createdAt });
    return instanceInfo({ spec, createdAt, ...(await this.sandboxPid(id)) }, 'running');
  }

  /**
   * Starts a new instance from a snapshot written by {@link snapshot}: a new instance dir with a copy of
   * the snapshot's disk, the same image lowers, a bundle naming `spec`'s network namespace, then
   * `runsc restore`; resolves when the guest answers /health at `spec.network.sandboxAddress`.
   * vCPUs, memory and disk size are the snapshot's; the guest token is the snapshot's (the caller
   * rotates it), and so is `info.guest.token`.
   * @throws SpaceError DRIVER_FAILED when the snapshot is another driver's or another image's, or
   *   when anything fails (then everything this call made is undone; the network is the caller's).
   */
  async restore(snapshot: SnapshotRef, spec: RestoreSpec): Promise<InstanceInfo> {
    const id = spec.instanceId;
    if (!INSTANCE_ID_RE.test(id))
      throw new SpaceError('DRIVER_FAILED', `bad instance id ${id}`, { instanceId: id });
    if (snapshot.driver !== 'gvisor' || snapshot.imageDigest !== spec.image.digest) {
      throw new SpaceError(
        'DRIVER_FAILED',
        `snapshot ${snapshot.path} (${snapshot.driver}, image ${snapshot.imageDigest.slice(0, 12)}) ` +
          `cannot be restored by gvisor on image ${spec.image.digest.slice(0, 12)}`,
        { instanceId: id, snapshot: snapshot.path },
      );
    }
    const dir = this.instanceDir(id);
    if (existsSync(dir))
      throw new SpaceError('DRIVER_FAILED', `instance ${id} already exists`, { instanceId: id });
    const full: InstanceSpec = {
      // the new token is recorded (adopt, the returned info); the guest holds the snapshot's until
      // the caller rotates it
      ...spec,
      vcpus: snapshot.vcpus,
      memoryMiB: snapshot.memoryMiB,
      diskMiB: snapshot.diskMiB,
    };
    const createdAt = Date.now();
    const undo = new CleanupStack();
    undo.push('namespace address', () => giveBackAddress(spec.network));
    undo.push('instance', () => this.destroy(id));
    try {
      await this.prepareBundle(full, dir, join(snapshot.path, 'disk.img'));
      await writeFileAtomic(
        join(dir, 'instance.json'),
        JSON.stringify({ spec: full, createdAt } satisfies PersistedInstance),
      );
      await this.startContainer(
        dir,
        runscRestoreCommand(this.cfg.runscBinary, this.globalArgs(id), dir, snapshot.path, id),
      );
      await waitForHealth(full.network.sandboxAddress, this.cfg.healthTimeoutMs, async () => {
        const status = await this.runscStatus(id);
        return status === 'running' || status === 'created';
      });
    } catch (err) {
      const diag = await this.diagnostics(dir);
      const left = await undo.unwind();
      if (left.length) this.cfg.log?.('cleanup after failed restore failed', { id, left });
      throw new SpaceError(
        'DRIVER_FAILED',
        `gvisor restore ${id} from ${snapshot.path} failed: ${(err as Error).message}${diag ? `\n${diag}` : ''}`,
        { instanceId: id, snapshot: snapshot.path },
        { cause: err },
      );
    }
    this.cfg.log?.('instance restored', { id, from: snapshot.instanceId, ms: Date.now() - createdAt });
    return instanceInfo({ spec: full, createdAt, ...(await this.sandboxPid(id)) }, 'running');
  }

  /**
   * Re-attaches to a listed instance (gVisor keeps no connection: knowing it runs is enough).
   * @throws SpaceError INSTANCE_LOST when runsc no longer knows it and its guest does not answer.
   */
  async adopt(instanceId: string): Promise<InstanceInfo> {
    // this instance's record and state only: the agent calls this once per sandbox after a list()
    const persisted = await this.readPersisted(instanceId);
    if (!persisted) throw new SpaceError('INSTANCE_LOST', `instance ${instanceId} is gone`, { instanceId });
    const info = instanceInfo(
      { ...persisted, ...(await this.sandboxPid(instanceId)) },
      mapRunscStatus(await this.runscStatus(instanceId)),
    );
    return info;
  }

  /** Why the instance ended, from its host cgroup counters ({@link instanceEndCause}). */
  endCause(instanceId: string): Promise<InstanceEndCause | undefined> {
    return instanceEndCause(instanceId);
  }

  /** The host memory charge a process kill can free ({@link instanceMemoryCharge}). */
  memoryCharge(instanceId: string): number | undefined {
    return instanceMemoryCharge(instanceId);
  }

  /** Memory charged to the instance's cgroup (v1 `memory.usage_in_bytes`). @throws DRIVER_FAILED. */
  async stats(instanceId: string): Promise<InstanceStats> {
    const text = await readFile(cgroupV1File('memory', instanceId, 'memory.usage_in_bytes'), 'utf8').catch(
      (err: unknown) => {
        throw new SpaceError(
          'DRIVER_FAILED',
          `no memory cgroup for ${instanceId}`,
          { instanceId },
          { cause: err },
        );
      },
    );
    return { memoryBytes: Number(text.trim()) };
  }

  /** Freezes the sandbox (`runsc pause`). @throws DRIVER_FAILED. */
  async pause(instanceId: string): Promise<void> {
    await this.runsc(['pause'], instanceId);
  }

  /** Thaws the sandbox (`runsc resume`). @throws DRIVER_FAILED. */
  async resume(instanceId: string): Promise<void> {
    await this.runsc(['resume'], instanceId);
  }

  /**
   * Writes a snapshot of the instance into `dir` (created; must not exist): the sandbox is paused (if
   * running), `runsc checkpoint --leave-running` writes checkpoint.img, the disk is flushed and copied
   * to disk.img, and the sandbox is resumed (a paused one stays paused). Connected TCP endpoints in the
   * sandbox are reset by the checkpoint (`--net-disconnect-ok`): callers should expect their keep-alive
   * connections to the guest to be gone. Takes ~0.5–1 s for an idle sandbox (mostly the checkpoint).
   * @returns the {@link SnapshotRef}, also written to `dir/snapshot.json` (mode 0600).
   * @throws SpaceError DRIVER_FAILED when the instance is unknown or not live, or a step fails;
   *   SNAPSHOT_UNSUPPORTED when runsc refuses to save the sandbox's state (message: runsc's reason).
   *   On failure `dir` is removed and the instance is left in the state it was in.
   */
  async snapshot(instanceId: string, dir: string): Promise<SnapshotRef> {
    const persisted = await this.readPersisted(instanceId);
    const status = await this.runscStatus(instanceId);
    const state = mapRunscStatus(status);
    if (!persisted || state === 'stopped') {
      throw new SpaceError('DRIVER_FAILED', `instance ${instanceId} is not live (${status ?? 'unknown'})`, {
        instanceId,
      });
    }
    if (existsSync(dir)) throw new SpaceError('DRIVER_FAILED', `${dir} already exists`, { instanceId });
    const { spec } = persisted;
    await mkdir(dir, { recursive: true, mode: 0o700 });
    const wasRunning = state === 'running';
    try {
      if (wasRunning) await this.pause(instanceId);
      try {
        await run(
          this.cfg.runscBinary,
          runscCheckpointArgs(this.globalArgs(instanceId), instanceId, dir, this.cfg.checkpointCompression),
          { timeout: 120_000, maxBuffer: 16 * 1024 * 1024 },
        ).catch((err: { stderr?: string; message: string }) => {
          const reason = checkpointFailureReason(err.stderr || err.message);
          throw /save rejected/.test(reason)
            ? new SpaceError('SNAPSHOT_UNSUPPORTED', `runsc checkpoint: ${reason}`, { instanceId })
            : new Error(`runsc checkpoint: ${reason}`);
        });
        // the sandbox is paused: flush its disk's filesystem into disk.img, then copy it
        const instDir = this.instanceDir(instanceId);
        await sh('sync', ['-f', join(instDir, 'disk')]);
        await sh('cp', ['--sparse=always', join(instDir, 'disk.img'), join(dir, 'disk.img')]);
      } finally {
        if (wasRunning) await this.resume(instanceId);
      }
      const ref: SnapshotRef = {
        driver: 'gvisor',
        instanceId,
        template: spec.template,
        imageDigest: spec.image.digest,
        path: dir,
        vcpus: spec.vcpus,
        memoryMiB: spec.memoryMiB,
        diskMiB: spec.diskMiB,
        guestToken: spec.guestToken,
        createdAt: Date.now(),
      };
      await writeFileAtomic(join(dir, 'snapshot.json'), JSON.stringify(ref));
      return ref;
    } catch (err) {
      await rm(dir, { recursive: true, force: true }).catch(() => {});
      if (err instanceof SpaceError) throw err;
      throw new SpaceError(
        'DRIVER_FAILED',
        `gvisor snapshot ${instanceId}: ${(err as Error).message}`,
        { instanceId },
        { cause: err },
      );
    }
  }

  /**
   * Kills and deletes the container, unmounts the overlay, removes the instance dir and its cgroups.
   * Idempotent. @throws DRIVER_FAILED only when the overlay cannot be unmounted or the dir removed.
   */
  async destroy(instanceId: string): Promise<void> {
    const dir = this.instanceDir(instanceId);
    const g = this.globalArgs(instanceId);
    const ms: Record<string, number> = {};
    let t = Date.now();
    const step = (name: string) => {
      ms[name] = Date.now() - t;
      t = Date.now();
    };
    // `delete --force` SIGKILLs the sandbox process from the host, paused or not, and waits until
    // it is gone: no `runsc kill` or thaw first (each one more runsc process, ~30 ms of CPU)
    await run(this.cfg.runscBinary, runscCmdArgs(g, ['delete', '--force'], instanceId)).catch(() => {});
    step('delete');
    await unmountIfMounted(join(dir, 'rootfs'));
    await unmountIfMounted(join(dir, 'disk')); // the loop device is freed with it (autoclear)
    step('unmount');
    await rm(dir, { recursive: true, force: true }).catch((err) => {
      throw new SpaceError('DRIVER_FAILED', `cannot remove ${dir}: ${err}`, { instanceId }, { cause: err });
    });
    await removeCgroups(instanceId);
    step('remove');
    // step timings (ms): where a slow destroy spends its time
    this.cfg.log?.('instance destroyed', { id: instanceId, ms });
  }

  /**
   * Instances found in `<stateDir>/instances/*\/instance.json`, with their state from `runsc state`
   * (`stopped` when runsc no longer knows the container).
   */
  async list(): Promise<InstanceInfo[]> {
    const ids = await readdir(join(this.cfg.stateDir, 'instances')).catch(() => [] as string[]);
    // one `runsc list` for every container (the watchdog calls this every few seconds); one
    // `runsc state` per instance only when the list itself fails
    const statuses = await this.runscStatuses();
    const out: InstanceInfo[] = [];
    for (const id of ids) {
      const persisted = await this.readPersisted(id);
      if (!persisted) continue;
      const status = statuses ? statuses.get(id) : await this.runscStatus(id);
      out.push(instanceInfo(persisted, mapRunscStatus(status)));
    }
    return out;
  }

  /** runsc's status string for a container, or undefined when unknown. */
  /** Status of every container under the runsc root (`runsc list`), or null when runsc fails. */
  async runscStatuses(): Promise<Map<string, string> | null> {
    try {
      const { stdout } = await run(this.cfg.runscBinary, [
        `--root=${this.cfg.runscRoot}`,
        'list',
        '--format=json',
      ]);
      const states = (JSON.parse(stdout) as { id: string; status: string }[] | null) ?? [];
      return new Map(states.map((st) => [st.id, st.status]));
    } catch {
      return null;
    }
  }

  async runscStatus(instanceId: string): Promise<string | undefined> {
    try {
      const { stdout } = await run(
        this.cfg.runscBinary,
        runscCmdArgs([`--root=${this.cfg.runscRoot}`], ['state'], instanceId),
      );
      return (JSON.parse(stdout) as { status?: string }).status;
    } catch {
      return undefined;
    }
  }

  private globalArgs(instanceId: string): string[] {
    return runscGlobalArgs({
      root: this.cfg.runscRoot,
      platform: this.cfg.platform,
      debugLogDir: join(this.instanceDir(instanceId), 'logs'),
      debug: this.cfg.debug,
    });
  }

  /**
   * Overlay mount + mount points + config.json in `dir`. With `fromDisk` (a snapshot's disk.img) the
   * disk is a copy of it and the rootfs is left exactly as the snapshot had it (token, resolv.conf).
   */
  private async prepareBundle(spec: InstanceSpec, dir: string, fromDisk?: string): Promise<void> {
    // The writable layer lives on a filesystem of its own, an ext4 image of spec.diskMiB: a sandbox
    // that fills its disk gets ENOSPC instead of filling the host's.
    const disk = join(dir, 'disk');
    const image = join(dir, 'disk.img');
    await Promise.all(
      [disk, join(dir, 'logs'), this.cfg.runscRoot].map((d) => mkdir(d, { recursive: true })),
    );
    if (fromDisk) {
      await sh('cp', ['--sparse=always', fromDisk, image]);
    } else {
      await sh('truncate', ['-s', `${spec.diskMiB}M`, image]);
      await sh('mkfs.ext4', ['-q', '-F', '-O', '^has_journal', '-E', 'lazy_itable_init=1', image]);
    }
    await sh('mount', ['-o', 'loop,nodev,nosuid', image, disk]);
    const [upper, work, rootfs] = [join(disk, 'upper'), join(disk, 'work'), join(dir, 'rootfs')];
    await Promise.all([upper, work, rootfs].map((d) => mkdir(d, { recursive: true })));
    await sh('mount', [
      '-t',
      'overlay',
      'overlay',
      '-o',
      overlayOptions(spec.image.lowerDirs, upper, work),
      rootfs,
    ]);
    if (!fromDisk) await this.seedRootfs(spec, rootfs);
    const oci = buildOciSpec({
      spec,
      rootPath: rootfs,
      guestArgv: this.cfg.guestArgv,
    });
    await writeFile(join(dir, 'config.json'), JSON.stringify(oci, null, 2));
  }

  /** Writes the guest token and resolv.conf into a fresh rootfs (the trusted CA is in the image). */
  private async seedRootfs(spec: InstanceSpec, rootfs: string): Promise<void> {
    // the guest daemon's secret: a root-only file on the sandbox's own disk, deleted once read
    // (see runtime/guest/main.ts)
    await writeFile(join(rootfs, GUEST_PATHS.token.slice(1)), spec.guestToken, { mode: 0o400 });
    // DNS goes to the host end (nftables hands it to the node's gateway whatever address is used)
    await writeFile(join(rootfs, 'etc/resolv.conf'), `nameserver ${spec.network.hostAddress}\n`);
  }

  /**
   * `{ pid }` of the instance's runsc sandbox process as runsc wrote it at start (`--pid-file`), or
   * `{}` when it wrote none (an instance started by an older agent).
   */
  private async sandboxPid(instanceId: string): Promise<{ pid?: number }> {
    const text = await readFile(join(this.instanceDir(instanceId), SANDBOX_PID_FILE), 'utf8').catch(() => '');
    const pid = Number.parseInt(text.trim(), 10);
    return Number.isSafeInteger(pid) && pid > 1 ? { pid } : {};
  }

  /**
   * instance.json of an instance, or undefined when it has none or it is unreadable (then it is
   * quarantined and logged: one torn file never stops the agent from listing the rest).
   */
  private async readPersisted(instanceId: string): Promise<PersistedInstance | undefined> {
    const r = await readJsonFile<PersistedInstance>(
      join(this.instanceDir(instanceId), 'instance.json'),
    ).catch(() => null);
    if (r && !r.ok && !r.missing)
      this.cfg.log?.('unreadable instance.json quarantined', { id: instanceId, reason: r.reason });
    return r?.ok ? r.value : undefined;
  }

  /**
   * Runs a detaching runsc start command (`run`/`restore`, see {@link runscStartCommand}) with the
   * guest's stdio going to `dir/console.log`. Rejects when it exits non-zero.
   */
  private async startContainer(dir: string, command: { cmd: string; args: string[] }): Promise<void> {
    const { cmd, args } = command;
    await hostExec(cmd, args, { outputFile: join(dir, 'console.log') }).catch((err: { code?: unknown }) => {
      throw new Error(`runsc ${args.includes('restore') ? 'restore' : 'run'} exited with ${err.code}`);
    });
  }

  private async runsc(cmd: string[], instanceId: string): Promise<void> {
    try {
      await run(this.cfg.runscBinary, runscCmdArgs(this.globalArgs(instanceId), cmd, instanceId), {
        timeout: 30_000,
      });
    } catch (err) {
      const e = err as { stderr?: string; message: string };
      throw new SpaceError(
        'DRIVER_FAILED',
        `runsc ${cmd.join(' ')} ${instanceId}: ${(e.stderr || e.message).trim()}`,
        {
          instanceId,
        },
        { cause: err },
      );
    }
  }

  /** Tail of console.log and the runsc logs of an instance dir, for error messages. */
  private async diagnostics(dir: string): Promise<string> {
    const parts: string[] = [];
    const tail = async (path: string, label: string) => {
      const text = await readFile(path, 'utf8').catch(() => '');
      if (text.trim()) parts.push(`--- ${label} ---\n${text.trim().split('\n').slice(-15).join('\n')}`);
    };
    await tail(join(dir, 'console.log'), 'guest console');
    for (const f of (await readdir(join(dir, 'logs')).catch(() => [] as string[])).sort()) {
      await tail(join(dir, 'logs', f), f);
    }
    return parts.join('\n');
  }
}
