/**
 * The gVisor driver's pure parts (gvisor.ts runs them): the OCI runtime spec of an instance and
 * the `runsc` command lines — run, restore, start, exec, checkpoint — with the runsc release they
 * need, the overlay mount options, and how runsc's output maps to the driver's states and errors.
 * Nothing here touches the host.
 */
import { join } from 'node:path';
import type { InstanceInfo, InstanceSpec } from './driver.ts';
import { guestProcessLimit, hostTaskLimit, shmSizeMiB, tmpSizeMiB } from './gvisor-limits.ts';
import { DEFAULT_GVISOR_PLATFORM } from './gvisor-platform.ts';

/** Configuration of `GvisorDriver` (gvisor.ts). */
export interface GvisorConfig {
  /** Driver state root (instances, runsc root). */
  stateDir: string;
  /** runsc `--root` (default `<stateDir>/runsc`). */
  runscRoot?: string;
  /** runsc binary (default `runsc` on PATH). */
  runscBinary?: string;
  /** runsc `--platform` (default {@link DEFAULT_GVISOR_PLATFORM}). */
  platform?: 'ptrace' | 'systrap';
  /** The guest's argv (default `DEFAULT_GUEST_ARGV`, from the image's guest layer). */
  guestArgv?: string[];
  /** How long create() waits for the guest's /health, ms (default 30 000). */
  healthTimeoutMs?: number;
  /**
   * Advertise snapshot/restore in `GvisorDriver.capabilities` (default false; the agent turns
   * it on with SPACE_GVISOR_SNAPSHOTS). The methods work either way; the flag says whether the agent
   * may rely on them. Restores of sandboxes that had a host connection open at the checkpoint were
   * seen to come up unreachable (see docs/operations.md, Known limits); template snapshots have none, and the
   * agent boots instead when a restore fails.
   */
  snapshots?: boolean;
  /**
   * `runsc checkpoint --compression` (default `none`: a larger image, but restore maps it without
   * inflating it first; see benchmarks/gvisor-platforms.ts for the figures).
   */
  checkpointCompression?: 'none' | 'flate-best-speed';
  /** Pass `--debug` to runsc (verbose logs in logs/). Default false. */
  debug?: boolean;
  log?: (msg: string, fields?: Record<string, unknown>) => void;
}

/** CPU period for the CFS quota, µs. */
export const CPU_PERIOD_US = 100_000;

/** Docker's default capability set: enough for the guest (root) to drop to `user` and manage files. */
const CAPS = [
  'CAP_CHOWN',
  'CAP_DAC_OVERRIDE',
  'CAP_FSETID',
  'CAP_FOWNER',
  'CAP_MKNOD',
  'CAP_NET_RAW',
  'CAP_SETGID',
  'CAP_SETUID',
  'CAP_SETFCAP',
  'CAP_SETPCAP',
  'CAP_NET_BIND_SERVICE',
  'CAP_SYS_CHROOT',
  'CAP_KILL',
  'CAP_AUDIT_WRITE',
];

/** Inputs of {@link buildOciSpec}. */
export interface OciInputs {
  spec: InstanceSpec;
  /** Absolute path of the merged overlay (container root). */
  rootPath: string;
  guestArgv: string[];
}

/**
 * The OCI runtime spec (config.json) for an instance. Pure.
 * CPU: quota = vcpus × {@link CPU_PERIOD_US} µs; memory: memoryMiB × 2^20 bytes; cgroupsPath `/space/<id>`;
 * processes: {@link guestProcessLimit} inside (RLIMIT_NPROC), {@link hostTaskLimit} on the host;
 * `/tmp`: a tmpfs of {@link tmpSizeMiB}; `/dev/shm` of {@link shmSizeMiB}: every memory-backed
 * filesystem the sandbox user can write is sized, so a full one is ENOSPC to its writer (R13, R20).
 */
