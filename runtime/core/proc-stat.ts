/** Reading a process's `/proc/<pid>/stat` line (Linux; gVisor's and a VM kernel's `/proc` alike). */

/** What the tools here need of a process. */
export interface ProcEntry {
  pid: number;
  /** Its parent's pid (field 4). */
  ppid: number;
  /** Exited and not reaped yet (state `Z` or `X`). */
  zombie: boolean;
}

/**
 * `pid`, `ppid` and zombie state from a `/proc/<pid>/stat` line; undefined for a line that is not
 * one. The command name (field 2) may hold `)` and spaces: the fields are read after its last `)`.
 * Pure.
 */
export function parseStat(line: string): ProcEntry | undefined {
  const close = line.lastIndexOf(')');
  if (close < 0) return undefined;
  const pid = Number.parseInt(line, 10);
  const rest = line.slice(close + 2).split(' ');
  const ppid = Number(rest[1]);
  if (!Number.isInteger(pid) || !Number.isInteger(ppid)) return undefined;
  return { pid, ppid, zombie: rest[0] === 'Z' || rest[0] === 'X' };
}
