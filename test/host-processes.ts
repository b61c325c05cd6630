/** Host processes seen through /proc, for tests that check what an instance left behind. */
import { readdir, readFile } from 'node:fs/promises';

/**
 * Pids of the host processes whose command line (argv joined by NUL) satisfies `match`. A process
 * that exits during the scan is skipped.
 */
export async function pidsWhere(match: (cmdline: string) => boolean): Promise<number[]> {
  const out: number[] = [];
  for (const p of await readdir('/proc')) {
    if (!/^\d+$/.test(p)) continue;
    const cmdline = await readFile(`/proc/${p}/cmdline`, 'utf8').catch(() => '');
    if (match(cmdline)) out.push(Number(p));
  }
  return out;
}
