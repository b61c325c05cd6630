/**
 * The far side's network of an int test (the attack suite's world, R24's far server, R14's package
 * index): a network namespace of the test's own, joined to the host by a veth pair. The test puts
 * its servers in the namespace; the host end is the node's way there.
 */
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { writeFile } from 'node:fs/promises';
import { promisify } from 'node:util';

const run = promisify(execFile);

/** A namespace and the two ends of the veth pair into it. */
export interface WorldLink {
  /** The network namespace (`ip netns` name). */
  ns: string;
  /** The host end of the veth pair. */
  hostIf: string;
  /** The namespace's end of the veth pair. */
  nsIf: string;
}

/**
 * Fresh names with a random 4-hex-digit tag: `<prefix>-<tag>`, `<prefix>h<tag>`, `<prefix>n<tag>`
 * (so concurrent runs do not collide). `prefix` is short: an interface name holds at most 15 bytes
 * (IFNAMSIZ 16 with its NUL, linux/if.h).
 */
export function worldLinkNames(prefix: string): WorldLink {
  const tag = randomBytes(2).toString('hex');
  return { ns: `${prefix}-${tag}`, hostIf: `${prefix}h${tag}`, nsIf: `${prefix}n${tag}` };
}

/**
 * Makes `link`: adds the namespace and the veth pair, gives the host end `hostCidr` and the
 * namespace's end each of `nsCidrs` (CIDR notation, e.g. `10.198.250.1/24`), and sets both ends and
 * the namespace's loopback up. With `routed`, the host end forwards IPv4 (replies to sandboxes'
 * direct, CIDR-rule connections come back on it and go on to the sandbox) and neither end has
 * IPv6. Pushes the undo of the namespace and of the pair onto `cleanups`, for the caller to run in
 * reverse order.
 * @throws Error from `ip` (its stderr) when a step fails, e.g. "File exists" for a leftover of a
 *   killed run; each `ip` call is bounded at 15 s.
 */
export async function makeWorldLink(
  link: WorldLink,
  opts: { hostCidr: string; nsCidrs: string[]; routed?: boolean },
  cleanups: (() => Promise<unknown>)[],
): Promise<void> {
  const ip = (args: string[]) => run('ip', args, { timeout: 15_000 });
  const { ns, hostIf, nsIf } = link;
  await ip(['netns', 'add', ns]);
  cleanups.push(() => run('ip', ['netns', 'del', ns]));
  await ip(['link', 'add', hostIf, 'type', 'veth', 'peer', 'name', nsIf, 'netns', ns]);
  cleanups.push(() => run('ip', ['link', 'del', hostIf]));
  if (opts.routed) {
    await writeFile(`/proc/sys/net/ipv6/conf/${hostIf}/disable_ipv6`, '1');
    await writeFile(`/proc/sys/net/ipv4/conf/${hostIf}/forwarding`, '1');
  }
  await ip(['addr', 'add', opts.hostCidr, 'dev', hostIf]);
  await ip(['link', 'set', hostIf, 'up']);
  if (opts.routed) await ip(['netns', 'exec', ns, 'sysctl', '-qw', 'net.ipv6.conf.all.disable_ipv6=1']);
  for (const cidr of opts.nsCidrs) await ip(['-n', ns, 'addr', 'add', cidr, 'dev', nsIf]);
  await ip(['-n', ns, 'link', 'set', nsIf, 'up']);
  await ip(['-n', ns, 'link', 'set', 'lo', 'up']);
}
