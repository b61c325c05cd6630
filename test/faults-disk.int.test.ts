/**
 * Fault case F6 (`npm run test:faults`): the node's state disk fills up. The agent's `sandboxes/`
 * folder (state files, command records and spools) is a small tmpfs of its own; three sandboxes
 * stream output and a fourth is paused when a file fills that disk to ENOSPC. The agent must stay
 * up, the sandboxes keep running (a command fails with NODE_DISK_FULL, not a crash), no state
 * file is left empty or torn, the node stops taking sandboxes and says so in its heartbeat; once
 * the space is freed a restarted agent re-adopts every sandbox and nothing is declared lost. The
 * variant plants torn state files (as an older agent left them on a full disk) before a start.
 */
import { open, readdir, readFile, rm, truncate, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { request } from 'undici';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { keys } from '../runtime/core/redis-keys.ts';
import {
  converged,
  createSandbox,
  type FaultStack,
  finished as operationEnd,
  report,
  restartParts,
  runCommand,
  sandboxRecord,
  startFaultStack,
  stopFaultStack,
} from './fault-stack.ts';
import { collect, readEvents, waitFor } from './stack.ts';

/** Size of the tmpfs under the agent's `sandboxes/` folder. */
const DISK_BYTES = 16 * 2 ** 20;

describe('faults: the node disk', { timeout: 300_000 }, () => {
  let s: FaultStack;
  const sandboxesDir = () => join(s.dir, 'agent', 'sandboxes');
  const filler = () => join(sandboxesDir(), 'filler');

  // the node must take sandboxes again after a case that filled its disk
  const create = () => createSandbox(s, { schedulable: true });
  const record = (id: string) => sandboxRecord(s, id);
  const finished = (opId: string) => operationEnd(s, opId);

  /** Starts `sh -c script`; returns the API's answer (status, body). */
  function command(id: string, script: string) {
    return s.call<{ stream: { url: string; token: string }; error?: { code: string } }>(
      'POST',
      `/v1/sandboxes/${id}/commands`,
      { cmd: 'sh', args: ['-c', script] },
    );
  }

  /** Runs `echo ok` and reads its output to the exit. */
  async function echo(id: string): Promise<{ stdout: string; exitCode: number | null }> {
    const r = await runCommand(s, id, 'echo', ['ok']);
    if (r.status !== 201) throw new Error(`command in ${id}: ${r.status} ${r.code}`);
    return { stdout: r.stdout, exitCode: r.exitCode };
  }

  /** Every JSON state file under the sandboxes folder that is empty or does not parse. */
  async function tornStateFiles(): Promise<string[]> {
    const bad: string[] = [];
    const walk = async (d: string): Promise<void> => {
      for (const e of await readdir(d, { withFileTypes: true }).catch(() => [])) {
        const p = join(d, e.name);
        if (e.isDirectory()) await walk(p);
        else if (e.name.endsWith('.json') || e.name.includes('.json.tmp-')) {
          const text = await readFile(p, 'utf8');
          try {
            JSON.parse(text);
            if (e.name.includes('.tmp-')) bad.push(`${p} (temporary file left)`);
          } catch {
            bad.push(`${p} (${text.length} bytes)`);
          }
        }
      }
    };
    await walk(sandboxesDir());
    return bad;
  }

  /** Writes to a file on the small disk until it is full (ENOSPC); returns the bytes written. */
  async function fillDisk(): Promise<number> {
    const fh = await open(filler(), 'w');
    const chunk = Buffer.alloc(64 * 1024, 1);
    let written = 0;
    try {
      // bounded: the disk holds DISK_BYTES at most
      for (let i = 0; i < DISK_BYTES / chunk.length + 16; i++) {
        const { bytesWritten } = await fh.write(chunk);
        written += bytesWritten;
      }
      throw new Error(`the disk took ${written} bytes and is still not full`);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOSPC') throw err;
    } finally {
      await fh.close();
    }
    return written;
  }

  beforeAll(async () => {
    s = await startFaultStack(
      {
        // the floor under which the node takes no new sandboxes: 2 MiB of the small disk
        SPACE_DISK_RESERVE_BYTES: String(2 * 2 ** 20),
        SPACE_DISK_RESERVE_PERCENT: '0',
        SPACE_NODE_LOST_GRACE_MS: '20000',
      },
      { tmpfs: [{ under: 'sandboxes', sizeBytes: DISK_BYTES }] },
    );
  });
  afterEach(async () => {
    await rm(filler(), { force: true }).catch(() => {});
    await restartParts(s);
  });
  afterAll(() => stopFaultStack(s));

  it('f6-disk-full: the agent stays up, sandboxes keep running, no torn state, a clean restart after', async () => {
    const streaming = [await create(), await create(), await create()];
    const paused = await create();
    const pause = await s.call<{ operation: { id: string } }>('POST', `/v1/sandboxes/${paused}/pause`, {
      mode: 'frozen',
    });
    expect(pause.status).toBe(202);
    expect((await finished(pause.body.operation.id)).state).toBe('succeeded');
    // three commands printing a line every 20 ms: their spools grow while the disk fills
    const streams = [];
    for (const id of streaming) {
      const res = await command(id, 'i=0; while :; do echo line-$i; i=$((i+1)); sleep 0.02; done');
      expect(res.status).toBe(201);
      streams.push(res.body.stream);
    }
    await new Promise((r) => setTimeout(r, 1000));

    const agentPid = s.proc('agent').pid;
    const filled = await fillDisk();
    // the spools and the heartbeat meet the full disk
    await new Promise((r) => setTimeout(r, 3000));
    expect(s.running('agent')).toBe(true);
    expect(s.proc('agent').pid).toBe(agentPid);

    // each streaming command ended with the coded error (its output had nowhere to go)
    const ends = await Promise.all(
      streams.map(
        async (st) => collect(await readEvents(st.url, st.token)).exit as Record<string, unknown> | null,
      ),
    );
    for (const exit of ends) expect(exit).toMatchObject({ errorCode: 'NODE_DISK_FULL' });
    // a new command is refused with the code, and the sandbox still runs
    const refused = await command(streaming[0]!, 'echo hi');
    expect(refused.status).toBe(507);
    expect(refused.body.error?.code).toBe('NODE_DISK_FULL');
    for (const id of [...streaming, paused]) expect((await record(id)).state).not.toBe('killed');
    expect(await tornStateFiles()).toEqual([]);
    // the node says it is under its floor and takes no new sandboxes
    const pressed = await waitFor(
      'the heartbeat to report disk pressure',
      async () => {
        const [p, sched, free] = await s.redis.hmget(
          keys.node(s.nodeId),
          'diskPressure',
          'schedulable',
          'diskFreeBytes',
        );
        return p === '1' && sched === '0' ? Number(free) : undefined;
      },
      15_000,
    );
    // and its metrics show the headroom
    const metrics = await (await request(`${s.agentUrl}/metrics`)).body.text();
    const metric = (name: string) =>
      Number(
        metrics
          .split('\n')
          .find((l) => l.startsWith(`${name} `))
          ?.split(' ')[1],
      );
    expect(metric('space_agent_state_disk_pressure')).toBe(1);
    expect(metric('space_agent_state_disk_total_bytes')).toBe(DISK_BYTES);
    expect(metric('space_agent_state_disk_free_bytes')).toBeLessThan(2 * 2 ** 20);

    // space freed; the agent restarted (kill -9, as a crash-looping one would be)
    await rm(filler(), { force: true });
    await waitFor(
      'the heartbeat to report room again',
      async () => ((await s.redis.hget(keys.node(s.nodeId), 'diskPressure')) === '0' ? true : undefined),
      15_000,
    );
    await s.kill('agent');
    const t0 = Date.now();
    await s.start('agent');
    const restartMs = Date.now() - t0;
    expect((await s.inventory()).sort()).toEqual([...streaming, paused].sort());
    const agreed = await converged(s);
    expect(agreed.sort()).toEqual([...streaming, paused].sort());
    for (const id of streaming) {
      expect(await record(id)).toMatchObject({ state: 'running', killReason: null });
      expect(await echo(id)).toEqual({ stdout: 'ok\n', exitCode: 0 });
    }
    expect(await record(paused)).toMatchObject({ state: 'paused', killReason: null });
    expect(await tornStateFiles()).toEqual([]);
    report('f6-disk-full', {
      filledBytes: filled,
      freeAtPressure: pressed,
      commandsEnded: ends.map((e) => e?.errorCode),
      refusedWith: `${refused.status} ${refused.body.error?.code}`,
      restartMs,
      lost: 0,
    });
    for (const id of [...streaming, paused]) await s.call('DELETE', `/v1/sandboxes/${id}`);
  });

  it('f6-torn-state-file: a torn or empty state file is quarantined and the agent starts and re-adopts', async () => {
    const [a, b, c] = [await create(), await create(), await create()];
    const cmd = await command(c, 'echo before');
    expect(cmd.status).toBe(201);
    collect(await readEvents(cmd.body.stream.url, cmd.body.stream.token));
    await s.kill('agent');
    // what an older agent left on a full disk: an empty record (a), a torn one (b), and an empty
    // command record beside a whole sandbox record (c: "Unexpected end of JSON input" at each start)
    await truncate(join(sandboxesDir(), a, 'sandbox.json'), 0);
    const text = await readFile(join(sandboxesDir(), b, 'sandbox.json'), 'utf8');
    await writeFile(join(sandboxesDir(), b, 'sandbox.json'), text.slice(0, Math.floor(text.length / 2)));
    const commandsOfC = join(sandboxesDir(), c, 'commands');
    const cmdRecords = (await readdir(commandsOfC)).filter((n) => n.endsWith('.json'));
    expect(cmdRecords).toHaveLength(1);
    await truncate(join(commandsOfC, cmdRecords[0]!), 0);

    await s.start('agent');
    // (a failed case before may have left its sandboxes: these must be among them)
    expect(await s.inventory()).toEqual(expect.arrayContaining([a, b, c]));
    await converged(s);
    for (const id of [a, b, c]) {
      expect(await record(id)).toMatchObject({ state: 'running', killReason: null });
      expect(await echo(id)).toEqual({ stdout: 'ok\n', exitCode: 0 });
    }
    // the torn files sit aside for an operator; the records were written again, whole
    const bad = async (d: string) => (await readdir(d)).filter((n) => n.includes('.json.bad-'));
    const quarantined = [
      ...(await bad(join(sandboxesDir(), a))),
      ...(await bad(join(sandboxesDir(), b))),
      ...(await bad(commandsOfC)),
    ];
    expect(quarantined).toHaveLength(3);
    expect(await tornStateFiles()).toEqual([]);
    report('f6-torn-state-file', { quarantined: quarantined.length, readopted: 3, lost: 0 });
    for (const id of [a, b, c]) await s.call('DELETE', `/v1/sandboxes/${id}`);
  });
});
