/**
 * What the data plane can still serve of a sandbox hibernated into this node's store while it runs
 * nowhere here (case R27): its session and its commands' spooled output, read from the hibernation
 * folder the agent wrote (`hibernated.json`, `commands/<id>.json` and `<id>.out`).
 */
import { readdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { CommandConfig } from '../commands/commands.ts';
import type { Spool } from '../commands/spool.ts';

/** One command of a hibernated sandbox, as its spooled record says. */
export interface HibernatedCommand {
  id: string;
  pid: number;
  /** Epoch ms. */
  startedAt: number;
  config: CommandConfig;
  /** Its spool file in the hibernation store (frames as {@link Spool} writes them). */
  spoolPath: string;
}

/**
 * A sandbox hibernated into this node's store and running nowhere here: what the data plane can
 * still serve of it without its guest (its commands' spooled output).
 */
export interface HibernatedView {
  sandboxId: string;
  /** Its session (undefined: a hibernation of an agent before sessions were kept there). */
  sessionId: string | undefined;
  /** Its commands (a folder that vanished meanwhile — a resume took it — reads as none). */
  commands(): Promise<HibernatedCommand[]>;
}

/**
 * The view of the hibernation at `path` (the sandbox's folder in the store), or null when it holds
 * no `hibernated.json`. Commands are read when asked; a folder that vanished meanwhile (a resume took
 * it) reads as none.
 */
export async function readHibernatedView(sandboxId: string, path: string): Promise<HibernatedView | null> {
  const raw = await readFile(join(path, 'hibernated.json'), 'utf8').catch(() => null);
  if (raw === null) return null;
  const file = JSON.parse(raw) as { sessionId?: string };
  const dir = join(path, 'commands');
  return {
    sandboxId,
    sessionId: file.sessionId,
    async commands() {
      const out: HibernatedCommand[] = [];
      for (const name of await readdir(dir).catch(() => [] as string[])) {
        if (!name.endsWith('.json')) continue;
        const cmdId = name.slice(0, -'.json'.length);
        const meta = await readFile(join(dir, name), 'utf8')
          .then((t) => JSON.parse(t) as { pid: number; startedAt: number; config?: CommandConfig })
          .catch(() => null);
        if (!meta) continue;
        out.push({
          id: cmdId,
          pid: meta.pid,
          startedAt: meta.startedAt,
          config: meta.config ?? { cmd: '', args: [], env: {} },
          spoolPath: join(dir, `${cmdId}.out`),
        });
      }
      return out;
    },
  };
}
