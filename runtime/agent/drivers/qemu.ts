/**
 * The QEMU driver: one `qemu-system-x86_64 -M microvm` per instance, under KVM when it is usable
 * (see `kvm.ts`) and software emulation (TCG, `-cpu max`) otherwise, so CI boots the same VM a
 * KVM node does. The VMM runs inside the sandbox's network namespace (`nsenter --net=…`) on the tap
 * made by `SandboxNetworks.attachTap`; the guest always has the fixed addresses of `GUEST_NET` and the
 * namespace translates them to the sandbox's own. Control is QMP over a Unix socket per instance.
 *
 * Disks (virtio-blk over virtio-mmio; the kernel finds them through microvm's ACPI tables):
 * `/dev/vda` the template image (read-only, shared by every instance), `/dev/vdb` the instance's own
 * disk from `makeInstanceDisk` (overlay upper/work, the guest token). The initrd from `vm-image.ts`
 * stacks them and starts the guest daemon.
 *
 * Per instance, under `<stateDir>/instances/<id>/`:
 * ```
 * instance.json  {@link PersistedQemuInstance}, for list/adopt after an agent restart
 * disk.img       the instance's writable disk
 * qmp.sock       QMP socket
 * qemu.pid       VMM pid (QEMU daemonizes: it outlives the agent)
 * console.log    guest serial console (kernel + init + guest daemon output)
 * ```
 * A snapshot directory holds `memory.bin` (QMP `migrate` to a file, taken while paused), `disk.img`
 * (copy of the instance disk taken while paused) and `snapshot.json` (mode 0600, a
 * {@link SnapshotRef}); a restore starts a new VMM with `-incoming defer` on a copy of that disk.
 */
