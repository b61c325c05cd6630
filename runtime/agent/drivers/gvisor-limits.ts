/**
 * A gVisor sandbox's resource limits — how many tasks, how large its memory-backed filesystems —
 * and what the host's cgroup counters say of them: why an instance ended, and the memory charge the
 * memory guard watches (agent/sandboxes/memory-guard.ts). Used by the gVisor driver's OCI spec and, for the
 * task and filesystem sizes, by the VM guests' init (vm-image.ts), so both drivers enforce the same.
 *
 * Cgroup files: v1 (`/sys/fs/cgroup/<controller>/space/<instance>/…`, these hosts) first, else v2
 * (`/sys/fs/cgroup/space/<instance>/…`).
 */
import { readFileSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { InstanceEndCause, InstanceSpec } from './driver.ts';

/** The root of the host's cgroup mounts. */
const CGROUP_ROOT = '/sys/fs/cgroup';

/** Path of an instance's cgroup v1 `file` under `controller`. Pure. */
export function cgroupV1File(controller: string, instanceId: string, file: string): string {
  return join(CGROUP_ROOT, controller, 'space', instanceId, file);
}

/** Path of an instance's cgroup v2 `file`. Pure. */
export function cgroupV2File(instanceId: string, file: string): string {
  return join(CGROUP_ROOT, 'space', instanceId, file);
}

/**
 * Guest memory each process is budgeted, MiB, when the sandbox's process limit is derived from its
 * memory. Measured on runsc 2024-07-29 (systrap): every guest process costs the sandbox ~0.6 MiB of
 * host memory (its stub process, sysmsg stacks, page tables) before it allocates anything, so
 * 1,100 idle `sleep`s OOM-kill a 512 MiB sandbox (the host cgroup kills the whole sentry). 2 MiB per
 * process keeps the processes' own cost under a third of the sandbox's memory.
 */
export const MIB_PER_GUEST_PROCESS = 2;

/**
 * Fewest tasks a uid may run in a sandbox, whatever its memory. gVisor counts threads against
 * RLIMIT_NPROC as Linux does (checked: 18 Python threads under a limit of 20), and one Node process
 * has ~11, so a dev server and its tooling need room. A small sandbox that really forks this many
 * processes runs out of memory first and its record says so.
 */
export const MIN_GUEST_PROCESSES = 256;

/**
 * Host tasks the gVisor sandbox may use per guest process (the pids cgroup): with systrap every
 * guest process has a stub process and every guest thread a sysmsg thread on the host. Measured on
 * this runsc: ~2.1 host tasks per idle guest process in a bare container, but ~3.8 in a sandbox
 * and up to ~8.6 once a fork loop meets the limit (256 `sleep`s took the pids cgroup to 2,195), so
 * 16 leaves room. The guest's own limit bounds the tasks; this one only has to stay out of its way.
 */
export const HOST_TASKS_PER_GUEST_PROCESS = 16;

/** Host tasks of the sentry and gofer themselves (Go threads), above the guest processes' share. */
export const HOST_TASKS_BASE = 256;

/**
 * The sandbox's process limit, as seen inside: `RLIMIT_NPROC` of every process (gVisor counts the
 * tasks of each uid, root included), so a fork bomb meets EAGAIN ("Cannot fork") inside while the
 * guest daemon, running under another uid than the commands, still starts new ones.
 * = min(pidsLimit, max({@link MIN_GUEST_PROCESSES}, memoryMiB / {@link MIB_PER_GUEST_PROCESS})):
 * tasks (processes and threads) per uid: a 512 MiB sandbox or smaller runs 256, a 4 GiB one the
 * configured 1,024. Pure.
 */
export function guestProcessLimit(spec: Pick<InstanceSpec, 'memoryMiB' | 'pidsLimit'>): number {
  return Math.min(
    spec.pidsLimit,
    Math.max(MIN_GUEST_PROCESSES, Math.floor(spec.memoryMiB / MIB_PER_GUEST_PROCESS)),
  );
}

/**
 * The host pids cgroup limit: far enough above {@link guestProcessLimit} that the guest's own limit
 * is met first. Hitting the host limit makes the sentry panic ("createSysmsgThread: failed to get
 * clone") and the whole sandbox die, which is what R13 forbids. Pure.
 */
export function hostTaskLimit(guestProcesses: number): number {
  return guestProcesses * HOST_TASKS_PER_GUEST_PROCESS + HOST_TASKS_BASE;
}

/**
 * Size of the sandbox's `/tmp`, MiB: half its memory, as Linux sizes a tmpfs by default. Without a
 * `/tmp` mount in the spec runsc mounts its own unbounded tmpfs there (`df` showed the host's free
 * memory, ~12G), and filling it ran the whole sandbox out of memory; a sized tmpfs answers ENOSPC to
 * the writer instead. Its pages are sandbox memory (they count against the memory limit). Pure.
 */
export function tmpSizeMiB(memoryMiB: number): number {
  return Math.max(16, Math.floor(memoryMiB / 2));
}

/**
 * Size of the sandbox's `/dev/shm` (POSIX shared memory, `shm_open`, Python's multiprocessing),
 * MiB: a quarter of its memory, at least 8. Without a size runsc's tmpfs there is unbounded (`df`
 * showed the host's ~12G in a 512 MiB sandbox) and writing 600 MB to it ran the whole sandbox out
 * of memory (case R20). With `/tmp` at half, every memory-backed filesystem together holds at most
 * three quarters of the sandbox's memory, so filling both still leaves room for its processes and
 * the guest daemon. Pure.
 */
export function shmSizeMiB(memoryMiB: number): number {
  return Math.max(8, Math.floor(memoryMiB / 4));
}

/**
 * Bytes of file pages (page cache the host can reclaim) in a cgroup `memory.stat` text:
 * `active_file` + `inactive_file` (v1 and v2 name them alike). Pure.
 */
export function fileCacheBytes(memoryStat: string): number {
  let n = 0;
  for (const m of memoryStat.matchAll(/^(?:active_file|inactive_file) (\d+)$/gm)) n += Number(m[1]);
  return n;
}

/**
 * The cause named by cgroup counter files (memory: `oom_kill N`; pids: `max N`), N > 0. Pure.
 */
export function endCauseFromCounters(memory: string, pids: string): InstanceEndCause | undefined {
  const count = (text: string, key: string) =>
    Math.max(0, ...[...text.matchAll(new RegExp(`^${key} (\\d+)$`, 'gm'))].map((m) => Number(m[1])));
  if (count(memory, 'oom_kill') > 0) return 'memory';
  if (count(pids, 'max') > 0) return 'processes';
  return undefined;
}

/**
 * Reads the instance's host cgroup counters: an OOM kill (v1 `memory.oom_control` `oom_kill`, v2
 * `memory.events`) means memory, a refused fork (`pids.events` `max`) processes. Memory wins when
 * both counted: a fork refused by the host makes the sentry panic, but so can an OOM. Never throws.
 */
export async function instanceEndCause(instanceId: string): Promise<InstanceEndCause | undefined> {
  const read = (path: string) => readFile(path, 'utf8').catch(() => '');
  const mem =
    (await read(cgroupV1File('memory', instanceId, 'memory.oom_control'))) +
    (await read(cgroupV2File(instanceId, 'memory.events')));
  const pids =
    (await read(cgroupV1File('pids', instanceId, 'pids.events'))) +
    (await read(cgroupV2File(instanceId, 'pids.events')));
  return endCauseFromCounters(mem, pids);
}

/**
 * The instance's host memory charge that a process kill can free, bytes: the cgroup's usage less
 * its file pages ({@link fileCacheBytes}), which the host reclaims on its own (the sandbox disk's
 * page cache: writing a large file raised the usage by its size). v1 `memory.usage_in_bytes`, else
 * v2 `memory.current`; undefined when neither can be read (the instance is gone). Synchronous: the
 * memory guard reads it often, and two small cgroup files cost microseconds.
 */
export function instanceMemoryCharge(instanceId: string): number | undefined {
  for (const [usageFile, statFile] of [
    [
      cgroupV1File('memory', instanceId, 'memory.usage_in_bytes'),
      cgroupV1File('memory', instanceId, 'memory.stat'),
    ],
    [cgroupV2File(instanceId, 'memory.current'), cgroupV2File(instanceId, 'memory.stat')],
  ] as const) {
    let usage: number;
    let stat: string;
    try {
      usage = Number(readFileSync(usageFile, 'latin1').trim());
      stat = readFileSync(statFile, 'latin1');
    } catch {
      continue; // not this hierarchy
    }
    if (Number.isSafeInteger(usage)) return Math.max(0, usage - fileCacheBytes(stat));
  }
  return undefined;
}
