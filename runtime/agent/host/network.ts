/**
 * Per-sandbox network on one node: a network namespace `sp-<short>` holding `eth0`, the peer of a host
 * veth `spv<short>`, on a /30 from a per-node pool (host end .1, sandbox end .2). No default route in
 * the namespace: sandboxes have no egress until the gateway lands.
 *
 * Host protection (nftables table `inet space`, owned by this module): packets that arrive from any
 * `spv*` interface reach the host only as replies to connections the host opened, or to the
 * gateway's ports; nothing is forwarded to or from a sandbox but what its CIDR rules allow. What a
 * sandbox sends that is not allowed is refused out loud (TCP reset, ICMP unreachable), not dropped
 * (see firewall.ts).
 *
 * State lives in the kernel (namespaces, links, addresses), so {@link SandboxNetworks.adopt} can rebuild
 * the pool after an agent restart and {@link SandboxNetworks.sweep} removes leftovers.
 */
import { readdir, stat, writeFile } from 'node:fs/promises';
import { SpaceError } from '../../core/errors.ts';
import { intToIPv4, ipv4ToInt, isIPv4Cidr, parseIPv4Cidr } from '../../core/net-address.ts';
import { GUEST_NET, type SandboxNetwork, type TapAttachment } from '../drivers/driver.ts';
import {
  baseRuleset,
  type CidrAllow,
  cidrUpdateRuleset,
  type GatewayPorts,
  HOST_IF_PREFIX,
  NFT_TABLE,
  sandboxRuleset,
  sandboxTeardown,
} from './firewall.ts';
import { hostExec } from './host-exec.ts';

const run = hostExec;

/** Prefix of every sandbox network namespace name. */
export const NETNS_PREFIX = 'sp-';
export { HOST_IF_PREFIX, NFT_TABLE };
/** Default per-node address pool. */
export const DEFAULT_POOL = '10.77.0.0/16';

/** Options of {@link SandboxNetworks}. */
export interface NetworkOptions {
  /** IPv4 CIDR the /30s come from (prefix ≤ 30); default {@link DEFAULT_POOL}. */
  pool?: string;
  /** This node's gateway ports; without them sandboxes get no egress at all. */
  gateway?: GatewayPorts | null;
  log?: (msg: string, fields?: Record<string, unknown>) => void;
}

/** Parses `a.b.c.d` to an unsigned 32-bit number. Throws on malformed input. Pure. */
export const ipToInt: (ip: string) => number = ipv4ToInt;

/** Formats an unsigned 32-bit number as `a.b.c.d`. Pure. */
export const intToIp: (n: number) => string = intToIPv4;

/** A parsed pool: network base address (as int) and number of /30 slots. */
export interface Pool {
  base: number;
  slots: number;
}

/** Parses a pool CIDR (`10.77.0.0/16` → 16384 slots). Throws on a bad CIDR or a prefix > 30. Pure. */
export function parsePool(cidr: string): Pool {
  const c = isIPv4Cidr(cidr) ? parseIPv4Cidr(cidr) : undefined;
  if (!c || c.prefix < 8 || c.prefix > 30) throw new Error(`bad pool CIDR ${cidr}`);
  return { base: c.network, slots: 2 ** (30 - c.prefix) };
}

/** Host and sandbox addresses of slot `i` of `pool`. Pure. */
export function slotAddresses(pool: Pool, i: number): { hostAddress: string; sandboxAddress: string } {
  const net = pool.base + i * 4;
  return { hostAddress: intToIp(net + 1), sandboxAddress: intToIp(net + 2) };
}

/** Slot index of a host-end address in `pool`, or undefined when outside it / not a host end. Pure. */
export function slotOfHostAddress(pool: Pool, hostAddress: string): number | undefined {
  const off = ipToInt(hostAddress) - pool.base;
  if (off < 0 || off % 4 !== 1) return undefined;
  const i = (off - 1) / 4;
  return i < pool.slots ? i : undefined;
}

/**
 * Short name part for an instance id (`i-abc123…` → `abc123…`, at most 12 of [a-z0-9]), so that
 * `spv<short>` fits the 15-character interface name limit. Pure. Throws on an id with no usable chars.
 */
export function shortId(instanceId: string): string {
  const s = instanceId
    .replace(/^i-/, '')
    .toLowerCase()
    .replace(/[^a-z0-9]/g, '')
    .slice(-12);
  if (!s) throw new Error(`instance id ${instanceId} has no usable characters`);
  return s;
}