import { existsSync } from 'node:fs';
import { chmod, mkdir, readdir, readFile, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { SpaceError } from '../../core/errors.ts';
import { hostExec } from '../host/host-exec.ts';
import type { KvmBootTest } from '../host/kvm.ts';
import { findGuestKernel } from '../image/guest-kernel.ts';
import { BOOT_MARKER, guestInitrd, shQuote } from '../image/vm-image.ts';
import {
  CleanupStack,
  type Driver,
  type DriverCapabilities,
  GUEST_NET,
  INSTANCE_ID_RE,
  type InstanceInfo,
  type InstanceSpec,
  type InstanceStats,
  instanceInfo,
  type RestoreSpec,
  type SnapshotRef,
} from './driver.ts';
import { waitForHealth } from './guest-health.ts';
import { type Qmp, withQmp } from './qmp.ts';
import { makeInstanceDisk, vmKernelCmdline } from './vm-common.ts';

const run = hostExec;

/** Configuration of {@link QemuDriver}. */
export interface QemuConfig {
  /** Driver state root (instances). */
  stateDir: string;
  /** QEMU binary (default `qemu-system-x86_64`). */
  qemuBinary?: string;
  /** Use KVM (`accel=kvm`, `-cpu host`); default false: TCG with `-cpu max`. */
  kvm?: boolean;
  /** How long create()/restore() wait for the guest's /health, ms (default 30 000 with KVM, 180 000 without). */
  healthTimeoutMs?: number;
  log?: (msg: string, fields?: Record<string, unknown>) => void;
}

/** What instance.json holds. */
export interface PersistedQemuInstance {
  spec: InstanceSpec;
  /** Epoch ms of create/restore. */
  createdAt: number;
  /** Snapshot directory it was restored from, when it was. */
  restoredFrom?: string;
}

import { readJsonFile, writeFileAtomic } from '../host/durable-file.ts';
// its command lines live in qemu-argv.ts; re-exported for callers
import { cpuinfo, guestClockArgs, inNetns, mapQmpStatus, qemuArgv, SNAPSHOT_FILES } from './qemu-argv.ts';

/** QEMU microvm implementation of {@link Driver}. */
export class QemuDriver implements Driver {
  readonly name = 'qemu' as const;
  readonly capabilities: DriverCapabilities = {
    pause: true,
    snapshot: true,
    restore: true,
    memoryStats: true,
    balloon: false,
    guestLinks: ['tcp'],
    network: 'tap',
    rootfs: 'ext4',
    ownKernel: true,
  };
  private readonly cfg: Required<Omit<QemuConfig, 'log'>> & Pick<QemuConfig, 'log'>;
  /** Per-instance operation chain: QMP takes one client at a time. */
  private readonly chains = new Map<string, Promise<unknown>>();

  constructor(config: QemuConfig) {
    this.cfg = {
      ...config,
      qemuBinary: config.qemuBinary ?? 'qemu-system-x86_64',
      kvm: config.kvm ?? false,
      healthTimeoutMs: config.healthTimeoutMs ?? (config.kvm ? 30_000 : 180_000),
    };
  }

  /** Checks root, QEMU, nsenter and mkfs.ext4. @throws SpaceError DRIVER_FAILED listing what is missing. */
  async preflight(): Promise<void> {
    const missing: string[] = [];
    if (process.getuid?.() !== 0) missing.push('must run as root');
    await run(this.cfg.qemuBinary, ['--version']).catch(() =>
      missing.push(`${this.cfg.qemuBinary} (apt: qemu-system-x86)`),
    );
    await run('nsenter', ['--version']).catch(() => missing.push('nsenter (apt: util-linux)'));
    await run('mkfs.ext4', ['-V']).catch(() => missing.push('mkfs.ext4 (apt: e2fsprogs)'));
    if (!existsSync('/dev/net/tun')) missing.push('/dev/net/tun (tun module)');
    if (this.cfg.kvm && !existsSync('/dev/kvm')) missing.push('/dev/kvm (KVM requested)');
    if (missing.length) {
      throw new SpaceError('DRIVER_FAILED', `qemu preflight failed: ${missing.join('; ')}`, { missing });
    }
  }

  /** `<stateDir>/instances/<id>`. */
  instanceDir(id: string): string {
    return join(this.cfg.stateDir, 'instances', id);
  }

  /**
   * Makes the instance disk, starts the VMM in the sandbox's namespace and waits for the guest's
   * /health at the sandbox address.
   * @throws SpaceError DRIVER_FAILED (everything it made is removed; the message has the console tail).
   */
  async create(spec: InstanceSpec): Promise<InstanceInfo> {
    const { dir, undo } = await this.begin(spec);
    const createdAt = Date.now();
    try {
      await makeInstanceDisk(join(dir, 'disk.img'), spec.diskMiB, spec.guestToken);
      await this.persist(dir, { spec, createdAt });
      await this.launch(spec, dir, false);
      await this.waitReady(spec);
    } catch (err) {
      throw await this.failed('create', spec.instanceId, dir, undo, err);
    }
    undo.release();
    this.cfg.log?.('instance created', { id: spec.instanceId, ms: Date.now() - createdAt });
    return this.info({ spec, createdAt }, 'running');
  }

  /**
   * Starts a new VMM with the snapshot's shape on a copy of its disk, loads its memory (`-incoming
   * defer` + `migrate-incoming`), continues it and waits for /health on the new network.
   * @throws SpaceError SNAPSHOT_UNSUPPORTED (not a qemu snapshot, or taken from another image),
   *   DRIVER_FAILED (everything it made is removed).
   */
  async restore(snapshot: SnapshotRef, spec: RestoreSpec): Promise<InstanceInfo> {
    if (snapshot.driver !== 'qemu' || snapshot.imageDigest !== spec.image.digest) {
      throw new SpaceError(
        'SNAPSHOT_UNSUPPORTED',
        snapshot.driver !== 'qemu'
          ? `a ${snapshot.driver} snapshot cannot be restored by the qemu driver`
          : `snapshot ${snapshot.path} was taken from image ${snapshot.imageDigest}, not ${spec.image.digest}`,
        { instanceId: spec.instanceId, snapshot: snapshot.path },
      );
    }
    const full: InstanceSpec = {
      ...spec,
      vcpus: snapshot.vcpus,
      memoryMiB: snapshot.memoryMiB,
      diskMiB: snapshot.diskMiB,
      // recorded for adopt and returned; the guest holds the snapshot's until the caller rotates it
      guestToken: spec.guestToken,
    };
    const { dir, undo } = await this.begin(full);
    const createdAt = Date.now();
    try {
      await run('cp', [
        '--sparse=always',
        '--reflink=auto',
        join(snapshot.path, SNAPSHOT_FILES.disk),
        join(dir, 'disk.img'),
      ]);
      await this.persist(dir, { spec: full, createdAt, restoredFrom: snapshot.path });
      await this.launch(full, dir, true);
      await withQmp(join(dir, 'qmp.sock'), async (q) => {
        await q.execute('migrate-incoming', {
          uri: `exec:cat ${shQuote(join(snapshot.path, SNAPSHOT_FILES.memory))}`,
        });
        await waitMigration(q, 'restore', 300_000);
        await q.execute('cont');
      });
      await this.waitReady(full);
    } catch (err) {
      throw await this.failed('restore', spec.instanceId, dir, undo, err);
    }
    undo.release();
    this.cfg.log?.('instance restored', {
      id: spec.instanceId,
      from: snapshot.path,
      ms: Date.now() - createdAt,
    });
    return this.info({ spec: full, createdAt }, 'running');
  }

  /** QMP `stop`: the vCPUs halt; the guest stops answering. @throws DRIVER_FAILED / INSTANCE_LOST. */
  async pause(instanceId: string): Promise<void> {
    await this.qmp(instanceId, (q) => q.execute('stop'));
  }

  /** QMP `cont` (also after a snapshot left the VM in `postmigrate`). @throws DRIVER_FAILED / INSTANCE_LOST. */
  async resume(instanceId: string): Promise<void> {
    await this.qmp(instanceId, (q) => q.execute('cont'));
  }

  /**
   * Pauses (if running), writes guest memory with QMP `migrate` to `<dir>/memory.bin`, copies the
   * instance disk to `<dir>/disk.img`, writes `<dir>/snapshot.json` (0600), and resumes when it was
   * running. `dir` is created (0700) and must not hold another snapshot.
   * @throws SpaceError DRIVER_FAILED (the instance is resumed if it was running), INSTANCE_LOST.
   */
  async snapshot(instanceId: string, dir: string): Promise<SnapshotRef> {
    const p = await this.load(instanceId);
    await mkdir(dir, { recursive: true, mode: 0o700 });
    const started = Date.now();
    await this.qmp(instanceId, async (q) => {
      const { status } = await q.execute<{ status: string }>('query-status');
      const wasRunning = status === 'running';
      if (wasRunning) await q.execute('stop');
      try {
        // no bandwidth cap: the guest is stopped, the file is local
        await q.execute('migrate-set-parameters', { 'max-bandwidth': 64 * 2 ** 30 });
        await q.execute('migrate', { uri: `exec:cat > ${shQuote(join(dir, SNAPSHOT_FILES.memory))}` });
        await waitMigration(q, 'snapshot', 300_000);
        // the migration flushed the disk and the VM is still stopped: the copy is consistent
        await run('cp', [
          '--sparse=always',
          '--reflink=auto',
          join(this.instanceDir(instanceId), 'disk.img'),
          join(dir, SNAPSHOT_FILES.disk),
        ]);
      } finally {
        if (wasRunning) await q.execute('cont');
      }
    });
    const ref: SnapshotRef = {
      driver: 'qemu',
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
    await writeFileAtomic(join(dir, SNAPSHOT_FILES.ref), JSON.stringify(ref));
    await chmod(join(dir, SNAPSHOT_FILES.memory), 0o600);
    this.cfg.log?.('snapshot written', { id: instanceId, dir, ms: Date.now() - started });
    return ref;
  }

  /** Kills the VMM (SIGKILL, waits until it is gone) and removes the instance directory. Idempotent. */
  async destroy(instanceId: string): Promise<void> {
    const dir = this.instanceDir(instanceId);
    await this.kill(instanceId);
    await rm(dir, { recursive: true, force: true }).catch((err) => {
      throw new SpaceError('DRIVER_FAILED', `cannot remove ${dir}: ${err}`, { instanceId }, { cause: err });
    });
    this.chains.delete(instanceId);
    this.cfg.log?.('instance destroyed', { id: instanceId });
  }

  /**
   * Instances with an `instance.json`; state from the VMM: `stopped` when its process is gone,
   * else QMP `query-status` (`running`, or `paused` for stop/postmigrate/…).
   */
  async list(): Promise<InstanceInfo[]> {
    const ids = await readdir(join(this.cfg.stateDir, 'instances')).catch(() => [] as string[]);
    const out: InstanceInfo[] = [];
    for (const id of ids) {
      const p = await this.load(id).catch(() => undefined);
      if (!p) continue;
      out.push(this.info(p, await this.state(id)));
    }
    return out;
  }

  /**
   * Re-attaches to a running VMM: its process must be alive and its QMP socket must answer.
   * @throws SpaceError INSTANCE_LOST when either is gone.
   */
  async adopt(instanceId: string): Promise<InstanceInfo> {
    const p = await this.load(instanceId).catch(() => undefined);
    const state = p ? await this.state(instanceId) : 'stopped';
    if (!p || state === 'stopped') {
      throw new SpaceError('INSTANCE_LOST', `instance ${instanceId}: its VMM is gone`, { instanceId });
    }
    return this.info(p, state);
  }

  /** Resident memory of the VMM process (guest RAM it touched + QEMU itself). @throws INSTANCE_LOST. */
  async stats(instanceId: string): Promise<InstanceStats> {
    const pid = await this.livePid(instanceId);
    const status = pid ? await readFile(`/proc/${pid}/status`, 'utf8').catch(() => '') : '';
    const kb = /^VmRSS:\s+(\d+)\s+kB/m.exec(status)?.[1];
    if (!kb) throw new SpaceError('INSTANCE_LOST', `instance ${instanceId}: its VMM is gone`, { instanceId });
    return { memoryBytes: Number(kb) * 1024 };
  }

  /** Pid of the instance's VMM when it is alive (not a zombie, and its argv names the instance dir). */
  async livePid(instanceId: string): Promise<number | undefined> {
    const dir = this.instanceDir(instanceId);
    const pid = Number((await readFile(join(dir, 'qemu.pid'), 'utf8').catch(() => '')).trim());
    if (!Number.isInteger(pid) || pid <= 0) return undefined;
    const stat = await readFile(`/proc/${pid}/stat`, 'utf8').catch(() => '');
    if (!stat || / Z /.test(stat.slice(stat.lastIndexOf(')')))) return undefined;
    const cmdline = await readFile(`/proc/${pid}/cmdline`, 'utf8').catch(() => '');
    return cmdline.includes(join(dir, 'qmp.sock')) ? pid : undefined;
  }

  // ---- internals ----

  private async begin(spec: InstanceSpec): Promise<{ dir: string; undo: CleanupStack }> {
    const id = spec.instanceId;
    if (!INSTANCE_ID_RE.test(id))
      throw new SpaceError('DRIVER_FAILED', `bad instance id ${id}`, { instanceId: id });
    if (!spec.image.rootfsImage || !spec.image.kernel) {
      throw new SpaceError(
        'DRIVER_FAILED',
        `image of ${spec.template} has no ext4 rootfs or kernel (vm-image.ts)`,
        {
          instanceId: id,
        },
      );
    }
    if (!spec.network.tap) {
      throw new SpaceError('DRIVER_FAILED', `network ${spec.network.netns} has no tap (attachTap first)`, {
        instanceId: id,
      });
    }
    const dir = this.instanceDir(id);
    if (existsSync(dir))
      throw new SpaceError('DRIVER_FAILED', `instance ${id} already exists`, { instanceId: id });
    await mkdir(dir, { recursive: true, mode: 0o700 });
    const undo = new CleanupStack();
    undo.push('instance dir', () => rm(dir, { recursive: true, force: true }));
    undo.push('vmm', () => this.kill(id));
    return { dir, undo };
  }

  private async persist(dir: string, p: PersistedQemuInstance): Promise<void> {
    await writeFileAtomic(join(dir, 'instance.json'), JSON.stringify(p));
  }

  private async load(instanceId: string): Promise<PersistedQemuInstance> {
    const r = await readJsonFile<PersistedQemuInstance>(
      join(this.instanceDir(instanceId), 'instance.json'),
    ).catch((err: unknown) => ({
      ok: false as const,
      missing: false as const,
      quarantined: null,
      reason: String(err),
    }));
    if (!r.ok)
      throw new SpaceError('INSTANCE_LOST', `instance ${instanceId} is unknown`, {
        instanceId,
        ...(r.missing ? {} : { reason: r.reason }),
      });
    return r.value;
  }

  /** Starts the daemonized VMM in the sandbox's namespace; resolves once QEMU is up (QMP listening). */
  private async launch(spec: InstanceSpec, dir: string, incoming: boolean): Promise<void> {
    const argv = qemuArgv({
      name: spec.instanceId,
      kvm: this.cfg.kvm,
      vcpus: spec.vcpus,
      memoryMiB: spec.memoryMiB,
      kernel: spec.image.kernel!.bzImage,
      initrd: spec.image.kernel!.initrd,
      cmdline: vmKernelCmdline(guestClockArgs(this.cfg.kvm, await cpuinfo())),
      rootfsImage: spec.image.rootfsImage,
      disk: join(dir, 'disk.img'),
      tap: { name: spec.network.tap!.name, mac: spec.network.tap!.guestMac },
      qmpSocket: join(dir, 'qmp.sock'),
      console: join(dir, 'console.log'),
      pidFile: join(dir, 'qemu.pid'),
      incoming,
    });
    const { cmd, args } = inNetns(spec.network.netns, this.cfg.qemuBinary, argv);
    try {
      await run(cmd, args, { timeout: 30_000 });
    } catch (err) {
      const e = err as { stderr?: string; message: string };
      throw new Error(`qemu did not start: ${(e.stderr || e.message).trim()}`);
    }
  }

  private async waitReady(spec: InstanceSpec): Promise<void> {
    await waitForHealth(spec.network.sandboxAddress, this.cfg.healthTimeoutMs, async () =>
      Boolean(await this.livePid(spec.instanceId)),
    );
  }

  private async failed(
    what: string,
    id: string,
    dir: string,
    undo: CleanupStack,
    err: unknown,
  ): Promise<SpaceError> {
    const tail = await consoleTail(join(dir, 'console.log'));
    const left = await undo.unwind();
    if (left.length) this.cfg.log?.(`cleanup after failed ${what} failed`, { id, left });
    if (err instanceof SpaceError && err.code !== 'DRIVER_FAILED') return err;
    return new SpaceError(
      'DRIVER_FAILED',
      `qemu ${what} ${id} failed: ${(err as Error).message}${tail ? `\n--- guest console ---\n${tail}` : ''}`,
      { instanceId: id },
      { cause: err },
    );
  }

  /** `running`/`paused` from QMP, `stopped` when the VMM is gone or QMP does not answer. */
  private async state(instanceId: string): Promise<InstanceInfo['state']> {
    if (!(await this.livePid(instanceId))) return 'stopped';
    try {
      const s = await this.qmp(instanceId, (q) =>
        q.execute<{ status: string }>('query-status', undefined, 5000),
      );
      return mapQmpStatus(s.status);
    } catch {
      return 'stopped';
    }
  }

  /** Runs `fn` on a fresh QMP connection, one at a time per instance. @throws DRIVER_FAILED / INSTANCE_LOST. */
  private qmp<T>(instanceId: string, fn: (q: Qmp) => Promise<T>): Promise<T> {
    const prev = this.chains.get(instanceId) ?? Promise.resolve();
    const next = prev
      .catch(() => {})
      .then(async () => {
        const sock = join(this.instanceDir(instanceId), 'qmp.sock');
        if (!(await this.livePid(instanceId))) {
          throw new SpaceError('INSTANCE_LOST', `instance ${instanceId}: its VMM is gone`, { instanceId });
        }
        try {
          return await withQmp(sock, fn);
        } catch (err) {
          throw new SpaceError(
            'DRIVER_FAILED',
            `qemu ${instanceId}: ${(err as Error).message}`,
            { instanceId },
            { cause: err },
          );
        }
      });
    this.chains.set(instanceId, next);
    return next;
  }

  /** SIGKILLs the VMM and waits (≤ 5 s) until its process is gone. No-op when it is not running. */
  private async kill(instanceId: string): Promise<void> {
    const pid = await this.livePid(instanceId);
    if (!pid) return;
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      return;
    }
    for (let i = 0; i < 100 && (await this.livePid(instanceId)); i++)
      await new Promise((r) => setTimeout(r, 50));
  }

  /** QEMU runs whole vCPUs: a fraction asked of the seam rounds up. */
  private info(p: PersistedQemuInstance, state: InstanceInfo['state']): InstanceInfo {
    return instanceInfo(p, state, Math.max(1, Math.ceil(p.spec.vcpus)));
  }
}

/**
 * Polls QMP `query-migrate` every 20 ms until `completed`.
 * @throws Error when it fails, is cancelled, or exceeds `timeoutMs`.
 */
async function waitMigration(q: Qmp, what: string, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const m = await q.execute<{ status?: string; 'error-desc'?: string }>('query-migrate');
    if (m.status === 'completed') return;
    if (m.status === 'failed' || m.status === 'cancelled')
      throw new Error(`${what}: migration ${m.status}${m['error-desc'] ? `: ${m['error-desc']}` : ''}`);
    if (Date.now() > deadline) throw new Error(`${what}: migration still ${m.status} after ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** Result of {@link probeBoot}. */
export interface ProbeBootResult {
  ok: boolean;
  /** Wall time from spawn until QEMU exited after the marker (includes the guest's reboot), or to the failure, ms. */
  ms: number;
  /** Tail of the console output. */
  output: string;
}

/**
 * Boots kernel + initrd to the init's probe marker ({@link BOOT_MARKER}) and waits for QEMU to exit:
 * `early` right after init starts (no devices: the KVM boot test), `late` after the root filesystem
 * and network are up (disks and tap needed: the benchmark floor). Kills QEMU after `timeoutMs`.
 * Never throws: failures come back as `ok: false` with the console tail.
 */
export async function probeBoot(o: {
  binary?: string;
  kvm: boolean;
  kernel: string;
  initrd: string;
  probe: 'early' | 'late';
  timeoutMs: number;
  memoryMiB?: number;
  rootfsImage?: string;
  disk?: string;
  /** Namespace holding `GUEST_NET.tapName` (needed for `late`). */
  netns?: string;
}): Promise<ProbeBootResult> {
  const argv = qemuArgv({
    name: 'space-probe',
    kvm: o.kvm,
    vcpus: 1,
    memoryMiB: o.memoryMiB ?? 256,
    kernel: o.kernel,
    initrd: o.initrd,
    cmdline: vmKernelCmdline([...guestClockArgs(o.kvm, await cpuinfo()), `space.probe=${o.probe}`]),
    rootfsImage: o.rootfsImage,
    disk: o.disk,
    tap: o.netns ? { name: GUEST_NET.tapName, mac: GUEST_NET.guestMac } : undefined,
    console: 'stdio',
  });
  const { cmd, args } = o.netns
    ? inNetns(o.netns, o.binary ?? 'qemu-system-x86_64', argv)
    : { cmd: o.binary ?? 'qemu-system-x86_64', args: argv };
  const t = performance.now();
  try {
    const { stdout } = await run(cmd, args, { timeout: o.timeoutMs, killSignal: 'SIGKILL' });
    const ok = stdout.includes(BOOT_MARKER);
    return { ok, ms: performance.now() - t, output: stdout.trim().split('\n').slice(-10).join('\n') };
  } catch (err) {
    const e = err as { stdout?: string; stderr?: string; message: string; killed?: boolean };
    const why = e.killed ? `no marker within ${o.timeoutMs} ms` : (e.stderr || e.message).trim();
    return {
      ok: false,
      ms: performance.now() - t,
      output: `${why}\n${(e.stdout ?? '').trim().split('\n').slice(-10).join('\n')}`,
    };
  }
}

/**
 * The KVM boot test for `kvm.ts` (`setKvmBootTest`): boots the guest kernel and initrd from the
 * cache under `accel=kvm` to the early probe marker within `timeoutMs` (default 8 000; a KVM guest gets there in well under 1 s). Reports not
 * usable when QEMU or the kernel is missing (it cannot tell), never throws.
 */
export function qemuKvmBootTest(o: {
  cacheDir: string;
  /** The prepared guest kernel (guest-kernel.ts; the image's `guest-kernel/`). */
  kernelDir: string;
  qemuBinary?: string;
  timeoutMs?: number;
}): KvmBootTest {
  return async () => {
    try {
      await run(o.qemuBinary ?? 'qemu-system-x86_64', ['--version']);
    } catch {
      return {
        ok: false,
        detail: `cannot test: ${o.qemuBinary ?? 'qemu-system-x86_64'} is missing (apt: qemu-system-x86)`,
      };
    }
    try {
      const kernel = await findGuestKernel(o.kernelDir, o.cacheDir);
      const initrd = await guestInitrd(o.cacheDir, kernel, { progress: () => {} });
      const r = await probeBoot({
        binary: o.qemuBinary,
        kvm: true,
        kernel: kernel.bzImage,
        initrd,
        probe: 'early',
        timeoutMs: o.timeoutMs ?? 8_000,
      });
      return r.ok
        ? { ok: true, detail: `guest kernel ${kernel.version} booted in ${Math.round(r.ms)} ms` }
        : { ok: false, detail: `guest kernel ${kernel.version} under KVM: ${r.output.split('\n')[0]}` };
    } catch (err) {
      return { ok: false, detail: `cannot test: ${(err as Error).message}` };
    }
  };
}

/** Tail of a file (≤ 20 lines) for diagnostics; empty when unreadable. */
export async function consoleTail(path: string): Promise<string> {
  return (await readFile(path, 'utf8').catch(() => '')).trim().split('\n').slice(-20).join('\n');
}
