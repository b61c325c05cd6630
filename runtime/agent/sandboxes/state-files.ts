/**
 * What the node keeps of its sandboxes on local disk, so a restarted agent re-adopts what is
 * running: `<stateDir>/sandboxes/<id>/sandbox.json` (the request without its env, the instance, how
 * it was made) and `commands/` (each command's record and spool); the warm slots' directories made
 * ahead (`<stateDir>/warm/<instanceId>/`); and `hibernated.json` in a hibernated sandbox's folder of
 * the store. Every file is written whole or not at all (host/durable-file.ts: temp, fsync, rename),
 * so a crash or a full disk never leaves a torn one; one found torn anyway (an older agent's) is
 * quarantined, never a reason not to start. Each sandbox's folder also names its instance in an
 * empty file, `instance-<instanceId>` (a name, so never torn), from which adoption rebuilds a
 * sandbox whose `sandbox.json` is unreadable (with the control plane's record).
 */
import { renameSync } from 'node:fs';
import { mkdir, readdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { Logger } from 'pino';
import { SpaceError } from '../../core/errors.ts';
import { F } from '../../core/log-fields.ts';
import { type Command, type CommandConfig, resumePump } from '../commands/commands.ts';
import { Spool } from '../commands/spool.ts';
import type { InstanceInfo, SnapshotRef } from '../drivers/driver.ts';
import { diskFullError, readJsonFile, writeFileAtomic } from '../host/durable-file.ts';
import type { ActivityMeter } from './activity.ts';
import type { CreateSandbox, InstanceSource, LocalSandbox } from './types.ts';

/** On-disk record of a sandbox on this node (`<stateDir>/sandboxes/<id>/sandbox.json`). */
export interface SandboxFile {
  req: CreateSandbox;
  instance: InstanceInfo;
  /** Absent in records written before snapshots existed (then `fromWarmPool` says). */
  source?: InstanceSource;
  fromWarmPool: boolean;
  createdAt: number;
  /**
   * Set once a pause (or a hibernation) froze the instance, cleared when it is thawed: an agent
   * restart tells a frozen sandbox from one whose pause did not get that far.
   */
  paused?: 'frozen';
  /** Epoch ms when the instance was frozen (with `paused`). */
  pausedAt?: number;
}

/** `hibernated.json` in a hibernated sandbox's folder of the store. */
export interface HibernatedFile {
  sandboxId: string;
  template: string;
  snapshot: SnapshotRef;
  source: InstanceSource;
  /** Epoch ms (this node's clock; informational). */
  hibernatedAt: number;
  /**
   * Epoch ms (this node's clock) when the instance was frozen for this hibernation: the metering
   * boundary of the pause (absent in files of agents before it was kept; `hibernatedAt` then).
   */
  pausedAt?: number;
  /** The session its tokens carry (absent in files of agents before it was kept). */
  sessionId?: string;
}

export class StateFiles {
  readonly #stateDir: string;

  constructor(stateDir: string) {
    this.#stateDir = stateDir;
  }

  /** `<stateDir>/sandboxes`: one folder per sandbox. */
  get root(): string {
    return join(this.#stateDir, 'sandboxes');
  }

  /** The sandbox's folder. */
  dir(id: string): string {
    return join(this.#stateDir, 'sandboxes', id);
  }

  /**
   * The state directory made ahead for a warm slot: `<stateDir>/warm/<instanceId>/`, holding an
   * empty `commands/` and the empty `instance-<instanceId>` marker. A claim renames it to the
   * sandbox's directory and writes `sandbox.json`, instead of making both: making a directory and a file is two inode
   * allocations, which where the state directory sits in a crowded ext4 block group cost ~1.5 ms
   * of kernel CPU per create (measured on a 2-core VM in `~/.space`, the local stack's: mkdir +
   * new file 1.3–1.9 ms, rename + overwrite 0.13–0.17 ms; in `/var/lib/space` on the same disk the
   * two allocations took ~0.08 ms). A directory renamed by a claim that crashed before writing
   * `sandbox.json` has none, and is dropped by adoption.
   */
  slotDir(inst: InstanceInfo): string {
    return join(this.#stateDir, 'warm', inst.instanceId);
  }

  /** `<stateDir>/warm`: every slot's directory. */
  get slotsRoot(): string {
    return join(this.#stateDir, 'warm');
  }

  /** Makes a warm slot's directory ahead of its claim ({@link slotDir}). */
  async makeSlotDir(inst: InstanceInfo): Promise<void> {
    const slotDir = this.slotDir(inst);
    await Promise.all([
      mkdir(join(slotDir, 'commands'), { recursive: true }),
      mkdir(this.root, { recursive: true }),
    ]);
    await writeFile(join(slotDir, markerName(inst.instanceId)), '', { mode: 0o600 }).catch((err: unknown) => {
      throw diskFullError(err, 'a warm slot’s folder');
    });
  }

  /**
   * The instance id the sandbox's folder names (its `instance-<id>` marker), or null when it has
   * none (folders of agents before the marker).
   */
  async instanceOf(id: string): Promise<string | null> {
    const names = await readdir(this.dir(id)).catch(() => [] as string[]);
    const m = names.find((n) => n.startsWith(MARKER_PREFIX));
    return m ? m.slice(MARKER_PREFIX.length) : null;
  }

  /** Writes the sandbox's state file (what an agent restart adopts it from; env left out). */
  async write(req: CreateSandbox, inst: InstanceInfo, source: InstanceSource): Promise<void> {
    const dir = this.dir(req.sandboxId);
    const file: SandboxFile = {
      req: { ...req, env: {} },
      instance: inst,
      source,
      fromWarmPool: source === 'warm',
      createdAt: Date.now(),
    };
    if (source === 'warm') {
      // The slot's directory, made when it was booted, becomes the sandbox's (see slotDir).
      // The rename synchronously: with the record's write these are the only waits of a warm
      // claim, and inline a local rename blocks the loop for well under a millisecond. The record
      // itself is written durably (temp, fsync, rename, fsync of the folder) off the loop: inline,
      // the two fsyncs blocked it for a median 8 ms (18 ms p90) on a 2-core VM's disk, 4 ms of
      // wall time through the thread pool with the loop free meanwhile (30 writes of a 2 KB
      // record each way, 2026-12-07); a plain write had taken 1.3 ms. A torn record after a full
      // disk or a power cut is the cost it avoids (F6).
      let claimed = true;
      try {
        renameSync(this.slotDir(inst), dir);
      } catch {
        claimed = false;
      }
      if (claimed) {
        await writeFileAtomic(join(dir, 'sandbox.json'), JSON.stringify(file));
        return;
      }
    }
    await this.writeRecord(req.sandboxId, file);
  }

  /**
   * Writes a whole record for sandbox `id` (its folder, marker and `sandbox.json`, atomically): a
   * create that booted its instance, a restore from hibernation, or a record rebuilt by adoption.
   * @throws SpaceError NODE_DISK_FULL.
   */
  async writeRecord(id: string, rec: SandboxFile): Promise<void> {
    const dir = this.dir(id);
    try {
      await mkdir(join(dir, 'commands'), { recursive: true });
      await writeFile(join(dir, markerName(rec.instance.instanceId)), '', { mode: 0o600 });
    } catch (err) {
      throw diskFullError(err, 'a sandbox’s folder');
    }
    await writeFileAtomic(join(dir, 'sandbox.json'), JSON.stringify(rec));
  }

  /**
   * The sandbox's record. A torn one is quarantined (see host/durable-file.ts `readJsonFile`).
   * @throws SpaceError SANDBOX_NOT_FOUND when it has none or it was unreadable; what reading throws.
   */
  async read(id: string): Promise<SandboxFile> {
    const r = await readJsonFile<SandboxFile>(join(this.dir(id), 'sandbox.json'));
    if (r.ok) return r.value;
    throw new SpaceError(
      'SANDBOX_NOT_FOUND',
      r.missing
        ? `no state file for sandbox ${id}`
        : `the state file of sandbox ${id} is unreadable (${r.reason})`,
    );
  }

  /** Rewrites fields of a sandbox's `sandbox.json` (atomically). @throws SpaceError NODE_DISK_FULL. */
  async patch(id: string, patch: Partial<SandboxFile>): Promise<void> {
    const rec = await this.read(id);
    await writeFileAtomic(join(this.dir(id), 'sandbox.json'), JSON.stringify({ ...rec, ...patch }));
  }

  /**
   * Records a started command (`commands/<id>.json`, atomically), for an agent restart to re-adopt
   * it. @throws SpaceError NODE_DISK_FULL.
   */
  async writeCommand(sandboxId: string, cmd: Command): Promise<void> {
    // on every exec's path, and of no use after a power cut (the command dies with its instance):
    // whole or not at all, without the fsyncs
    await writeFileAtomic(
      join(this.dir(sandboxId), 'commands', `${cmd.id}.json`),
      JSON.stringify({ pid: cmd.pid, startedAt: cmd.startedAt, config: cmd.config }),
      { sync: false },
    );
  }

  /**
   * Reopens the sandbox's command spools from its folder into `sb.commands`; the pumps of commands
   * still running resume at the spooled offset (each counted as activity until it ends).
   */
  async adoptCommands(
    sb: LocalSandbox,
    o: { spoolLimitBytes: number; activity: ActivityMeter | null; log: Logger },
  ): Promise<void> {
    const dir = join(this.dir(sb.id), 'commands');
    for (const name of await readdir(dir).catch(() => [] as string[])) {
      if (!name.endsWith('.json')) continue;
      const id = name.slice(0, -'.json'.length);
      const read = await readJsonFile<{
        pid: number;
        startedAt: number;
        /** Absent in records of agents before commands were listed. */
        config?: CommandConfig;
      }>(join(dir, name));
      if (!read.ok) {
        if (!read.missing)
          o.log.warn(
            { [F.sandboxId]: sb.id, [F.commandId]: id, reason: read.reason, quarantined: read.quarantined },
            'a command record was unreadable; quarantined, its command is not re-adopted',
          );
        continue;
      }
      const meta = read.value;
      const spool = await Spool.open(join(dir, `${id}.out`));
      const cmd: Command = {
        id,
        sandboxId: sb.id,
        pid: meta.pid,
        startedAt: meta.startedAt,
        config: meta.config ?? { cmd: '', args: [], env: {} },
        spool,
        exit: null,
        abort: new AbortController(),
        done: Promise.resolve(),
      };
      if (!spool.closed) {
        cmd.done = resumePump(sb.guest, cmd, o.spoolLimitBytes, o.log.child({ [F.sandboxId]: sb.id }));
        const ended = o.activity?.begin(sb.id);
        if (ended) void cmd.done.finally(ended);
      }
      sb.commands.set(id, cmd);
    }
  }
}

const MARKER_PREFIX = 'instance-';

/** The empty file whose name records which instance a sandbox's folder belongs to. */
function markerName(instanceId: string): string {
  return `${MARKER_PREFIX}${instanceId}`;
}
