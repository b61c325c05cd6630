/**
 * The rehearsal's private network: a namespace with a bridge (the cloud's VPC), a veth pair to the
 * host (where the registry, apt cache and load balancer stand-ins listen), and one tap per VM.
 * The namespace has no default route: a VM reaches the host's veth address and the other VMs,
 * nothing else (the host's own forwarding never sees a packet for another destination).
 */
import { REHEARSAL_NET, run } from './host.ts';

const N = REHEARSAL_NET;
const HOST_VETH = 'rh-host';
const NS_VETH = 'rh-ns';

function nsIp(args: readonly string[]): Promise<string> {
  return run('ip', ['-n', N.namespace, ...args]);
}

/** Removes what `createNetwork` made (idempotent; nothing made is not an error). */
export async function destroyNetwork(): Promise<void> {
  await run('ip', ['link', 'del', HOST_VETH]).catch(() => undefined);
  await run('ip', ['netns', 'del', N.namespace]).catch(() => undefined);
}

/**
 * Makes the namespace, bridge and veth pair (replacing leftovers of an earlier run). Throws when
 * `ip` refuses (not root, or the names are taken by something else).
 */
export async function createNetwork(): Promise<void> {
  await destroyNetwork();
  await run('ip', ['netns', 'add', N.namespace]);
  await nsIp(['link', 'set', 'lo', 'up']);
  await nsIp(['link', 'add', N.bridge, 'type', 'bridge']);
  await nsIp(['addr', 'add', `${N.gateway}/24`, 'dev', N.bridge]);
  await nsIp(['link', 'set', N.bridge, 'up']);
  await run('ip', ['link', 'add', HOST_VETH, 'type', 'veth', 'peer', 'name', NS_VETH]);
  await run('ip', ['link', 'set', NS_VETH, 'netns', N.namespace]);
  await run('ip', ['addr', 'add', `${N.hostAddress}/30`, 'dev', HOST_VETH]);
  await run('ip', ['link', 'set', HOST_VETH, 'up']);
  await nsIp(['addr', 'add', `${N.namespaceAddress}/30`, 'dev', NS_VETH]);
  await nsIp(['link', 'set', NS_VETH, 'up']);
  await run('ip', ['route', 'replace', N.privateCidr, 'via', N.namespaceAddress, 'dev', HOST_VETH]);
  await run('ip', ['netns', 'exec', N.namespace, 'sysctl', '-q', '-w', 'net.ipv4.ip_forward=1']);
}

/** Makes tap `name` on the bridge (QEMU opens it with `-netdev tap,ifname=name`). */
export async function createTap(name: string): Promise<void> {
  await nsIp(['tuntap', 'add', 'dev', name, 'mode', 'tap']);
  await nsIp(['link', 'set', name, 'master', N.bridge]);
  await nsIp(['link', 'set', name, 'up']);
}

/** Command prefix that runs a program inside the rehearsal's namespace. */
export function inNamespace(cmd: string, args: readonly string[]): [string, string[]] {
  return ['nsenter', [`--net=/var/run/netns/${N.namespace}`, '--', cmd, ...args]];
}
