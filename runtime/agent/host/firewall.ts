/**
 * The packet layer of egress enforcement: nftables scripts for the table `inet space` (see
 * runtime/gateway/DESIGN.md). Pure functions that build `nft -f` scripts; `network.ts` applies them.
 *
 * Base chains (shared by every agent on the host, rewritten identically by each):
 * - `raw_pre` (prerouting, priority raw — before conntrack and NAT): from any sandbox interface,
 *   drop IPv6; jump to the interface's own chain via the map `raw_map`; drop what no sandbox
 *   owns. The per-sandbox chain accepts only the sandbox's own source address (anti-spoofing:
 *   the gateway attributes connections by source address).
 * - `nat_pre` (prerouting, dstnat): per-sandbox chain (`nat_map`) redirects DNS (udp/tcp 53),
 *   HTTP (tcp 80) and TLS (tcp 443) to this node's gateway ports — whatever address the sandbox
 *   aimed at. Without a gateway the chain is empty: no egress at all.
 * - `input`: replies to connections the host opened; new connections only to the gateway ports
 *   (per-sandbox chain via `input_map`); everything else from a sandbox is refused (below).
 * - `forward`: from a sandbox, only its policy CIDR rules (`forward_map`), masqueraded in
 *   `nat_post`, checked on every packet (not only the first); everything else from a sandbox is
 *   refused (other sandboxes, the LAN, metadata…). The per-sandbox chain refuses connections into
 *   any sandbox interface and to 169.254.0.0/16 before its CIDR accepts, so no policy CIDR opens
 *   those. To a sandbox: only replies from an address and port its CIDR rules allow now
 *   (`reply_map`), and ICMP errors related to its connections; a reply on a TCP connection no rule
 *   allows any more is answered with a reset, so removing a rule closes what it had allowed
 *   (both ends) instead of leaving it half open. Anything else to a sandbox is dropped.
 *
 * Refused (R24): a sandbox's TCP gets a reset (the client sees "connection refused" at once), its
 * UDP an ICMP port unreachable, anything else an ICMP administratively prohibited — never a
 * silent drop, which leaves clients waiting for their own timeouts (ssh, git, database clients
 * hung ~127 s). Drops stay where answering would be wrong: IPv6 and forged sources (`raw_pre`,
 * where the answer would go to the forged address) and packets to a sandbox.
 *
 * Each sandbox's chains are named after its host interface (`raw_<if>`, `nat_<if>`, `in_<if>`,
 * `fwd_<if>`, `rep_<if>`) and are removed with their map elements on release.
 */
/** Prefix of every host-side sandbox interface name. */
export const HOST_IF_PREFIX = 'spv';
/** The nftables table the agent owns. */
export const NFT_TABLE = 'space';

/** The node gateway's listening ports. */
export interface GatewayPorts {
  dns: number;
  http: number;
  tls: number;
}

/** A policy CIDR rule: direct TCP from the sandbox to `cidr` on `ports`. */
export interface CidrAllow {
  cidr: string;
  ports: number[];
}

const T = `inet ${NFT_TABLE}`;
/** Per-sandbox chain prefix and the verdict map (keyed by the host interface) that jumps to it. */
const HOOKS = [
  ['raw', 'raw_map'],
  ['nat', 'nat_map'],
  ['in', 'input_map'],
  ['fwd', 'forward_map'],
  ['rep', 'reply_map'],
] as const;

/**
 * Rules (after `prefix`, e.g. `add rule inet space input iifname "spv*"`) that refuse a packet
 * from a sandbox out loud: TCP reset (RFC 9293 §3.10.7.1: a segment for no connection is answered
 * with RST), UDP an ICMP port unreachable (RFC 1122 §4.1.3.1), anything else ICMP
 * administratively prohibited (RFC 1812 §5.2.7.1). Pure.
 */
function refuse(prefix: string): string[] {
  return [
    `${prefix} meta l4proto tcp counter reject with tcp reset`,
    `${prefix} meta l4proto udp counter reject with icmpx type port-unreachable`,
    `${prefix} counter reject with icmpx type admin-prohibited`,
  ];
}

/** Script that creates (idempotently) the table, maps and base chains. Pure. */
export function baseRuleset(): string {
  const any = `iifname "${HOST_IF_PREFIX}*"`;
  const anyOut = `oifname "${HOST_IF_PREFIX}*"`;
  return [
    `add table ${T}`,
    ...HOOKS.map(([, map]) => `add map ${T} ${map} { type ifname : verdict; }`),
    `add chain ${T} raw_pre { type filter hook prerouting priority raw; policy accept; }`,
    `add chain ${T} nat_pre { type nat hook prerouting priority dstnat; policy accept; }`,
    `add chain ${T} input { type filter hook input priority 0; policy accept; }`,
    `add chain ${T} forward { type filter hook forward priority 0; policy accept; }`,
    `add chain ${T} nat_post { type nat hook postrouting priority srcnat; policy accept; }`,
    ...['raw_pre', 'nat_pre', 'input', 'forward', 'nat_post'].map((c) => `flush chain ${T} ${c}`),
    `add rule ${T} raw_pre ${any} meta nfproto ipv6 counter drop`,
    `add rule ${T} raw_pre iifname vmap @raw_map`,
    `add rule ${T} raw_pre ${any} counter drop`,
    `add rule ${T} nat_pre iifname vmap @nat_map`,
    `add rule ${T} input ${any} ct state established,related accept`,
    `add rule ${T} input iifname vmap @input_map`,
    ...refuse(`add rule ${T} input ${any}`),
    `add rule ${T} forward iifname vmap @forward_map`,
    ...refuse(`add rule ${T} forward ${any}`),
    `add rule ${T} forward ${anyOut} ct state related meta l4proto icmp accept`,
    `add rule ${T} forward oifname vmap @reply_map`,
    `add rule ${T} forward ${anyOut} counter drop`,
    `add rule ${T} nat_post ${any} ${anyOut.replace('oifname', 'oifname !=')} masquerade`,
    '',
  ].join('\n');
}