/** The namespace and host interface names of an instance. Pure. */
export function networkNames(instanceId: string): { netns: string; hostIf: string } {
  const s = shortId(instanceId);
  return { netns: `${NETNS_PREFIX}${s}`, hostIf: `${HOST_IF_PREFIX}${s}` };
}

/** Runs a command; throws SpaceError DRIVER_FAILED with its stderr. */
async function sh(cmd: string, args: string[], input?: string): Promise<string> {
  try {
    const { stdout } = await run(cmd, args, {
      maxBuffer: 16 * 1024 * 1024,
      ...(input !== undefined ? { input } : {}),
    });
    return stdout;
  } catch (err) {
    const e = err as { stderr?: string; message: string };
    throw new SpaceError(
      'DRIVER_FAILED',
      `${cmd} ${args.join(' ')}: ${(e.stderr || e.message).trim()}`,
      {},
      {
        cause: err,
      },
    );
  }
}

/** Like {@link sh} but treats "does not exist" errors as success (for idempotent deletes). */
async function shIgnoreMissing(cmd: string, args: string[]): Promise<void> {
  try {
    await sh(cmd, args);
  } catch (err) {
    const m = (err as Error).message;
    if (/Cannot find|No such file|does not exist|not found/i.test(m)) return;
    throw err;
  }
}

/**
 * Removes a sandbox's nftables chains and map elements. One transaction when all exist; after a
 * partial setup, statement by statement, ignoring what is already gone.
 */
async function removeSandboxRules(hostIf: string): Promise<void> {
  const script = sandboxTeardown(hostIf);
  try {
    await sh('nft', ['-f', '-'], script);
  } catch {
    for (const line of script.split('\n').filter(Boolean)) {
      await sh('nft', ['-f', '-'], `${line}\n`).catch(() => {});
    }
  }
}

/**
 * Allocates and releases per-sandbox networks from one pool. One object per agent process.
 * Allocation reserves the slot synchronously (no await between choosing and marking), so any number
 * of concurrent {@link allocate} calls get distinct slots.
 */
export class SandboxNetworks {
  readonly pool: Pool;
  readonly poolCidr: string;
  private readonly used = new Set<number>();
  private readonly log: NonNullable<NetworkOptions['log']>;
  private firewall: Promise<void> | undefined;
  private strangers: Promise<void> | undefined;
  private readonly gateway: GatewayPorts | null;

  /** @throws Error on a malformed pool CIDR. */
  constructor(opts: NetworkOptions = {}) {
    this.poolCidr = opts.pool ?? DEFAULT_POOL;
    this.pool = parsePool(this.poolCidr);
    this.gateway = opts.gateway ?? null;
    this.log = opts.log ?? (() => {});
  }

  /** Creates/refreshes the `inet space` nftables table (once per object). @throws DRIVER_FAILED. */
  ensureFirewall(): Promise<void> {
    this.firewall ??= sh('nft', ['-f', '-'], baseRuleset()).then(
      () => undefined,
      (err) => {
        this.firewall = undefined;
        throw err;
      },
    );
    return this.firewall;
  }

  /** Number of slots in use. */
  get inUse(): number {
    return this.used.size;
  }

