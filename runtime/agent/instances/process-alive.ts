/** A cheap check that a host process still runs, for the warm claim (a file read, no process spawned). */
import { readFileSync } from 'node:fs';
import { parseStat } from '../../core/proc-stat.ts';

/**
 * Whether host process `pid` still runs: it has a `/proc/<pid>/stat` and is not a zombie (`Z`,
 * killed but not yet reaped by its parent — a SIGKILLed runsc sandbox whose parent is an init that
 * reaps late stays one) or dead (`X`). A pid the kernel handed to another process since reads as
 * running; callers treat this as a cheap first check only.
 */
export function processAlive(pid: number): boolean {
  let stat: string;
  try {
    stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  } catch {
    return false;
  }
  const e = parseStat(stat);
  return e !== undefined && !e.zombie;
}
