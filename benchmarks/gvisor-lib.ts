/**
 * Measures one gVisor platform on this node with the real driver and the real guest daemon: the
 * runsc floor, cold create, snapshot, snapshot-restore create, pause/resume and two in-sandbox loops.
 * Used by `benchmarks/gvisor-platforms.ts` (both platforms side by side) and by
 * `runtime/agent/drivers/gvisor.int.test.ts` (the default platform, printed with the tests).
 *
 * Needs root, runsc ≥ 2024-07-29 and a built template image. Sequential, one sandbox being measured
 * at a time (one more, the snapshot source, stays up); everything it makes is removed before it returns.
 */
import { execFile, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdir, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { promisify } from 'node:util';
import type {
  InstanceSpec,
  SandboxNetwork,
  SnapshotRef,
  TemplateImage,
} from '../runtime/agent/drivers/driver.ts';
import { waitForHealth } from '../runtime/agent/drivers/guest-health.ts';
import { GvisorDriver } from '../runtime/agent/drivers/gvisor.ts';
import { removeCgroups } from '../runtime/agent/drivers/gvisor-host.ts';
import { buildOciSpec, runscGlobalArgs, runscStartCommand } from '../runtime/agent/drivers/gvisor-runsc.ts';
import type { SandboxNetworks } from '../runtime/agent/host/network.ts';
import type { FloorInstances } from './density.ts';

const run = promisify(execFile);

/** Inputs of {@link measureGvisor}. */
export interface GvisorBenchOptions {
  platform: 'ptrace' | 'systrap';
  /** Samples per figure (≥ 1). */
  runs: number;
  /** Scratch directory (driver state, snapshots); made and removed by the call. */
  stateDir: string;
  image: TemplateImage;
  /** Networks come from here (allocated before each timed call, released after). */
  nets: SandboxNetworks;
  runscBinary?: string;
  /** Guest argv (default: the image's guest daemon). */
  guestArgv?: string[];
  /** Instance id prefix, `i-<prefix>…` (≤ 6 chars of [a-z0-9]). */
  idPrefix?: string;
  /** Run the in-sandbox syscall and spawn loops (default true; slow under ptrace). */
  loops?: boolean;
}

/** Raw samples of one platform, each in milliseconds (wall clock unless said otherwise). */
export interface GvisorFigures {
  platform: string;
  runs: number;
  /** `runsc do true` with `--network=none`: the runtime's own bare start and exit. */
  floor: number[];
  /** `driver.create` of a real guest daemon until /health answers (network made beforehand). */
  coldCreate: number[];
  /** `driver.snapshot` of a running, idle sandbox. */
  snapshot: number[];
  /** `driver.restore` from one snapshot until the guest answers /health at its new address. */
  restoreCreate: number[];
  /** `driver.pause`. */
  pause: number[];
  /** `driver.resume` until /health answers again. */
  resume: number[];
  /** Inside the sandbox: `dd bs=1 count=100000` from /dev/zero to /dev/null (200 000 syscalls). */
  syscallLoop: number[];
  /** Inside the sandbox: 100 sequential spawns of `/bin/true`. */
  spawnLoop: number[];
}

/** Median of a non-empty sample (mean of the middle two for even sizes); NaN when empty. Pure. */
export function median(xs: number[]): number {
  if (!xs.length) return Number.NaN;
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
}

/** Figure names in print order with their labels. */
export const FIGURE_LABELS: [keyof Omit<GvisorFigures, 'platform' | 'runs'>, string][] = [
  ['floor', 'runsc do true (floor)'],
  ['coldCreate', 'cold create'],
  ['snapshot', 'snapshot'],
  ['restoreCreate', 'snapshot-restore create'],
  ['pause', 'pause'],
  ['resume', 'resume (to /health)'],
  ['syscallLoop', 'syscall loop (dd 200k syscalls)'],
  ['spawnLoop', '100 × /bin/true spawns'],
];

/** A text table of medians (ms), one column per platform. Pure. */
export function formatFigures(all: GvisorFigures[]): string {
  const head = ['median ms', ...all.map((f) => `${f.platform} (n=${f.runs})`)];
  const rows = FIGURE_LABELS.map(([k, label]) => [label, ...all.map((f) => median(f[k]).toFixed(0))]);
  const width = head.map((_, i) => Math.max(...[head, ...rows].map((r) => r[i]!.length)));
  return [head, ...rows].map((r) => r.map((c, i) => c.padEnd(width[i]!)).join('  ')).join('\n');
}

/**
 * Measures `o.platform`. Throws whatever the driver throws (after cleaning up what it made).
 * @returns the raw samples (ms).
 */
export async function measureGvisor(o: GvisorBenchOptions): Promise<GvisorFigures> {
  const runsc = o.runscBinary ?? 'runsc';
  const driver = new GvisorDriver({
    stateDir: o.stateDir,
    platform: o.platform,
    runscBinary: runsc,
    guestArgv: o.guestArgv,
  });
  const f: GvisorFigures = {
    platform: o.platform,
    runs: o.runs,
    floor: [],
    coldCreate: [],
    snapshot: [],
    restoreCreate: [],
    pause: [],
    resume: [],
    syscallLoop: [],
    spawnLoop: [],
  };
  const live = new Map<string, SandboxNetwork>();
  let seq = 0;
  const prefix = o.idPrefix ?? o.platform.slice(0, 2);
  const newSpec = async (): Promise<InstanceSpec> => {
    const instanceId = `i-${prefix}${process.pid % 1000}${(seq++).toString(36)}`;
    const network = await o.nets.allocate(instanceId);
    live.set(instanceId, network);
    return {
      instanceId,
      template: o.image.template,
      image: o.image,
      vcpus: 1,
      memoryMiB: 512,
      diskMiB: 512,
      pidsLimit: 256,
      guestToken: randomBytes(16).toString('hex'),
      network,
    };
  };
  const drop = async (id: string): Promise<void> => {
    await driver.destroy(id).catch(() => {});
    const n = live.get(id);
    if (n) await o.nets.release(n).catch(() => {});
    live.delete(id);
  };
  const time = async (fn: () => Promise<unknown>): Promise<number> => {
    const t = performance.now();
    await fn();
    return performance.now() - t;
  };
  /** Runs `script` in the sandbox and returns the ms it printed (measured inside, by `date`). */
  const inside = async (id: string, script: string): Promise<number> => {
    const { stdout } = await run(runsc, [
      `--root=${join(o.stateDir, 'runsc')}`,
      'exec',
      id,
      '/bin/sh',
      '-c',
      `s=$(date +%s%N); ${script}; e=$(date +%s%N); echo $(( (e - s) / 1000000 ))`,
    ]);
    return Number(stdout.trim().split('\n').pop());
  };

  await mkdir(o.stateDir, { recursive: true });
  try {
    const doRoot = join(o.stateDir, 'runsc-do');
    await mkdir(doRoot, { recursive: true });
    for (let i = 0; i < o.runs; i++) {
      f.floor.push(
        await time(() =>
          run(runsc, [`--root=${doRoot}`, `--platform=${o.platform}`, '--network=none', 'do', 'true']),
        ),
      );
    }
    // cold creates; the first instance stays as the snapshot source
    let source: InstanceSpec | undefined;
    for (let i = 0; i < o.runs; i++) {
      const spec = await newSpec();
      f.coldCreate.push(await time(() => driver.create(spec)));
      if (!source) source = spec;
      else await drop(spec.instanceId);
    }
    const src = source!;
    for (let i = 0; i < (o.loops === false ? 0 : o.runs); i++) {
      f.syscallLoop.push(
        await inside(src.instanceId, 'dd if=/dev/zero of=/dev/null bs=1 count=100000 2>/dev/null'),
      );
      f.spawnLoop.push(
        await inside(src.instanceId, 'i=0; while [ $i -lt 100 ]; do /bin/true; i=$((i+1)); done'),
      );
    }
    for (let i = 0; i < o.runs; i++) {
      f.pause.push(await time(() => driver.pause(src.instanceId)));
      f.resume.push(
        await time(async () => {
          await driver.resume(src.instanceId);
          await waitForHealth(src.network.sandboxAddress, 10_000);
        }),
      );
    }
    let ref: SnapshotRef | undefined;
    for (let i = 0; i < o.runs; i++) {
      const dir = join(o.stateDir, `snap-${i}`);
      const t = performance.now();
      const r = await driver.snapshot(src.instanceId, dir);
      f.snapshot.push(performance.now() - t);
      ref ??= r;
    }
    for (let i = 0; i < o.runs; i++) {
      const spec = await newSpec();
      f.restoreCreate.push(await time(() => driver.restore(ref!, spec)));
      await drop(spec.instanceId);
    }
    return f;
  } finally {
    for (const id of [...live.keys()]) await drop(id);
    await rm(o.stateDir, { recursive: true, force: true });
  }
}

/** Mounts a template's overlay lowers read-only at `root` (one layer: a read-only bind mount). */
async function mountTemplateReadOnly(image: TemplateImage, root: string): Promise<void> {
  // a read-only overlay needs two lowers at least; one layer is bind-mounted read-only instead
  if (image.lowerDirs.length > 1) {
    await run('mount', [
      '-t',
      'overlay',
      'space-floor',
      '-o',
      `ro,lowerdir=${image.lowerDirs.join(':')}`,
      root,
    ]);
  } else {
    await run('mount', ['--bind', '-o', 'ro', image.lowerDirs[0]!, root]);
  }
}

/**
 * The OCI spec of a floor container: the driver's own (resource limits, cgroupsPath `/space/<id>`)
 * for 1 vCPU and 512 MiB, with a read-only root, no network namespace and `argv` as its only process.
 */
function bareSpec(id: string, image: TemplateImage, root: string, argv: string[]): object {
  const spec = buildOciSpec({
    spec: {
      instanceId: id,
      template: image.template,
      image,
      vcpus: 1,
      memoryMiB: 512,
      diskMiB: 0,
      pidsLimit: 256,
      guestToken: '',
      network: { netns: 'none' } as SandboxNetwork,
    },
    rootPath: root,
    guestArgv: argv,
  }) as { root: { readonly: boolean }; linux: { namespaces: { type: string }[] } };
  spec.root.readonly = true;
  spec.linux.namespaces = spec.linux.namespaces.filter((n) => n.type !== 'network');
  return spec;
}

/** Deletes floor containers `ids` (and their cgroups), unmounts `root` and removes `stateDir`; best effort. */
async function removeFloor(
  runsc: string,
  runscRoot: string,
  ids: readonly string[],
  root: string,
  stateDir: string,
): Promise<void> {
  for (const id of ids) {
    await run(runsc, [`--root=${runscRoot}`, 'delete', '--force', id]).catch(() => {});
    await removeCgroups(id);
  }
  await run('umount', [root]).catch(() => run('umount', ['-l', root]).catch(() => {}));
  await rm(stateDir, { recursive: true, force: true });
}

/** Inputs of {@link startIdleRunscFloor}. */
export interface IdleFloorOptions {
  image: TemplateImage;
  /** Containers (≥ 1). */
  n: number;
  /** Scratch directory (bundles, read-only root mount, runsc root); made by the call, removed by `stop`. */
  stateDir: string;
  platform: 'ptrace' | 'systrap';
  runscBinary?: string;
}

/**
 * The gVisor driver's density floor: `n` bare idle containers on the template's own root
 * filesystem, each `sleep` as its only process (no guest daemon, no network), started detached with
 * the driver's global flags and limits, so each has the driver's cgroup `/space/<instance id>` to
 * read. Needs root. `stop()` kills and deletes them and removes everything the call made.
 * @returns the containers' instance ids (their cgroup names) and `stop`.
 * @throws Error when runsc or the mount fails (what was started is removed first).
 */
export async function startIdleRunscFloor(o: IdleFloorOptions): Promise<FloorInstances> {
  const runsc = o.runscBinary ?? 'runsc';
  const root = join(o.stateDir, 'rootfs');
  const runscRoot = join(o.stateDir, 'runsc');
  await mkdir(root, { recursive: true });
  await mkdir(runscRoot, { recursive: true });
  await mountTemplateReadOnly(o.image, root);
  const ids: string[] = [];
  const stop = () => removeFloor(runsc, runscRoot, ids, root, o.stateDir);
  try {
    for (let i = 0; i < o.n; i++) {
      const id = `floor-idle-${process.pid}-${i}`;
      const bundle = join(o.stateDir, `bundle-${i}`);
      await mkdir(bundle, { recursive: true });
      await writeFile(
        join(bundle, 'config.json'),
        JSON.stringify(bareSpec(id, o.image, root, ['/bin/sleep', '86400'])),
      );
      const global = [...runscGlobalArgs({ root: runscRoot, platform: o.platform }), '--network=none'];
      const cmd = runscStartCommand(runsc, global, ['run', '--detach', `--bundle=${bundle}`, id]);
      ids.push(id);
      // no pipes: the detached sandbox would hold them open, and the start would never seem to end
      const code = await new Promise<number | null>((resolve, reject) => {
        const child = spawn(cmd.cmd, cmd.args, { stdio: 'ignore' });
        child.on('error', reject);
        child.on('close', resolve);
      });
      if (code !== 0) throw new Error(`runsc run --detach (floor container ${id}) exited with ${code}`);
    }
    return { instanceIds: [...ids], stop };
  } catch (err) {
    await stop();
    throw err;
  }
}

/** Inputs of {@link runscExecFloor}: those of {@link runscTemplateFloor} (`runs` = execs). */
export type ExecFloorOptions = TemplateFloorOptions;

/**
 * The gVisor driver's floor for running a command in a running sandbox: one bare idle container
 * (as {@link startIdleRunscFloor}: the template's root filesystem, the driver's flags and limits,
 * `--network=none`, no guest daemon), then `runsc exec <id> /bin/true` `runs` times, one at a
 * time: the host's runsc spawns the process in the sandbox and waits for its exit. Needs root.
 * Everything it makes is removed before it returns.
 * @returns one wall-clock sample per exec, ms (spawn of `runsc exec` to its exit).
 * @throws Error when runsc or the mount fails, or an exec exits non-zero.
 */
export async function runscExecFloor(o: ExecFloorOptions): Promise<number[]> {
  const runsc = o.runscBinary ?? 'runsc';
  const floor = await startIdleRunscFloor({ ...o, n: 1 });
  try {
    const global = runscGlobalArgs({ root: join(o.stateDir, 'runsc'), platform: o.platform });
    const samples: number[] = [];
    for (let i = 0; i < o.runs; i++) {
      const t = performance.now();
      await run(runsc, [...global, 'exec', floor.instanceIds[0]!, '/bin/true']);
      samples.push(performance.now() - t);
      o.onSample?.();
    }
    return samples;
  } finally {
    await floor.stop();
  }
}

/** Inputs of {@link runscTemplateFloor}. */
export interface TemplateFloorOptions {
  image: TemplateImage;
  /** Samples (≥ 1). */
  runs: number;
  /** Scratch directory (bundle, read-only root mount, runsc root); made and removed by the call. */
  stateDir: string;
  platform: 'ptrace' | 'systrap';
  runscBinary?: string;
  /** Called after each sample (progress). */
  onSample?: () => void;
}

/**
 * The gVisor driver's floor for one template: a bare `runsc run` of `/bin/true` on the template's
 * own root filesystem (its overlay lowers mounted read-only), with the driver's global flags and
 * resource limits but `--network=none` and no guest daemon — sandbox start, one process, exit and
 * teardown. Needs root. Everything it makes is removed before it returns.
 * @returns one wall-clock sample per run, ms (spawn of runsc to its exit).
 * @throws Error when runsc or the mount fails.
 */
export async function runscTemplateFloor(o: TemplateFloorOptions): Promise<number[]> {
  const runsc = o.runscBinary ?? 'runsc';
  const root = join(o.stateDir, 'rootfs');
  const bundle = join(o.stateDir, 'bundle');
  const runscRoot = join(o.stateDir, 'runsc');
  await mkdir(root, { recursive: true });
  await mkdir(bundle, { recursive: true });
  await mkdir(runscRoot, { recursive: true });
  await mountTemplateReadOnly(o.image, root);
  const samples: number[] = [];
  const ids: string[] = [];
  try {
    for (let i = 0; i < o.runs; i++) {
      const id = `floor-${process.pid}-${i}`;
      ids.push(id);
      await writeFile(
        join(bundle, 'config.json'),
        JSON.stringify(bareSpec(id, o.image, root, ['/bin/true'])),
      );
      const global = [...runscGlobalArgs({ root: runscRoot, platform: o.platform }), '--network=none'];
      const cmd = runscStartCommand(runsc, global, ['run', `--bundle=${bundle}`, id]);
      const t = performance.now();
      await run(cmd.cmd, cmd.args);
      samples.push(performance.now() - t);
      o.onSample?.();
    }
    return samples;
  } finally {
    await removeFloor(runsc, runscRoot, ids, root, o.stateDir);
  }
}
