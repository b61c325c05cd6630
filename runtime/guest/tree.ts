/**
 * Finding every process a command started, including the ones that left its process group or
 * session (`setsid`, `setpgid`, a double fork that reparents to PID 1) — so a kill or a timeout
 * ends all of them (R11).
 *
 * Two ties, read from `/proc` (which gVisor and a VM's kernel both serve; cgroupfs is neither
 * mounted nor mountable inside a gVisor sandbox, whose root lacks CAP_SYS_ADMIN):
 * - **ancestry**: every live descendant of the command's leader, by `PPid`;
 * - **a marker**: every process whose environment holds `SPACE_COMMAND=<the command's marker>`.
 *   Environments are inherited through fork, exec, setsid and reparenting, so a daemon that a
 *   double fork handed to PID 1 still carries it.
 *
 * What escapes: a process that both dropped the marker (exec'd with a fresh environment, e.g.
 * `env -i`) and lost its ancestry (its parents exited before the kill). Root in the sandbox can
 * do anything anyway; this is about ordinary tools, not about containing the sandbox's own root.
 */

import { readdir, readFile } from 'node:fs/promises';
import { type ProcEntry, parseStat } from '../core/proc-stat.ts';

/** Environment variable carrying each command's marker into every process it starts. */
export const COMMAND_MARKER_ENV = 'SPACE_COMMAND';
/** Most sweeps a kill makes: a sweep that finds nothing alive ends it earlier. */
const MAX_SWEEPS = 20;
/** Pause between sweeps, ms (lets processes forked during a sweep show up in /proc). */
const SWEEP_PAUSE_MS = 20;

/**
 * Every process in `procRoot` (`/proc`) as its `stat` line reads; processes that vanish during the
 * scan are skipped. Never throws.
 */
export async function procEntries(procRoot = '/proc'): Promise<ProcEntry[]> {
  const names = await readdir(procRoot).catch(() => [] as string[]);
  const entries: ProcEntry[] = [];
  await Promise.all(
    names
      .filter((n) => /^\d+$/.test(n))
      .map(async (n) => {
        const e = parseStat(await readFile(`${procRoot}/${n}/stat`, 'utf8').catch(() => ''));
        if (e) entries.push(e);
      }),
  );
  return entries;
}

/**
 * Pids (live, not zombies) tied to a command: descendants of `leader` and processes whose
 * environment holds `SPACE_COMMAND=marker`. Never the caller itself nor PID 1. Processes that
 * vanish during the scan are skipped.
 * @param leader the command's leader pid (it is included when alive)
 * @param marker the command's marker value
 * @param procRoot `/proc` (tests may point elsewhere)
 */
export async function commandProcesses(
  leader: number,
  marker: string,
  procRoot = '/proc',
): Promise<number[]> {
  const entries = await procEntries(procRoot);
  const children = new Map<number, number[]>();
  for (const e of entries) {
    const list = children.get(e.ppid) ?? [];
    list.push(e.pid);
    children.set(e.ppid, list);
  }
  const found = new Set<number>();
  // descendants of the leader (a zombie leader still links its children until it is reaped)
  const queue = [leader];
  while (queue.length > 0) {
    const pid = queue.pop()!;
    if (found.has(pid)) continue;
    found.add(pid);
    queue.push(...(children.get(pid) ?? []));
  }
  const needle = Buffer.from(`${COMMAND_MARKER_ENV}=${marker}\0`);
  await Promise.all(
    entries.map(async (e) => {
      if (found.has(e.pid) || e.zombie) return;
      const env = await readFile(`${procRoot}/${e.pid}/environ`).catch(() => null);
      if (
        env &&
        (env.subarray(0, needle.length).equals(needle) ||
          env.includes(Buffer.concat([Buffer.from([0]), needle])))
      )
        found.add(e.pid);
    }),
  );
  const live = new Set(entries.filter((e) => !e.zombie).map((e) => e.pid));
  return [...found].filter((pid) => live.has(pid) && pid !== process.pid && pid !== 1);
}

/**
 * Sends `signal` to every process of a command ({@link commandProcesses}) and, for SIGKILL, sweeps
 * again until a sweep finds none alive (at most {@link MAX_SWEEPS}), so processes forked while
 * the first sweep ran die too. A SIGKILL is preceded by SIGSTOP sweeps until one finds no process
 * it had not stopped: a stopped process cannot fork, so a fork bomb cannot outpace the kill (R19;
 * without them 256 of a bomb's processes outlived its command's timeout). Never throws; resolves
 * with how many signals were sent.
 */
export async function signalCommand(leader: number, marker: string, signal: NodeJS.Signals): Promise<number> {
  let sent = 0;
  const send = (pid: number, sig: NodeJS.Signals): boolean => {
    try {
      process.kill(pid, sig);
      sent++;
      return true;
    } catch {
      return false; // ESRCH: gone meanwhile
    }
  };
  if (signal === 'SIGKILL') {
    const stopped = new Set<number>();
    for (let sweep = 0; sweep < MAX_SWEEPS; sweep++) {
      const fresh = (await commandProcesses(leader, marker).catch(() => [] as number[])).filter(
        (pid) => !stopped.has(pid),
      );
      if (fresh.length === 0) break;
      for (const pid of fresh) if (send(pid, 'SIGSTOP')) stopped.add(pid);
    }
  }
  for (let sweep = 0; sweep < (signal === 'SIGKILL' ? MAX_SWEEPS : 1); sweep++) {
    const pids = await commandProcesses(leader, marker).catch(() => [] as number[]);
    if (pids.length === 0) break;
    for (const pid of pids) send(pid, signal);
    await new Promise((r) => setTimeout(r, SWEEP_PAUSE_MS));
  }
  return sent;
}