export function buildOciSpec(i: OciInputs): Record<string, unknown> {
  const { spec } = i;
  const nproc = guestProcessLimit(spec);
  return {
    ociVersion: '1.0.2',
    process: {
      terminal: false,
      user: { uid: 0, gid: 0 },
      args: i.guestArgv,
      env: [
        'PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin',
        'HOME=/root',
        'LANG=C.UTF-8',
      ],
      cwd: '/',
      capabilities: { bounding: CAPS, effective: CAPS, permitted: CAPS },
      rlimits: [
        { type: 'RLIMIT_NOFILE', hard: 65536, soft: 65536 },
        { type: 'RLIMIT_NPROC', hard: nproc, soft: nproc },
      ],
      noNewPrivileges: false,
    },
    root: { path: i.rootPath, readonly: false },
    hostname: 'sandbox',
    mounts: [
      { destination: '/proc', type: 'proc', source: 'proc' },
      // gVisor ignores a size (and `ro` makes its device nodes unwritable) on `/dev`: it stays
      // unsized, writable by root alone (mode 755)
      { destination: '/dev', type: 'tmpfs', source: 'tmpfs', options: ['nosuid', 'strictatime', 'mode=755'] },
      { destination: '/dev/pts', type: 'devpts', source: 'devpts', options: ['nosuid', 'noexec'] },
      {
        destination: '/dev/shm',
        type: 'tmpfs',
        source: 'shm',
        options: ['nosuid', 'noexec', 'nodev', 'mode=1777', `size=${shmSizeMiB(spec.memoryMiB)}m`],
      },
      {
        destination: '/tmp',
        type: 'tmpfs',
        source: 'tmp',
        options: ['nosuid', 'nodev', 'mode=1777', `size=${tmpSizeMiB(spec.memoryMiB)}m`],
      },
      { destination: '/sys', type: 'sysfs', source: 'sysfs', options: ['nosuid', 'noexec', 'nodev', 'ro'] },
    ],
    linux: {
      cgroupsPath: `/space/${spec.instanceId}`,
      namespaces: [
        { type: 'pid' },
        { type: 'ipc' },
        { type: 'uts' },
        { type: 'mount' },
        { type: 'network', path: `/var/run/netns/${spec.network.netns}` },
      ],
      resources: {
        cpu: { quota: Math.max(1000, Math.round(spec.vcpus * CPU_PERIOD_US)), period: CPU_PERIOD_US },
        memory: { limit: spec.memoryMiB * 1024 * 1024 },
        pids: { limit: hostTaskLimit(nproc) },
      },
    },
  };
}

/** Oldest runsc release the driver accepts (yyyymmdd): checkpoint with live TCP endpoints, systrap. */
export const MIN_RUNSC_RELEASE = 20240729;

/**
 * Release date (yyyymmdd) in `runsc --version` output: Debian's `runsc version 0.0~20240729.0` or
 * upstream's `runsc version release-20240729.0`; undefined when none is found. Pure.
 */
export function runscRelease(versionOutput: string): number | undefined {
  const m = /runsc version \S*?(20\d{6})/.exec(versionOutput);
  return m ? Number(m[1]) : undefined;
}

/**
 * Global runsc flags common to every call. Pure.
 * - `--net-disconnect-ok`: a checkpoint resets the sandbox's connected TCP endpoints (the agent's
 *   keep-alive link to the guest daemon, anything in TIME_WAIT) instead of refusing to save them.
 *   Both ends see a reset; the agent's guest client reconnects on its next request.
 * - `--overlay2=none`: the sandbox writes straight to its overlay on its own ext4 disk, as with runsc
 *   2022-12. runsc's default (`root:self`) would keep writes in a sparse memory file inside the
 *   rootfs, which turns a full disk into a sentry error instead of ENOSPC and hides the writes from
 *   the disk copy a snapshot takes.
 */
export function runscGlobalArgs(o: {
  root: string;
  platform?: string;
  debugLogDir?: string;
  debug?: boolean;
}): string[] {
  return [
    `--root=${o.root}`,
    `--platform=${o.platform ?? DEFAULT_GVISOR_PLATFORM}`,
    '--net-disconnect-ok',
    '--overlay2=none',
    ...(o.debugLogDir
      ? [`--debug-log=${o.debugLogDir.endsWith('/') ? o.debugLogDir : `${o.debugLogDir}/`}`]
      : []),
    ...(o.debug ? ['--debug'] : []),
  ];
}

/** Where runsc writes the host pid of an instance's sandbox process (`--pid-file`), in its bundle. */
export const SANDBOX_PID_FILE = 'sandbox.pid';