/**
 * Script that installs one sandbox's chains and map elements. Pure.
 * @param o.cidrAllows the sandbox's CIDR rules, or `keep`: leave its CIDR chains as they are (an
 *   agent re-adopting a running sandbox before its policy is applied again: rewriting them empty
 *   would reset every connection they allow).
 */
export function sandboxRuleset(o: {
  hostIf: string;
  sandboxAddress: string;
  gateway: GatewayPorts | null;
  cidrAllows: CidrAllow[] | 'keep';
}): string {
  const i = o.hostIf;
  const keep = o.cidrAllows === 'keep';
  const lines = [
    ...HOOKS.map(([p]) => `add chain ${T} ${p}_${i}`),
    ...HOOKS.filter(([p]) => !keep || (p !== 'fwd' && p !== 'rep')).map(
      ([p]) => `flush chain ${T} ${p}_${i}`,
    ),
    `add rule ${T} raw_${i} ip saddr ${o.sandboxAddress} accept`,
    `add rule ${T} raw_${i} counter drop`,
  ];
  if (o.gateway) {
    const g = o.gateway;
    lines.push(
      `add rule ${T} nat_${i} meta l4proto { tcp, udp } th dport 53 redirect to :${g.dns}`,
      `add rule ${T} nat_${i} tcp dport 80 redirect to :${g.http}`,
      `add rule ${T} nat_${i} tcp dport 443 redirect to :${g.tls}`,
      `add rule ${T} in_${i} tcp dport { ${g.dns}, ${g.http}, ${g.tls} } accept`,
      `add rule ${T} in_${i} udp dport ${g.dns} accept`,
    );
  }
  if (o.cidrAllows !== 'keep') lines.push(...cidrRules(i, o.cidrAllows));
  lines.push(...HOOKS.map(([p, map]) => `add element ${T} ${map} { "${i}" : jump ${p}_${i} }`));
  return `${lines.join('\n')}\n`;
}

/**
 * The sandbox's CIDR rules, both ways: `fwd_<if>` (from the sandbox, every packet) and `rep_<if>`
 * (replies to it). A reply no rule allows any more — the rule was removed or narrowed while the
 * connection was open — is answered with a reset that conntrack sends to the far end through the
 * connection's own NAT mapping, and the sandbox's next packet on it meets the base chain's reset:
 * the connection closes at both ends instead of going silent. Pure.
 */
function cidrRules(hostIf: string, allows: CidrAllow[]): string[] {
  const open = allows.filter((a) => a.ports.length > 0);
  return [
    // A CIDR rule's accept is final, so these refusals must come first — and live in this sandbox's
    // own chain, not the shared base chain, which agents of other versions on the host rewrite.
    // Without them a CIDR covering the sandbox pool reached another sandbox, and one naming
    // 169.254.169.254 reached the metadata address (found by test/attacks.int.test.ts, T18/T19).
    ...refuse(`add rule ${T} fwd_${hostIf} oifname "${HOST_IF_PREFIX}*"`),
    ...refuse(`add rule ${T} fwd_${hostIf} ip daddr 169.254.0.0/16`),
    ...open.map(
      (a) => `add rule ${T} fwd_${hostIf} ip daddr ${a.cidr} tcp dport { ${a.ports.join(', ')} } accept`,
    ),
    ...open.map(
      (a) =>
        `add rule ${T} rep_${hostIf} ct state established ip saddr ${a.cidr} tcp sport { ${a.ports.join(', ')} } accept`,
    ),
    `add rule ${T} rep_${hostIf} ct state established meta l4proto tcp counter reject with tcp reset`,
  ];
}

/** Script that replaces one sandbox's CIDR rules (policy update), both ways in one transaction. Pure. */
export function cidrUpdateRuleset(hostIf: string, allows: CidrAllow[]): string {
  return [
    `add chain ${T} rep_${hostIf}`,
    `flush chain ${T} fwd_${hostIf}`,
    `flush chain ${T} rep_${hostIf}`,
    ...cidrRules(hostIf, allows),
    `add element ${T} reply_map { "${hostIf}" : jump rep_${hostIf} }`,
    '',
  ].join('\n');
}

/** Script that removes one sandbox's map elements and chains. Pure. */
export function sandboxTeardown(hostIf: string): string {
  return [
    ...HOOKS.map(([, map]) => `delete element ${T} ${map} { "${hostIf}" }`),
    ...HOOKS.flatMap(([p]) => [`flush chain ${T} ${p}_${hostIf}`, `delete chain ${T} ${p}_${hostIf}`]),
    '',
  ].join('\n');
}
