/**
 * Positive controls for the harness's leftover check (`leftovers()` in stack.ts): each kind of
 * leftover is planted for a stand-in stack (its own folder, pool and instance id) and must be
 * found; once removed, the check must come back clean. Without these, a check that looks in the
 * wrong place passes whatever the agent leaves behind.
 */
import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdir, mkdtemp, rm, rmdir } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, describe, expect, it } from 'vitest';
import { NFT_TABLE } from '../runtime/agent/host/firewall.ts';
import { networkNames } from '../runtime/agent/host/network.ts';
import { leftovers, NO_LEFTOVERS, waitFor } from './stack.ts';

const run = promisify(execFile);
const cleanups: (() => Promise<unknown>)[] = [];
afterAll(async () => {
  for (const c of cleanups.reverse()) await c().catch(() => {});
});

describe('leftover check', () => {
  it('finds each planted leftover (link, netns, cgroup, chain, mount, runsc, VMM, process) and nothing once they are gone', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'space-stack-'));
    cleanups.push(() => rm(dir, { recursive: true, force: true }));
    // 10.98/16: outside the test stacks' pools (10.100–10.197) and the suites' upstreams
    const fake = {
      dir,
      pool: '10.98.0.0/16',
      instanceIds: new Set([`i-lo${randomBytes(4).toString('hex')}`]),
    };
    const id = [...fake.instanceIds][0]!;
    const { netns, hostIf } = networkNames(id);
    expect(await leftovers(fake)).toEqual(NO_LEFTOVERS);

    await run('ip', ['netns', 'add', netns]);
    cleanups.push(() => run('ip', ['netns', 'del', netns]));
    await run('ip', ['link', 'add', hostIf, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', netns]);
    cleanups.push(() => run('ip', ['link', 'del', hostIf]));
    await run('ip', ['addr', 'add', '10.98.0.1/30', 'dev', hostIf]);
    const cg = `/sys/fs/cgroup/pids/space/${id}`;
    await mkdir(cg, { recursive: true });
    cleanups.push(() => rmdir(cg));
    await run('nft', ['add', 'table', 'inet', NFT_TABLE]);
    await run('nft', ['add', 'chain', 'inet', NFT_TABLE, `raw_${hostIf}`]);
    cleanups.push(() => run('nft', ['delete', 'chain', 'inet', NFT_TABLE, `raw_${hostIf}`]));
    await mkdir(join(dir, 'm'));
    await run('mount', ['-t', 'tmpfs', '-o', 'size=1m', 'space-leftover', join(dir, 'm')]);
    cleanups.push(() => run('umount', [join(dir, 'm')]));
    const procs: ChildProcess[] = ['runsc', 'qemu-system-x86_64', 'other'].map((name) =>
      // argv[0] names the kind; the stack's folder is on the command line, as the agent's would be
      spawn('bash', ['-c', `exec -a "${name} --root=$0" sleep 300`, join(dir, 'runsc')], { stdio: 'ignore' }),
    );
    for (const p of procs) cleanups.push(async () => p.kill('SIGKILL'));
    await waitFor('planted processes', async () =>
      (await leftovers(fake)).processes.length > 0 ? true : undefined,
    );

    const found = await leftovers(fake);
    expect(found.links).toEqual([hostIf]);
    expect(found.netns).toEqual([netns]);
    expect(found.cgroups).toContain(`pids/space/${id}`);
    expect(found.chains).toEqual([`raw_${hostIf}`]);
    expect(found.mounts).toEqual([join(dir, 'm')]);
    expect(found.runsc).toHaveLength(1);
    expect(found.vmms).toHaveLength(1);
    expect(found.processes).toHaveLength(1);

    for (const c of cleanups.splice(1).reverse()) await c();
    await waitFor('planted processes to go', async () =>
      (await leftovers(fake)).processes.length === 0 && (await leftovers(fake)).runsc.length === 0
        ? true
        : undefined,
    );
    expect(await leftovers(fake)).toEqual(NO_LEFTOVERS);
  });
});