/**
 * Command + argv that starts the container: `runsc … run --detach --pid-file=<bundle>/sandbox.pid`
 * in a private mount namespace where `/proc/sys/net` is hidden under an empty tmpfs. See
 * {@link runscStartCommand}. Pure.
 */
export function runscRunCommand(
  runsc: string,
  global: string[],
  bundle: string,
  id: string,
): { cmd: string; args: string[] } {
  return runscStartCommand(runsc, global, [
    'run',
    '--detach',
    `--bundle=${bundle}`,
    `--pid-file=${join(bundle, SANDBOX_PID_FILE)}`,
    id,
  ]);
}

/**
 * Command + argv that restores the container from a checkpoint image directory:
 * `runsc … restore --detach --bundle=<bundle> --image-path=<image> --pid-file=<bundle>/sandbox.pid
 * <id>`, wrapped as in {@link runscStartCommand}. Pure.
 */
export function runscRestoreCommand(
  runsc: string,
  global: string[],
  bundle: string,
  imagePath: string,
  id: string,
): { cmd: string; args: string[] } {
  return runscStartCommand(runsc, global, [
    'restore',
    '--detach',
    `--bundle=${bundle}`,
    `--image-path=${imagePath}`,
    `--pid-file=${join(bundle, SANDBOX_PID_FILE)}`,
    id,
  ]);
}

/**
 * Wraps a runsc subcommand that starts a sandbox (`run`, `restore`) in a private mount namespace
 * where `/proc/sys/net` is hidden under an empty tmpfs.
 *
 * Why: runsc decides "am I in the root network namespace?" by testing whether
 * `/proc/sys/net/core/rmem_default` exists, which newer kernels (6.x here) expose in every namespace,
 * so it refuses to take over the prepared namespace ("cannot run with network enabled in root network
 * namespace"). Still so in 2024-07-29 (checked: `runsc restore` fails that way without the wrapper).
 * Hiding `/proc/sys/net` (hiding only `core` does not survive the setns) for runsc only makes the
 * check answer correctly. Pure.
 */
export function runscStartCommand(
  runsc: string,
  global: string[],
  sub: string[],
): { cmd: string; args: string[] } {
  return {
    cmd: 'unshare',
    args: [
      '--mount',
      '--propagation=private',
      '--',
      '/bin/sh',
      '-c',
      'mount -t tmpfs -o size=4k,mode=0555 space-hide /proc/sys/net && exec "$@"',
      'sh',
      runsc,
      ...global,
      ...sub,
    ],
  };
}

/** argv of a simple per-container subcommand (`pause`, `resume`, `state`, `delete --force`). Pure. */
export function runscCmdArgs(global: string[], cmd: string[], id: string): string[] {
  return [...global, ...cmd, id];
}

/** argv of `runsc checkpoint --leave-running --image-path=<dir> [--compression=…]`. Pure. */
export function runscCheckpointArgs(
  global: string[],
  id: string,
  imagePath: string,
  compression?: string,
): string[] {
  return [
    ...global,
    'checkpoint',
    '--leave-running',
    `--image-path=${imagePath}`,
    ...(compression ? [`--compression=${compression}`] : []),
    id,
  ];
}

/** Overlay mount options for read-only lowers (topmost first) and upper/work dirs. Pure. */
export function overlayOptions(lowers: string[], upper: string, work: string): string {
  if (!lowers.length) throw new Error('overlay needs at least one lower dir');
  for (const p of [...lowers, upper, work])
    if (/[,:]/.test(p)) throw new Error(`overlay path has , or : — ${p}`);
  return `lowerdir=${lowers.join(':')},upperdir=${upper},workdir=${work}`;
}

/** The useful part of runsc checkpoint's (huge, Go-dump) error output, ≤ 300 chars. Pure. */
export function checkpointFailureReason(stderr: string): string {
  const m = /(save rejected[^\n]*?)(?::\n|$)/.exec(stderr) ?? /(checkpoint failed: [^\n{]*)/.exec(stderr);
  return (m?.[1] ?? stderr.trim().split('\n')[0] ?? '').slice(0, 300);
}

/** Maps `runsc state` status to the driver's state. Pure. */
export function mapRunscStatus(status: string | undefined): InstanceInfo['state'] {
  if (status === 'running' || status === 'created') return 'running';
  if (status === 'paused') return 'paused';
  return 'stopped';
}