  /**
   * Makes the namespace, veth pair and addresses for `instanceId`.
   * @returns the network (netns `sp-<short>`, hostIf `spv<short>`, /30 addresses).
   * @throws SpaceError NODE_CAPACITY_EXHAUSTED (pool full), DRIVER_FAILED (a command failed; partial state
   *   is removed and the slot freed).
   */
  async allocate(instanceId: string): Promise<SandboxNetwork> {
    const { netns, hostIf } = networkNames(instanceId);
    await this.skipStrangers();
    const slot = this.reserveSlot();
    const net: SandboxNetwork = { netns, hostIf, ...slotAddresses(this.pool, slot), prefixLength: 30 };
    try {
      await this.ensureFirewall();
      await sh('ip', ['netns', 'add', netns]);
      await sh('ip', ['link', 'add', hostIf, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', netns]);
      await disableIpv6(hostIf);
      // packets from the sandbox may be forwarded (only its policy's CIDR rules let any through:
      // nftables drops the rest); replies also need forwarding on the uplink, the operator's call
      await writeFile(`/proc/sys/net/ipv4/conf/${hostIf}/forwarding`, '1').catch(() => {});
      await sh('ip', ['addr', 'add', `${net.hostAddress}/30`, 'dev', hostIf]);
      await sh('ip', ['link', 'set', hostIf, 'up']);
      await sh('ip', ['-n', netns, 'addr', 'add', `${net.sandboxAddress}/30`, 'dev', 'eth0']);
      await sh('ip', ['-n', netns, 'link', 'set', 'eth0', 'up']);
      await sh('ip', ['-n', netns, 'link', 'set', 'lo', 'up']);
      // every packet goes to the host end, where nftables and the gateway decide its fate
      await sh('ip', ['-n', netns, 'route', 'add', 'default', 'via', net.hostAddress]);
      await sh('nft', ['-f', '-'], sandboxRuleset({ ...net, gateway: this.gateway, cidrAllows: [] }));
    } catch (err) {
      await this.remove(net).catch(() => {});
      this.used.delete(slot);
      throw err;
    }
    this.log('network allocated', { instanceId, ...net });
    return net;
  }

  /**
   * Gives a VM a tap inside the sandbox's namespace (VM drivers; gVisor uses the veth end itself).
   * The guest always has {@link GUEST_NET}'s addresses; the namespace forwards between them and the
   * sandbox's own address, so the host, its egress rules and the gateway see exactly what they see
   * for a gVisor sandbox, and a snapshot restores into any namespace:
   * - everything arriving for `sandboxAddress` (the agent's guest link, exposed ports) goes to the guest;
   * - the guest's traffic leaves with `sandboxAddress` as its source; any other source is dropped;
   * - DNS sent to the tap's address goes to the host end (where nftables hands it to the gateway);
   * - nothing from the guest reaches the namespace itself.
   * @returns the tap (name, the guest NIC's MAC). @throws SpaceError DRIVER_FAILED (partial state is
   *   removed with the namespace on release).
   */
  async attachTap(net: SandboxNetwork): Promise<TapAttachment> {
    const ns = net.netns;
    const tap = GUEST_NET.tapName;
    await sh('ip', ['-n', ns, 'tuntap', 'add', 'dev', tap, 'mode', 'tap']);
    await sh('ip', ['-n', ns, 'link', 'set', tap, 'address', GUEST_NET.gatewayMac]);
    await sh('ip', [
      '-n',
      ns,
      'addr',
      'add',
      `${GUEST_NET.gatewayAddress}/${GUEST_NET.prefixLength}`,
      'dev',
      tap,
    ]);
    await sh('ip', ['-n', ns, 'link', 'set', tap, 'up']);
    await sh('ip', ['netns', 'exec', ns, 'sysctl', '-qw', 'net.ipv4.ip_forward=1']);
    await sh('ip', ['netns', 'exec', ns, 'nft', '-f', '-'], tapRuleset(net));
    return { name: tap, guestMac: GUEST_NET.guestMac };
  }

  /** Replaces the sandbox's direct CIDR rules (egress policy update). @throws DRIVER_FAILED. */
  async setCidrAllows(net: SandboxNetwork, allows: CidrAllow[]): Promise<void> {
    await sh('nft', ['-f', '-'], cidrUpdateRuleset(net.hostIf, allows));
  }

  /** Deletes veth + namespace and frees the address. Idempotent. @throws DRIVER_FAILED. */
  async release(net: SandboxNetwork): Promise<void> {
    await this.remove(net);
    const slot = slotOfHostAddress(this.pool, net.hostAddress);
    if (slot !== undefined) this.used.delete(slot);
    this.log('network released', { netns: net.netns });
  }

  /**
   * Rebuilds the used set from the kernel: every `spv*` link whose address lies in this pool (after an
   * agent restart). Also ensures the firewall.
   * @returns the networks found (netns derived from the host interface name).
   */
  async adopt(): Promise<SandboxNetwork[]> {
    await this.ensureFirewall();
    const found = (await listHostLinks()).flatMap((l) => {
      const slot = l.address ? slotOfHostAddress(this.pool, l.address) : undefined;
      if (slot === undefined) return [];
      this.used.add(slot);
      return [
        {
          netns: `${NETNS_PREFIX}${l.ifname.slice(HOST_IF_PREFIX.length)}`,
          hostIf: l.ifname,
          ...slotAddresses(this.pool, slot),
          prefixLength: 30,
        },
      ];
    });
    // (re)install each adopted sandbox's rules: the base chains may have been rewritten by a newer
    // agent, and a sandbox without its map elements would be cut off from the host entirely. Its
    // CIDR rules stay until its policy is applied again: emptied, they would reset its connections
    for (const net of found) {
      await sh('nft', ['-f', '-'], sandboxRuleset({ ...net, gateway: this.gateway, cidrAllows: 'keep' }));
    }
    return found;
  }

  /**
   * Removes every `sp-*` namespace and `spv*` link whose namespace name is not in `keep`, except those
   * whose host address belongs to another pool (another agent's). Frees their slots.
   * @param keep namespace names (`SandboxNetwork.netns`) to leave alone.
   * @returns names of the namespaces removed.
   */
  async sweep(keep: Iterable<string>): Promise<string[]> {
    const keepSet = new Set(keep);
    // chains are listed before links: a sandbox allocated in between has its link by the time
    // links are listed, so its fresh chains are never taken for a vanished interface's
    const chainIfs = await listSandboxChainInterfaces();
    const links = await listHostLinks();
    const foreign = new Set<string>();
    for (const l of links) {
      if (l.address && slotOfHostAddress(this.pool, l.address) === undefined) {
        foreign.add(`${NETNS_PREFIX}${l.ifname.slice(HOST_IF_PREFIX.length)}`);
      }
    }
    const names = new Set([
      ...(await listNetns()),
      ...links.map((l) => `${NETNS_PREFIX}${l.ifname.slice(HOST_IF_PREFIX.length)}`),
    ]);
    const removed: string[] = [];
    for (const netns of names) {
      if (keepSet.has(netns) || foreign.has(netns)) continue;
      const hostIf = `${HOST_IF_PREFIX}${netns.slice(NETNS_PREFIX.length)}`;
      const link = links.find((l) => l.ifname === hostIf);
      // unless its address shows it is ours, a young namespace may be another agent's allocation
      // in progress (netns made, veth not yet, or veth without its address yet)
      const ours = link?.address !== undefined && slotOfHostAddress(this.pool, link.address) !== undefined;
      if (!ours && (await isYoung(`/var/run/netns/${netns}`))) continue;
      await this.remove({ netns, hostIf, hostAddress: '', sandboxAddress: '', prefixLength: 30 });
      const slot = link?.address ? slotOfHostAddress(this.pool, link.address) : undefined;
      if (slot !== undefined) this.used.delete(slot);
      removed.push(netns);
    }
    // per-sandbox nftables chains whose interface no longer exists at all (an agent killed mid-way):
    // nobody's sandbox, whatever its pool
    const live = new Set((await listAllLinks()).map((l) => l.ifname));
    for (const hostIf of chainIfs) {
      if (!live.has(hostIf)) await removeSandboxRules(hostIf);
    }
    if (removed.length) this.log('network sweep removed', { removed });
    return removed;
  }

  /**
   * Once per object, before its first allocation: marks as used every slot whose host address is
   * already on an `spv*` link this object did not make or adopt (a namespace left by a process killed mid-way,
   * another pool overlapping this one). Two links with one address split the /30's route, so a
   * sandbox given such a slot is unreachable; {@link sweep} frees the slot when it removes the link.
   * A failed listing is retried at the next allocation.
   */
  private skipStrangers(): Promise<void> {
    this.strangers ??= listHostLinks().then(
      (links) => {
        for (const l of links) {
          const slot = l.address ? slotOfHostAddress(this.pool, l.address) : undefined;
          // adopted networks are already in `used`
          if (slot === undefined || this.used.has(slot)) continue;
          this.used.add(slot);
          this.log('address slot skipped: already on the host', { hostIf: l.ifname, address: l.address });
        }
      },
      (err: unknown) => {
        this.strangers = undefined;
        throw err;
      },
    );
    return this.strangers;
  }

  private reserveSlot(): number {
    for (let i = 0; i < this.pool.slots; i++) {
      if (!this.used.has(i)) {
        this.used.add(i);
        return i;
      }
    }
    throw new SpaceError('NODE_CAPACITY_EXHAUSTED', `address pool ${this.poolCidr} is full`, {
      pool: this.poolCidr,
    });
  }

  private async remove(net: SandboxNetwork): Promise<void> {
    await removeSandboxRules(net.hostIf);
    await shIgnoreMissing('ip', ['link', 'del', net.hostIf]);
    await shIgnoreMissing('ip', ['netns', 'del', net.netns]);
  }
}

/**
 * The nftables script (table `ip space_vm`, inside the sandbox's namespace) that joins a VM's tap to
 * the namespace's veth end: see {@link SandboxNetworks.attachTap}. Pure.
 */
export function tapRuleset(net: Pick<SandboxNetwork, 'sandboxAddress' | 'hostAddress'>): string {
  const g = GUEST_NET;
  return [
    'table ip space_vm {',
    '  chain pre {',
    '    type nat hook prerouting priority dstnat; policy accept;',
    `    iifname "eth0" ip daddr ${net.sandboxAddress} dnat to ${g.guestAddress}`,
    `    iifname "${g.tapName}" ip daddr ${g.gatewayAddress} meta l4proto { tcp, udp } th dport 53 dnat to ${net.hostAddress}`,
    '  }',
    '  chain vm_forward {',
    '    type filter hook forward priority 0; policy drop;',
    `    iifname "${g.tapName}" oifname "eth0" ip saddr ${g.guestAddress} accept`,
    `    iifname "eth0" oifname "${g.tapName}" ip daddr ${g.guestAddress} accept`,
    '  }',
    '  chain vm_input {',
    '    type filter hook input priority 0; policy accept;',
    `    iifname "${g.tapName}" drop`,
    '  }',
    '  chain post {',
    '    type nat hook postrouting priority srcnat; policy accept;',
    `    oifname "eth0" ip saddr ${g.guestAddress} snat to ${net.sandboxAddress}`,
    '  }',
    '}',
    '',
  ].join('\n');
}

/** Namespaces younger than this are left to whoever is making them (ms). */
const SWEEP_MIN_AGE_MS = 60_000;

/** Whether `path` was made less than {@link SWEEP_MIN_AGE_MS} ago (false when it is gone). */
async function isYoung(path: string): Promise<boolean> {
  const st = await stat(path).catch(() => null);
  return st !== null && Date.now() - st.mtimeMs < SWEEP_MIN_AGE_MS;
}

/** Every link name on the host. */
async function listAllLinks(): Promise<{ ifname: string }[]> {
  return JSON.parse((await sh('ip', ['-j', 'link', 'show'])) || '[]') as { ifname: string }[];
}

/** Host interfaces that have per-sandbox chains in the table (`raw_spv…` etc.). */
async function listSandboxChainInterfaces(): Promise<string[]> {
  const out = await sh('nft', ['-j', 'list', 'chains', 'inet']).catch(() => '{"nftables":[]}');
  const items = (JSON.parse(out) as { nftables: { chain?: { table: string; name: string } }[] }).nftables;
  const names = new Set<string>();
  for (const i of items) {
    const m =
      i.chain?.table === NFT_TABLE ? /^(?:raw|nat|in|fwd|rep)_(spv[a-z0-9]+)$/.exec(i.chain.name) : null;
    if (m) names.add(m[1]!);
  }
  return [...names];
}

/** `spv*` links on the host with their first IPv4 address. */
async function listHostLinks(): Promise<{ ifname: string; address?: string }[]> {
  const out = await sh('ip', ['-j', '-4', 'addr', 'show']);
  const links = JSON.parse(out || '[]') as { ifname: string; addr_info?: { local?: string }[] }[];
  const withAddr = links
    .filter((l) => l.ifname.startsWith(HOST_IF_PREFIX))
    .map((l) => ({ ifname: l.ifname, address: l.addr_info?.[0]?.local }));
  // `ip -4 addr` omits links without an IPv4 address; add them from the plain link list.
  const all = JSON.parse((await sh('ip', ['-j', 'link', 'show'])) || '[]') as { ifname: string }[];
  for (const l of all) {
    if (l.ifname.startsWith(HOST_IF_PREFIX) && !withAddr.some((w) => w.ifname === l.ifname)) {
      withAddr.push({ ifname: l.ifname.split('@')[0]!, address: undefined });
    }
  }
  return withAddr;
}

/** Names of `sp-*` network namespaces (from /var/run/netns). */
export async function listNetns(): Promise<string[]> {
  const entries = await readdir('/var/run/netns').catch(() => [] as string[]);
  return entries.filter((n) => n.startsWith(NETNS_PREFIX));
}

async function disableIpv6(ifname: string): Promise<void> {
  await writeFile(`/proc/sys/net/ipv6/conf/${ifname}/disable_ipv6`, '1').catch(() => {});
}
