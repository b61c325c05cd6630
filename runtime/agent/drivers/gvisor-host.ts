/**
 * The gVisor driver's host steps (gvisor.ts runs them): commands run through the host-exec helper,
 * the namespace address runsc takes and a failed start gives back, unmounting an instance's
 * overlay and disk, and removing its cgroups.
 */
import { existsSync } from 'node:fs';
import { readdir, readFile, rmdir } from 'node:fs/promises';
import { join } from 'node:path';
import { hostExec } from '../host/host-exec.ts';
import type { SandboxNetwork } from './driver.ts';

/** Runs `cmd args` on the host (host-exec.ts). Returns stdout. @throws Error naming the command and its stderr. */
export async function sh(cmd: string, args: string[]): Promise<string> {
  try {
    return (await hostExec(cmd, args)).stdout;
  } catch (err) {
    const e = err as { stderr?: string; message: string };
    throw new Error(`${cmd} ${args.join(' ')}: ${(e.stderr || e.message).trim()}`);
  }
}

/**
 * Puts the sandbox's address and default route back on the namespace's `eth0`. runsc moves them into
 * its own network stack when it starts (removing them from the kernel interface), so after a failed
 * start the namespace would be left without them and the next start on it would have no IPv4 address.
 * Idempotent (`replace`). @throws Error when `ip` fails.
 */
export async function giveBackAddress(net: SandboxNetwork): Promise<void> {
  const ns = net.netns;
  await sh('ip', ['-n', ns, 'addr', 'replace', `${net.sandboxAddress}/${net.prefixLength}`, 'dev', 'eth0']);
  await sh('ip', ['-n', ns, 'route', 'replace', 'default', 'via', net.hostAddress]);
}

export async function unmountIfMounted(path: string): Promise<void> {
  const mounts = await readFile('/proc/self/mountinfo', 'utf8');
  if (!mounts.split('\n').some((l) => l.split(' ')[4] === path)) return;
  await sh('umount', [path]).catch(() => sh('umount', ['-l', path]));
}

/** Removes `/sys/fs/cgroup/<controller>/space/<id>` in every v1 hierarchy (and the unified one). */
export async function removeCgroups(instanceId: string): Promise<void> {
  for (const ctrl of await readdir('/sys/fs/cgroup').catch(() => [] as string[])) {
    const p = join('/sys/fs/cgroup', ctrl, 'space', instanceId);
    if (existsSync(p)) await rmdir(p).catch(() => {});
  }
}
