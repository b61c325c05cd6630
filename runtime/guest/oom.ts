/**
 * The guest's out-of-memory kill: when its node agent sees the sandbox's host memory charge near
 * its limit (agent/sandboxes/memory-guard.ts), the guest kills the one process holding the most memory, as
 * Linux's OOM killer picks by resident size, so the offender dies alone and the sandbox, this
 * daemon and every other process live on (case R21). gVisor has no OOM killer of its own: without
 * this the host's memory cgroup ends the whole sandbox.
 *
 * Never chosen: PID 1 (tini), this daemon, and zombies. Sizes come from `/proc/<pid>/statm`
 * (`resident`, in pages), which gVisor and a VM's kernel both serve.
 */
import { readFile } from 'node:fs/promises';
import { COMMAND_MARKER_ENV, procEntries } from './tree.ts';

/** Bytes of a page as `statm` counts them (x86-64 and arm64 Linux; gVisor alike). */
export const PAGE_BYTES = 4096;

/** Ancestors followed up from a victim when finding the command it belongs to. */
const MAX_ANCESTRY = 64;

/** The process chosen to be killed, and what ties it to a command. */
export interface OomVictim {
  pid: number;
  /** Its command name (`/proc/<pid>/comm`). */
  comm: string;
  /** Resident memory when chosen, bytes. */
  rssBytes: number;
  /** Its pid, then its parent's, up to PID 1 (at most {@link MAX_ANCESTRY}). */
  lineage: number[];
  /** Its `SPACE_COMMAND` marker, when its environment holds one (see tree.ts). */
  marker?: string;
}

/** The resident size of `statm`'s text in bytes; undefined for text that is not a statm line. Pure. */
export function residentBytes(statm: string): number | undefined {
  const pages = Number(statm.trim().split(/\s+/)[1]);
  return Number.isSafeInteger(pages) && pages >= 0 ? pages * PAGE_BYTES : undefined;
}

/** The `SPACE_COMMAND` value in a NUL-separated environment block, if any. Pure. */
export function markerOf(environ: Buffer): string | undefined {
  const prefix = `${COMMAND_MARKER_ENV}=`;
  for (const entry of environ.toString('latin1').split('\0'))
    if (entry.startsWith(prefix)) return entry.slice(prefix.length);
  return undefined;
}

/**
 * The live process with the largest resident size, except PID 1, `exclude` (this daemon) and
 * zombies; undefined when there is none (only the daemon is left). Processes that vanish during
 * the scan are skipped. Never throws.
 */
export async function chooseOomVictim(
  exclude: ReadonlySet<number>,
  procRoot = '/proc',
): Promise<OomVictim | undefined> {
  const entries = await procEntries(procRoot);
  const parents = new Map(entries.map((e) => [e.pid, e.ppid]));
  let best: { pid: number; rssBytes: number } | undefined;
  await Promise.all(
    entries
      .filter((e) => !e.zombie && e.pid !== 1 && !exclude.has(e.pid))
      .map(async (e) => {
        const rssBytes = residentBytes(await readFile(`${procRoot}/${e.pid}/statm`, 'utf8').catch(() => ''));
        if (rssBytes !== undefined && (!best || rssBytes > best.rssBytes)) best = { pid: e.pid, rssBytes };
      }),
  );
  if (!best) return undefined;
  const { pid, rssBytes } = best;
  const lineage = [pid];
  for (
    let p = parents.get(pid);
    p !== undefined && p > 1 && lineage.length < MAX_ANCESTRY;
    p = parents.get(p)
  )
    lineage.push(p);
  const [comm, environ] = await Promise.all([
    readFile(`${procRoot}/${pid}/comm`, 'utf8').catch(() => ''),
    readFile(`${procRoot}/${pid}/environ`).catch(() => Buffer.alloc(0)),
  ]);
  const marker = markerOf(environ);
  return { pid, comm: comm.trim(), rssBytes, lineage, ...(marker !== undefined ? { marker } : {}) };
}
