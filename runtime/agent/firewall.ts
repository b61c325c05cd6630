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
 *   (per-sandbox chain via `input_map`); everything else from a sandbox is dropped.
 * - `forward`: only the sandbox's policy CIDR rules (`forward_map`), masqueraded in `nat_post`;
 *   everything else to or from a sandbox is dropped (other sandboxes, the LAN, metadata…). The
 *   per-sandbox chain drops new connections into any sandbox interface and to 169.254.0.0/16
 *   before its CIDR accepts, so no policy CIDR opens those.
 *
 * Each sandbox's chains are named after its host interface (`raw_<if>`, `nat_<if>`, `in_<if>`,
 * `fwd_<if>`) and are removed with their map elements on release.
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
const HOOKS = [
  ['raw', 'raw_map'],
  ['nat', 'nat_map'],
  ['in', 'input_map'],
  ['fwd', 'forward_map'],
] as const;

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
    `add rule ${T} input ${any} counter drop`,
    `add rule ${T} forward ${anyOut} ct state established,related accept`,
    `add rule ${T} forward iifname vmap @forward_map`,
    `add rule ${T} forward ${any} counter drop`,
    `add rule ${T} forward ${anyOut} counter drop`,
    `add rule ${T} nat_post ${any} ${anyOut.replace('oifname', 'oifname !=')} masquerade`,
    '',
  ].join('\n');
}

/** Script that installs one sandbox's chains and map elements. Pure. */
export function sandboxRuleset(o: {
  hostIf: string;
  sandboxAddress: string;
  gateway: GatewayPorts | null;
  cidrAllows: CidrAllow[];
}): string {
  const i = o.hostIf;
  const lines = [
    ...HOOKS.map(([p]) => `add chain ${T} ${p}_${i}`),
    ...HOOKS.map(([p]) => `flush chain ${T} ${p}_${i}`),
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
  lines.push(...cidrRules(i, o.cidrAllows));
  lines.push(...HOOKS.map(([p, map]) => `add element ${T} ${map} { "${i}" : jump ${p}_${i} }`));
  return `${lines.join('\n')}\n`;
}

function cidrRules(hostIf: string, allows: CidrAllow[]): string[] {
  return [
    // A CIDR rule's accept is final, so these drops must come first — and live in this sandbox's own
    // chain, not the shared base chain, which agents of other versions on the host rewrite. Without
    // them a CIDR covering the sandbox pool reached another sandbox, and one naming 169.254.169.254
    // reached the metadata address (found by test/attacks.int.test.ts, T18/T19).
    `add rule ${T} fwd_${hostIf} oifname "${HOST_IF_PREFIX}*" counter drop`,
    `add rule ${T} fwd_${hostIf} ip daddr 169.254.0.0/16 counter drop`,
    ...allows
      .filter((a) => a.ports.length > 0)
      .map(
        (a) => `add rule ${T} fwd_${hostIf} ip daddr ${a.cidr} tcp dport { ${a.ports.join(', ')} } accept`,
      ),
  ];
}

/** Script that replaces one sandbox's CIDR rules (policy update). Pure. */
export function cidrUpdateRuleset(hostIf: string, allows: CidrAllow[]): string {
  return [`flush chain ${T} fwd_${hostIf}`, ...cidrRules(hostIf, allows), ''].join('\n');
}

/** Script that removes one sandbox's map elements and chains. Pure. */
export function sandboxTeardown(hostIf: string): string {
  return [
    ...HOOKS.map(([, map]) => `delete element ${T} ${map} { "${hostIf}" }`),
    ...HOOKS.flatMap(([p]) => [`flush chain ${T} ${p}_${hostIf}`, `delete chain ${T} ${p}_${hostIf}`]),
    '',
  ].join('\n');
}
