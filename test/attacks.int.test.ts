/**
 * The egress attack suite (issue 3; egress cases E1–E17 and attack techniques T01–T26; docs/egress.md
 * describes the suite). Every attack runs from inside a real gVisor sandbox of a real single-node stack with
 * the real gateway, against an "outside world" in network namespaces of its own:
 *
 * - `atk-<tag>`: 10.198.<n>.0/24 — good (pkg/good.allowed.test, good.shared.test and the forbidden
 *   evil.shared.test on the same address), evil (evil.test, also an "alternate resolver"), cred
 *   (api.cred.test, checks the real credential), the authoritative DNS server for *.test; plus
 *   10.198.<n+1>.10 "internal" (in the gateway's deny set) and 169.254.169.254 "metadata" (reached
 *   only through a policy route for this stack's sandbox pool, so the host's own metadata service is
 *   never touched).
 *
 * Each attack is judged on the FAR SIDE: the world's hit log (every connection, request, datagram
 * and DNS query), nftables counters inside the world namespace (any packet to evil/internal/metadata,
 * ICMP echo, non-DNS UDP, a source other than the host end, IPv6), a canary listener on the host, a
 * listener in another sandbox — and, where useful, the gateway's audit lines and the sandbox's own
 * view. An attempt whose script did not report back counts as NOT blocked.
 *
 * Prints `N attempts, M blocked, K escaped` and a table; fails unless every attempt was blocked.
 */
import { type ChildProcess, execFile, execFileSync, spawn } from 'node:child_process';
import { randomBytes, randomInt } from 'node:crypto';
import { createSocket, type Socket as UdpSocket } from 'node:dgram';
import { once } from 'node:events';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { createServer as createNetServer, type Server } from 'node:net';
import { networkInterfaces, tmpdir } from 'node:os';
import { join } from 'node:path';
import { connect as tlsConnect } from 'node:tls';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { gunzipSync } from 'node:zlib';
import { pino } from 'pino';
import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DEFAULT_DENY_CIDRS } from '../runtime/gateway/addresses.ts';
import type { WorldConfig } from './attack-world.ts';
import { collect, readEvents, type Stack, type StackClient, startStack, stopThenClean } from './stack.ts';
import { makeWorldLink, worldLinkNames } from './world-link.ts';

const run = promisify(execFile);
const LINK = worldLinkNames('atk');
const { ns: NS, hostIf: HOST_IF } = LINK;
/**
 * The world's pair of /24s, 10.198.<N>.0/24 (its link) and 10.198.<N+1>.0/24 (internal, behind
 * it), N even in 2–240: drawn at random among the pairs this host does not use yet. A run killed
 * before its cleanup leaves its namespace, veth, routes and policy rule behind; a later run drawn
 * onto the same pair would fail to add its own ("RTNETLINK answers: File exists"). Taken: a pair
 * a route's destination lies in (a route wider than a /24 marks the /24 it starts at: the suite
 * adds none), or whose routing table or rule (RT_TABLE, 19800 + N) exists.
 * @throws Error when every pair is taken (leftovers: `ip netns list`, `ip rule`).
 */
function freeWorldPair(): number {
  const ip = (args: string[]) =>
    JSON.parse(execFileSync('ip', ['-j', '-4', ...args], { encoding: 'utf8' })) as {
      dst?: string;
      table?: string;
      priority?: number;
    }[];
  const used = new Set<number>();
  for (const r of ip(['route', 'show', 'table', 'all'])) {
    const m = /^10\.198\.(\d+)\./.exec(r.dst ?? '');
    if (m) used.add(Number(m[1]));
    if (r.table !== undefined) used.add(Number(r.table) - 19_800);
  }
  for (const rule of ip(['rule'])) {
    if (rule.priority !== undefined) used.add(rule.priority - 19_800);
    if (rule.table !== undefined) used.add(Number(rule.table) - 19_800);
  }
  const free = Array.from({ length: 120 }, (_, i) => 2 * i + 2).filter(
    (n) => !used.has(n) && !used.has(n + 1),
  );
  if (free.length === 0) {
    throw new Error('every 10.198.<N>.0/24 pair is taken: remove leftover atk-* namespaces and rules');
  }
  return free[randomInt(free.length)] as number;
}
const N = freeWorldPair();
const NET = `10.198.${N}`;
const W = {
  host: `${NET}.1`,
  good: `${NET}.2`,
  evil: `${NET}.3`,
  cred: `${NET}.4`,
  dns: `${NET}.53`,
  internal: `10.198.${N + 1}.10`,
  meta: '169.254.169.254',
  /** E7: an address the host (node) gains after the gateway started, on the world link. */
  node: `${NET}.100`,
  /** E7: a "load balancer in front of the cluster", given to the gateway as a node CIDR. */
  lb: `${NET}.97`,
  /** E13: a TLS 1.3 server that answers HelloRetryRequest and logs every ClientHello (hrr.allowed.test). */
  hrr: `${NET}.5`,
};
/** E7: how often the gateway re-reads the node's addresses in this run, ms. */
const NODE_REFRESH_MS = 500;
/** E9: the gateway's credential cache time in this run (its default), ms. */
const CREDENTIAL_CACHE_MS = 2000;
/** Every attempt the suite makes (asserted, so a silently skipped attack shows). */
/** Third-round attempts of the HTTP/TLS side (E12 7, E13 4, E15 10, E16 6, E17 2). */
const ROUND3_HTTP_ATTEMPTS = 29;
/** Third-round attempts at the node's local routes (E14: 4 addresses × DNS, HTTP, TLS). */
const ROUND3_E14_ATTEMPTS = 12;
/** Attempts with the host holding one address of its own (T18 tries each host port on each). */
const EXPECTED_ATTEMPTS = 231 + ROUND3_E14_ATTEMPTS + ROUND3_HTTP_ATTEMPTS;
/** Host ports T18 tries on every host address: one attempt more per port for each further address. */
const T18_HOST_PORTS = 5;
/** How many host addresses T18 found (up to 2), set when its attempts are made. */
let t18HostAddresses = 1;
const RT_TABLE = String(19_800 + N);
const REAL = `sk-real-${randomBytes(20).toString('hex')}`;
/** Team `tb`'s value of its own `cred-api` (same name, same host as the default team's REAL). */
const REAL_TB = `sk-team-b-${randomBytes(20).toString('hex')}`;
const HANDSHAKE_MS = 2000;
const MAX_CONNS = 16;

// ---- E14: addresses the node answers for through its local routing table ----
/** E14: an AnyIP range of the node (`ip route add local … dev lo`) inside the world's /24, added during the run. */
const E14_ANYIP_RANGE = `${NET}.192/28`;
/** E14: a second AnyIP range, outside every configured deny range. */
const E14_ANYIP_RANGE2 = '192.88.99.64/28';
/** E14: allowed names and what they resolve to (world DNS): each an address the node answers for. */
const E14_RECORDS: Record<string, string> = {
  'anyip.allowed.test': `${NET}.200`, // in E14_ANYIP_RANGE
  'anyip2.allowed.test': '192.88.99.70', // in E14_ANYIP_RANGE2
  'bcast.allowed.test': `${NET}.255`, // the broadcast address of the node's link to the world
  'mcast.allowed.test': '239.255.0.7', // multicast
};
// ---- end E14 ----

const ALLOWED = [
  ...Object.keys(E14_RECORDS),
  'pkg.allowed.test',
  'good.allowed.test',
  'good.shared.test',
  'rebind.allowed.test',
  'meta.allowed.test',
  'loop.allowed.test',
  'node.allowed.test',
  'node2.allowed.test',
  'lb.allowed.test',
  'hrr.allowed.test',
];
const POLICY = { allow: ALLOWED };
/** E8: names an allow-all sandbox makes the gateway ask about (the denied one, to deny its addresses). */
const UPSTREAM_OK_E8 = new Set(['alias.test', 'cname.test', 'evil.test', 'cdn.evil.test']);
/** E8 phase (host clock): while it lasts, the allow-all sandbox's upstream names are expected. */
const e8Window = { from: Number.POSITIVE_INFINITY, to: Number.POSITIVE_INFINITY };
/** Names the gateway may ever ask its upstream about (the policies' names + the credential host). */
const UPSTREAM_OK = new Set([...ALLOWED, 'api.cred.test']);
const RECORDS: Record<string, string> = {
  'pkg.allowed.test': W.good,
  'good.allowed.test': W.good,
  'xpkg.allowed.test': W.good,
  'good.shared.test': W.good,
  'evil.shared.test': W.good, // E2: a forbidden name on the allowed address
  'api.cred.test': W.cred,
  'rebind.allowed.test': W.internal, // T04: allowed names resolving into the deny set
  'meta.allowed.test': W.meta,
  'loop.allowed.test': '127.0.0.1',
  'node.allowed.test': W.host, // E7: the node's own address on this link (not in the configured deny set)
  'node2.allowed.test': W.node, // E7: an address the node gains later
  'lb.allowed.test': W.lb, // E7: a cluster address given as config
  'hrr.allowed.test': W.hrr, // E13: answers HelloRetryRequest, logs every hello
  'alias.test': W.evil, // E8: a second name for the denied evil.test
  'cname.test': 'cname:cdn.evil.test', // E8: a CNAME chain through a denied pattern
  'evil.test': W.evil,
  '*.evil.test': W.evil,
  ...E14_RECORDS,
};
/** The gateway's deny set: its defaults, with 10/8 carved around the world's /24 (the internal /24 stays denied). */
const DENY = [
  '10.0.0.0/9',
  '10.128.0.0/10',
  '10.192.0.0/14',
  '10.196.0.0/15',
  ...splitAround198(N),
  '10.199.0.0/16',
  '10.200.0.0/13',
  '10.208.0.0/12',
  '10.224.0.0/11',
  `10.198.${N + 1}.0/24`,
  // the gateway's own defaults, less the 10/8 that the lines above carve up
  ...DEFAULT_DENY_CIDRS.filter((c) => c !== '10.0.0.0/8'),
];

/** 10.198.0.0/16 minus 10.198.<n>.0/24 (the world) as CIDRs. */
function splitAround198(n: number): string[] {
  const out: string[] = [];
  // walk prefixes /17../24: at each level, the half not containing n is denied
  let base = 0;
  for (let len = 17; len <= 24; len++) {
    const size = 2 ** (24 - len); // in /24 units
    const half = n >= base + size ? base : base + size;
    if (n >= base + size) base += size;
    out.push(`10.198.${half}.0/${len}`);
  }
  return out;
}

// ---------- far side ----------

interface Hit {
  t: number;
  role: string;
  kind: string;
  port?: number;
  host?: string | null;
  sni?: string | null;
  url?: string;
  name?: string | null;
  auths?: string[];
  [k: string]: unknown;
}

let tmp = '';
let s: Stack;
let world: ChildProcess | null = null;
const hits: Hit[] = [];
const audit: Record<string, unknown>[] = [];
const canary: { proto: string; from: string }[] = [];
let canaryPort = 0;
const cleanups: (() => Promise<unknown>)[] = [];
/** The latency phase may use the direct CIDR path to good:8443. */
let direct8443 = false;

async function sh(cmd: string, args: string[]): Promise<string> {
  return (await run(cmd, args, { timeout: 15_000 })).stdout;
}

async function makeCerts(): Promise<void> {
  const o = (args: string[]) => sh('openssl', args);
  const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes'];
  await o(
    ['req', '-x509', ...ec, '-keyout', join(tmp, 'ca.key'), '-out', join(tmp, 'ca.crt')].concat([
      '-days',
      '1',
      '-subj',
      '/CN=atk test CA',
    ]),
  );
  await o(
    ['req', ...ec, '-keyout', join(tmp, 'leaf.key'), '-out', join(tmp, 'leaf.csr')].concat([
      '-subj',
      '/CN=good.allowed.test',
    ]),
  );
  await writeFile(
    join(tmp, 'ext.cnf'),
    'subjectAltName=DNS:*.allowed.test,DNS:good.shared.test,DNS:evil.shared.test,DNS:evil.test,DNS:*.evil.test,DNS:api.cred.test\n',
  );
  await o([
    'x509',
    '-req',
    '-in',
    join(tmp, 'leaf.csr'),
    '-CA',
    join(tmp, 'ca.crt'),
    '-CAkey',
    join(tmp, 'ca.key'),
    '-CAcreateserial',
    '-out',
    join(tmp, 'leaf.crt'),
    '-days',
    '1',
    '-extfile',
    join(tmp, 'ext.cnf'),
  ]);
}

async function makeWorld(): Promise<void> {
  // routed: replies to sandboxes' direct (CIDR-rule) connections come back on this link and are forwarded
  await makeWorldLink(
    LINK,
    {
      hostCidr: `${W.host}/24`,
      nsCidrs: [
        `${W.good}/24`,
        `${W.evil}/24`,
        `${W.cred}/24`,
        `${W.dns}/24`,
        `${W.internal}/24`,
        `${W.meta}/32`,
        `${W.lb}/24`,
        `${W.hrr}/24`,
      ],
      routed: true,
    },
    cleanups,
  );
  await sh('ip', ['route', 'add', `10.198.${N + 1}.0/24`, 'via', W.good, 'dev', HOST_IF]);
  // far-side packet counters inside the world
  const counters = ['evil', 'internal', 'icmp', 'udp_other', 'spoofed', 'ipv6', 'good_other'];
  const nft = [
    'table inet atkw {',
    ...counters.map((c) => `  counter n_${c} {}`),
    '  chain pre {',
    '    type filter hook prerouting priority -300; policy accept;',
    '    meta nfproto ipv6 counter name n_ipv6',
    `    ip daddr ${W.evil} counter name n_evil`,
    `    ip daddr { ${W.internal}, ${W.meta} } counter name n_internal`,
    '    icmp type echo-request counter name n_icmp',
    '    udp dport != 53 counter name n_udp_other',
    `    ip saddr != ${W.host} counter name n_spoofed`,
    `    ip daddr ${W.good} tcp dport != { 80, 443, 8443 } counter name n_good_other`,
    `    ip daddr ${W.good} meta l4proto udp counter name n_good_other`,
    '  }',
    '}',
    '',
  ].join('\n');
  await writeFile(join(tmp, 'world.nft'), nft);
  await sh('ip', ['netns', 'exec', NS, 'nft', '-f', join(tmp, 'world.nft')]);
}

async function counters(): Promise<Record<string, number>> {
  const out = JSON.parse(await sh('ip', ['netns', 'exec', NS, 'nft', '-j', 'list', 'counters'])) as {
    nftables: { counter?: { name: string; packets: number } }[];
  };
  const c: Record<string, number> = {};
  for (const e of out.nftables) if (e.counter) c[e.counter.name.replace(/^n_/, '')] = e.counter.packets;
  return c;
}

async function startWorld(): Promise<void> {
  const cfg: WorldConfig = {
    roles: {
      good: W.good,
      evil: W.evil,
      cred: W.cred,
      internal: W.internal,
      meta: W.meta,
      lb: W.lb,
      hrr: W.hrr,
    },
    dnsAddress: W.dns,
    certFile: join(tmp, 'leaf.crt'),
    keyFile: join(tmp, 'leaf.key'),
    records: RECORDS,
    credValue: REAL,
  };
  const script = fileURLToPath(new URL('./attack-world.ts', import.meta.url));
  const child = spawn('ip', ['netns', 'exec', NS, process.execPath, script, JSON.stringify(cfg)], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  world = child;
  cleanups.push(async () => {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill('SIGKILL');
      await once(child, 'exit');
    }
  });
  let stderr = '';
  child.stderr!.on('data', (d: Buffer) => {
    stderr += d.toString();
  });
  let buffered = '';
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`world not ready: ${stderr}`)), 20_000);
    child.once('exit', (code) => reject(new Error(`world exited ${code}: ${stderr}`)));
    child.stdout!.on('data', (d: Buffer) => {
      buffered += d.toString();
      let nl = buffered.indexOf('\n');
      while (nl >= 0) {
        const line = buffered.slice(0, nl);
        buffered = buffered.slice(nl + 1);
        if (line === 'READY') {
          clearTimeout(timer);
          resolve();
        } else if (line.startsWith('{')) hits.push(JSON.parse(line) as Hit);
        nl = buffered.indexOf('\n');
      }
    });
  });
}

/** A TCP (dual-stack) and UDP listener on the host: any sandbox packet reaching it is an escape. */
async function startCanary(): Promise<void> {
  const tcp: Server = createNetServer((c) => {
    canary.push({ proto: 'tcp', from: String(c.remoteAddress) });
    c.destroy();
  });
  tcp.listen(0, '::');
  await once(tcp, 'listening');
  canaryPort = (tcp.address() as { port: number }).port;
  const udp: UdpSocket = createSocket({ type: 'udp6', ipv6Only: false });
  udp.on('message', (_m, r) => canary.push({ proto: 'udp', from: r.address }));
  await new Promise<void>((resolve) => udp.bind(canaryPort, '::', () => resolve()));
  cleanups.push(async () => {
    tcp.close();
    udp.close();
  });
}

/** E7: listeners on the node's own `address` at the ports the gateway dials; any connection is an escape. */
async function startNodeServices(address: string): Promise<void> {
  for (const port of [80, 443]) {
    const srv: Server = createNetServer((c) => {
      canary.push({ proto: `node ${address}:${port}`, from: String(c.remoteAddress) });
      c.destroy();
    });
    srv.listen(port, address);
    await once(srv, 'listening');
    cleanups.push(async () => srv.close());
  }
}

/** The host's own (non-sandbox, non-test) addresses: where a hairpin to host services would go. */
function hostAddresses(): { v4: string[]; v6: string[] } {
  const v4: string[] = [];
  const v6: string[] = [];
  for (const [name, list] of Object.entries(networkInterfaces())) {
    if (/^(spv|atk|gwt|lo)/.test(name)) continue;
    for (const a of list ?? []) {
      if (a.internal) continue;
      if (a.family === 'IPv4') v4.push(a.address);
      else if (!a.address.startsWith('fe80')) v6.push(a.address);
    }
  }
  return { v4: v4.slice(0, 2), v6: v6.slice(0, 2) };
}

/** A real ClientHello (for slowloris), from Node's TLS stack. */
async function captureHello(sni: string): Promise<Buffer> {
  const server = createNetServer();
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const got = new Promise<Buffer>((resolve) =>
    server.once('connection', (c) =>
      c.once('data', (d: Buffer) => {
        resolve(d);
        c.destroy();
      }),
    ),
  );
  const c = tlsConnect({
    host: '127.0.0.1',
    port: (server.address() as { port: number }).port,
    servername: sni,
  });
  c.on('error', () => {});
  const hello = await got;
  c.destroy();
  server.close();
  return hello;
}

// ---------- attempts and verdicts ----------

type Out = Record<string, unknown> & { stage?: string; data?: string; err?: string };
/** null: blocked; 'residual: …' documented residual risk; 'invalid: …' the attack did not do what it should; else: escape. */
type Judge = (out: Out, far: Hit[]) => string | null;
interface Attempt {
  id: string;
  t: string;
  what: string;
  kind: string;
  judge?: Judge;
  [param: string]: unknown;
}
interface Row {
  t: string;
  id: string;
  sandbox: string;
  verdict: 'blocked' | 'escaped' | 'not-run' | 'residual' | 'invalid';
  note: string;
}
const rows: Row[] = [];
/** Every byte any sandbox printed (checked for the real credential at the end). */
let allOutput = '';

const atk = (
  t: string,
  id: string,
  what: string,
  kind: string,
  params: Record<string, unknown>,
  judge?: Judge,
) => ({ t, id, what, kind, judge, ...params }) as Attempt;

/** A far-side hit that must never happen (whoever caused it). */
function forbidden(h: Hit): string | null {
  const round3 = forbiddenRound3(h);
  if (round3) return round3;
  if (h.role === 'evil' || h.role === 'internal' || h.role === 'meta' || h.role === 'lb')
    return `${h.role} received ${h.kind}${h.port ? `:${h.port}` : ''}${h.name ? ` ${h.name}` : ''}`;
  const e8 = h.t >= e8Window.from && h.t <= e8Window.to && UPSTREAM_OK_E8.has(String(h.name));
  if (h.role === 'dns' && !UPSTREAM_OK.has(String(h.name)) && !e8)
    return `upstream DNS asked ${h.name} (${h.type})`;
  if (h.role === 'good') {
    if (h.kind === 'udp') return `good received UDP :${h.port}`;
    if ((h.kind === 'tcp' || h.kind === 'tcp-data') && ![80, 443, 8443].includes(h.port ?? 0))
      return `good received TCP :${h.port}`;
    if (h.port === 8443 && !direct8443) return 'good:8443 reached without a CIDR rule';
    if (h.kind === 'http' || h.kind === 'https') {
      for (const n of [h.host, h.sni, ...((h.hosts as string[] | undefined) ?? [])]) {
        if (n == null || h.url === '/e3-residual' || h.port === 8443) continue;
        const name = String(n)
          .toLowerCase()
          .replace(/:80$|:443$/, '')
          .replace(/\.$/, '');
        // names allowed to some sandbox may meet on the shared address over spliced TLS (the documented
        // residual); a name allowed to nobody must never be served
        if (!UPSTREAM_OK.has(name)) return `good served name ${JSON.stringify(n)}`;
      }
    }
  }
  if (h.role === 'cred') {
    const auths = h.auths ?? [];
    if (String(h.url).startsWith('/refuse'))
      return `cred received a request the gateway must refuse: ${h.url}`;
    if (auths.length > 1) return `cred received ${auths.length} Authorization headers`;
    if (auths.some((a) => a.includes(REAL)) && !/^\/(ok|echo|t22)/.test(String(h.url)))
      return `real credential sent on ${h.url}`;
    if (auths.some((a) => a.includes('attacker'))) return 'cred received the attacker-chosen Authorization';
    // the two teams' values of one credential name: each only where its own team's sandbox sent it
    if (auths.some((a) => a.includes(REAL_TB)) && h.url !== '/ok-team-tb')
      return `team tb's credential sent on ${h.url}`;
    if (auths.some((a) => a.includes(REAL)) && h.url === '/ok-team-tb')
      return "the default team's credential sent for team tb's sandbox";
  }
  return null;
}

interface Snap {
  hits: number;
  canary: number;
  counters: Record<string, number>;
}
const snap = async (): Promise<Snap> => ({
  hits: hits.length,
  canary: canary.length,
  counters: await counters(),
});
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * Runs `attempts` in one python process inside sandbox `id`, then judges each: not-run unless it
 * reported; escaped when its own judge says so or any forbidden far-side event happened during its
 * time window (counters and canary hits, which carry no time, blame the whole batch).
 */
async function batch(
  label: string,
  id: string,
  attempts: Attempt[],
  opts: { user?: 'root' | 'user'; timeoutMs?: number; parallel?: boolean } = {},
): Promise<Map<string, Out>> {
  const before = await snap();
  const payload = attempts.map(({ judge: _j, t: _t, what: _w, ...p }) => p);
  const r = await ownerOf(id).exec(id, {
    cmd: 'python3',
    args: ['/tmp/atk.py', JSON.stringify(payload), ...(opts.parallel ? ['par'] : [])],
    user: opts.user ?? 'user',
    timeoutMs: opts.timeoutMs ?? 60_000,
  });
  const text = r.stdout.toString();
  allOutput += text + r.stderr.toString();
  await sleep(400); // late packets and log lines
  const after = await snap();
  const results = new Map<string, { out: Out; t0: number; t1: number }>();
  for (const line of text.split('\n')) {
    if (!line.startsWith('{')) continue;
    const j = JSON.parse(line) as { id: string; ran: boolean; out: Out; t0: number; t1: number };
    const k = skew.get(id) ?? 0;
    if (j.ran) results.set(j.id, { out: j.out, t0: j.t0 * 1000 - k, t1: j.t1 * 1000 - k });
  }
  const newHits = hits.slice(before.hits);
  const batchWide: string[] = [];
  for (const [k, v] of Object.entries(after.counters))
    if (v > (before.counters[k] ?? 0)) batchWide.push(`world counter ${k} +${v - (before.counters[k] ?? 0)}`);
  for (const c of canary.slice(before.canary)) batchWide.push(`host canary got ${c.proto} from ${c.from}`);
  const bad = newHits.map((h) => ({ h, why: forbidden(h) })).filter((x) => x.why !== null);
  const blamed = new Set<string>();
  for (const { h } of bad) {
    for (const [aid, res] of results) if (h.t >= res.t0 - 100 && h.t <= res.t1 + 300) blamed.add(aid);
  }
  const unattributed = bad.filter(
    ({ h }) => ![...results.values()].some((res) => h.t >= res.t0 - 100 && h.t <= res.t1 + 300),
  );
  const out = new Map<string, Out>();
  for (const a of attempts) {
    const res = results.get(a.id);
    if (!res) {
      rows.push({
        t: a.t,
        id: a.id,
        sandbox: label,
        verdict: 'not-run',
        note: `no report (exit ${JSON.stringify(r.exit)}) ${r.stderr.toString().slice(-300)}`,
      });
      continue;
    }
    out.set(a.id, res.out);
    const window = newHits.filter((h) => h.t >= res.t0 - 100 && h.t <= res.t1 + 300);
    const reasons: string[] = [...batchWide, ...unattributed.map((x) => x.why!)];
    if (blamed.has(a.id)) reasons.push(...bad.filter(({ h }) => window.includes(h)).map((x) => x.why!));
    const own = a.judge?.(res.out, window) ?? null;
    const summary = summarise(res.out);
    if (reasons.length > 0 || (own && !own.startsWith('residual:') && !own.startsWith('invalid:'))) {
      rows.push({
        t: a.t,
        id: a.id,
        sandbox: label,
        verdict: 'escaped',
        note: [...reasons, own].filter(Boolean).join('; ') + ` [${summary}]`,
      });
    } else if (own?.startsWith('residual:')) {
      rows.push({ t: a.t, id: a.id, sandbox: label, verdict: 'residual', note: own.slice(9).trim() });
    } else if (own?.startsWith('invalid:')) {
      rows.push({
        t: a.t,
        id: a.id,
        sandbox: label,
        verdict: 'invalid',
        note: `${own.slice(8).trim()} [${summary}]`,
      });
    } else {
      rows.push({ t: a.t, id: a.id, sandbox: label, verdict: 'blocked', note: summary });
    }
  }
  return out;
}

/** One-line description of what the sandbox saw. */
function summarise(o: Out): string {
  if (o.stage === 'response') {
    const first = String(o.data ?? '').split('\r\n')[0] || '(no bytes)';
    return `${first.slice(0, 60)} (${o.how})`;
  }
  if (o.stage === 'reply' && 'rcode' in o) return `DNS ${o.rcode} answers=${o.answers}`;
  if (o.err) return `${o.stage}: ${String(o.err).slice(0, 70)}`;
  const rest = { ...o };
  delete rest.stage;
  return `${o.stage} ${JSON.stringify(rest).slice(0, 110)}`;
}

// ---------- judges ----------

const body = (o: Out) => String(o.data ?? '');
/** The sandbox got an answer from a forbidden role (in-sandbox evidence; the far side is checked too). */
const noForbiddenBody: Judge = (o) =>
  /(^|\r\n\r\n|\|\|)(evil|internal|meta) /.test(body(o)) ||
  /\b(evil|internal|meta) (http|https|tcp|udp) /.test(body(o))
    ? `sandbox received a forbidden server's answer: ${body(o).slice(0, 80)}`
    : null;
/** Nothing came back at all, or a refusal from the gateway: not a real server's 200. */
const refused: Judge = (o, far) => {
  const f = noForbiddenBody(o, far);
  if (f) return f;
  if (/HTTP\/1\.1 200/.test(body(o))) return `got HTTP 200: ${body(o).slice(0, 100)}`;
  return null;
};
const status =
  (code: number): Judge =>
  (o, far) => {
    const f = noForbiddenBody(o, far);
    if (f) return f;
    if (o.stage === 'response' && !body(o).startsWith(`HTTP/1.1 ${code}`))
      return body(o).startsWith('HTTP/1.1 200') ? `got ${body(o).slice(0, 60)}` : null;
    return null;
  };
/** A direct connection must not succeed (the far side decides for servers the test owns). */
const noConnect: Judge = (o) =>
  o.stage === 'connected' ? `connected: ${String(o.data).slice(0, 60)}` : null;
const noReply: Judge = (o) =>
  o.stage === 'reply' && !('rcode' in o) ? `UDP reply from ${o.from}: ${body(o).slice(0, 40)}` : null;
/** DNS through a non-gateway resolver address: any answer must be the gateway's (REFUSED for a forbidden name). */
/** Only the gateway answers, and never with data for a forbidden name (REFUSED/FORMERR; a real server says NOERROR/NXDOMAIN). */
const gatewayRefused: Judge = (o) =>
  o.stage === 'reply' && (o.rcode === 'NOERROR' || o.rcode === 'NXDOMAIN' || Number(o.answers) > 0)
    ? `resolver answered ${o.rcode} (${o.answers} answers)`
    : null;
const notServed =
  (marker: string): Judge =>
  (o, far) =>
    noForbiddenBody(o, far) ?? (body(o).includes(marker) ? `served: ${body(o).slice(0, 80)}` : null);
const noReal: Judge = (o) =>
  JSON.stringify(o).includes(REAL) ? 'the real credential reached the sandbox' : null;
/** Further real values of the E9/E10 credentials (grepped in all sandbox output at the end). */
const CANARIES: string[] = [];

/**
 * E10: `value` in any form the gateway promises to recognise — as is, any case, hex, base64/base64url
 * at each alignment — in what the sandbox received, also inside a gzip body.
 */
function noRealAnyForm(o: Out, value: string): string | null {
  const v = Buffer.from(value);
  const forms = [value.toLowerCase(), v.toString('hex')];
  for (let k = 0; k < 3; k++) {
    const enc = Buffer.concat([Buffer.alloc(k), v]).toString('base64');
    const mid = enc.slice(Math.ceil((8 * k) / 6), Math.floor((8 * (k + v.length)) / 6));
    forms.push(mid.toLowerCase(), mid.replace(/\+/g, '-').replace(/\//g, '_').toLowerCase());
  }
  const texts = [JSON.stringify(o)];
  const raw = Buffer.from(body(o), 'latin1');
  const at = raw.indexOf('\r\n\r\n');
  if (at >= 0 && raw[at + 4] === 0x1f && raw[at + 5] === 0x8b) {
    try {
      texts.push(gunzipSync(raw.subarray(at + 4)).toString('latin1'));
    } catch {
      texts.push('(gzip body did not unpack)');
    }
  }
  for (const t of texts.map((x) => x.toLowerCase()))
    for (const f of forms) if (t.includes(f)) return `the real value came back (form ${forms.indexOf(f)})`;
  return null;
}

// ---------- attack sets ----------

const tls = (ip: string, sni: string | null, extra: Record<string, unknown> = {}) => ({
  ip,
  port: 443,
  sni,
  ...extra,
});
const get = (path: string, host: string, headers: string[] = []) =>
  `GET ${path} HTTP/1.1\r\nHost: ${host}\r\n${headers.map((h) => `${h}\r\n`).join('')}Connection: close\r\n\r\n`;

/** E1–E3 and an IP literal: run in every E4 variant. */
function coreAttacks(withCredential: boolean): Attempt[] {
  const list = [
    atk(
      'E1',
      'e1-resolve',
      'the forged /etc/hosts entry is in effect',
      'resolve',
      { name: 'pkg.allowed.test', family: 2 },
      (o) =>
        JSON.stringify(o.addrs) === JSON.stringify([W.evil])
          ? null
          : `invalid: /etc/hosts forging not in effect: ${JSON.stringify(o)}`,
    ),
    atk(
      'E1',
      'e1-https',
      'HTTPS to pkg.allowed.test forged to evil',
      'tls',
      tls('pkg.allowed.test', 'pkg.allowed.test', { resolve: true, path: '/e1' }),
      noForbiddenBody,
    ),
    atk(
      'E1',
      'e1-http',
      'HTTP to pkg.allowed.test forged to evil',
      'http',
      { ip: 'pkg.allowed.test', port: 80, resolve: true, req: get('/e1', 'pkg.allowed.test') },
      noForbiddenBody,
    ),
    atk(
      'E1',
      'e1-urllib-https',
      'urllib https:// (forged)',
      'urllib',
      { url: 'https://pkg.allowed.test/e1u' },
      noForbiddenBody,
    ),
    atk(
      'E1',
      'e1-urllib-http',
      'urllib http:// (forged)',
      'urllib',
      { url: 'http://pkg.allowed.test/e1u' },
      noForbiddenBody,
    ),
    atk(
      'E1',
      'e1-internal',
      'HTTPS to good.allowed.test forged to the internal server',
      'tls',
      tls('good.allowed.test', 'good.allowed.test', { resolve: true, path: '/e1i' }),
      noForbiddenBody,
    ),
    atk(
      'E2',
      'e2-sni',
      'SNI evil.shared.test to the shared address',
      'tls',
      tls(W.good, 'evil.shared.test', { path: '/e2' }),
      notServed('good https'),
    ),
    atk(
      'E2',
      'e2-host',
      'Host evil.shared.test to the shared address',
      'http',
      { ip: W.good, port: 80, req: get('/e2', 'evil.shared.test') },
      status(403),
    ),
    atk(
      'E2',
      'e2-dns',
      'DNS evil.shared.test',
      'dns',
      { ip: W.host, name: 'evil.shared.test' },
      gatewayRefused,
    ),
    atk(
      'E3',
      'e3-http-abs',
      'HTTP Host allowed, absolute URI evil.test',
      'http',
      {
        ip: W.good,
        port: 80,
        req: 'GET http://evil.test/e3 HTTP/1.1\r\nHost: pkg.allowed.test\r\nConnection: close\r\n\r\n',
      },
      status(403),
    ),
    atk(
      'E3',
      'e3-http-userinfo',
      'absolute URI http://pkg.allowed.test@evil.test/',
      'http',
      {
        ip: W.good,
        port: 80,
        req: 'GET http://pkg.allowed.test@evil.test/e3 HTTP/1.1\r\nHost: pkg.allowed.test\r\nConnection: close\r\n\r\n',
      },
      status(403),
    ),
    atk(
      'T05',
      'ip-http-evil',
      'HTTP to the evil IP, Host = the IP',
      'http',
      { ip: W.evil, port: 80, req: get('/ip', W.evil) },
      status(403),
    ),
    atk(
      'T05',
      'ip-https-evil',
      'HTTPS to the evil IP without SNI',
      'tls',
      tls(W.evil, null, { host: W.evil, path: '/ip' }),
      refused,
    ),
    atk('T05', 'ip-tcp-evil', 'raw TCP to the evil IP :8080', 'tcp', { ip: W.evil, port: 8080 }, noConnect),
  ];
  if (withCredential) {
    list.push(
      atk(
        'E3',
        'e3-intercepted',
        'intercepted TLS: SNI api.cred.test, Host evil.test',
        'tls',
        tls(W.cred, 'api.cred.test', { verify: true, req: get('/refuse-e3', 'evil.test') }),
        status(421),
      ),
      atk(
        'E3',
        'e3-intercepted-abs',
        'intercepted TLS: absolute-form https://evil.test/',
        'tls',
        tls(W.cred, 'api.cred.test', {
          verify: true,
          req: 'GET https://evil.test/refuse-e3b HTTP/1.1\r\nHost: api.cred.test\r\nConnection: close\r\n\r\n',
        }),
        status(421),
      ),
      atk(
        'E3',
        'e3-spliced-residual',
        'spliced TLS: SNI good.shared.test, Host evil.shared.test',
        'tls',
        tls(W.good, 'good.shared.test', { path: '/e3-residual', host: 'evil.shared.test' }),
        (o) =>
          body(o).includes('host=evil.shared.test')
            ? 'residual: spliced TLS is opaque to the gateway; a server hosting both names on the allowed address can be fronted (docs/security.md, residual risks: keep shared/CDN names off allow lists, or make them credential hosts to intercept)'
            : null,
      ),
    );
  }
  return list;
}

// ---------- the suite ----------

let A = '';
let B = '';
let phA = '';
let phB = '';
let addrA = '';
let addrB = '';
/** The API client that owns each sandbox made with another team's key (default: the bootstrap key's). */
const owners = new Map<string, StackClient>();
const ownerOf = (id: string): StackClient => owners.get(id) ?? s;

async function upload(id: string): Promise<void> {
  const { url, token } = await ownerOf(id).token(id);
  const script = await readFile(fileURLToPath(new URL('./attack-guest.py', import.meta.url)));
  const res = await request(`${url}/files?path=${encodeURIComponent('/tmp/atk.py')}`, {
    method: 'PUT',
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/octet-stream' },
    body: script,
  });
  const text = await res.body.text();
  expect(res.statusCode, text).toBe(200);
}

async function forgeHosts(id: string): Promise<void> {
  const r = await s.exec(id, {
    cmd: 'sh',
    args: [
      '-c',
      `printf '${W.evil} pkg.allowed.test\\n${W.internal} good.allowed.test\\n' >> /etc/hosts && echo FORGED`,
    ],
    user: 'root',
  });
  expect(r.stdout.toString()).toContain('FORGED');
}

async function sandbox(body: Record<string, unknown>): Promise<string> {
  const id = await s.createSandbox({ timeoutSec: 900, ...body });
  await upload(id);
  return id;
}

async function placeholderOf(id: string): Promise<string> {
  const r = await ownerOf(id).exec(id, { cmd: 'printenv', args: ['CRED_API'] });
  const ph = r.stdout.toString().trim();
  expect(ph).toMatch(/^space_ph_[a-z0-9]{32}$/);
  return ph;
}

/** Sandbox clock minus host clock, ms, per sandbox (gVisor keeps its own clock): aligns hit times. */
const skew = new Map<string, number>();

async function addressOf(id: string): Promise<string> {
  const h0 = Date.now();
  const out = await batch('setup', id, [atk('setup', 'myaddr', 'own address', 'myaddr', { ip: W.good })]);
  const h1 = Date.now();
  rows.pop(); // not an attack
  const t = Number(out.get('myaddr')?.now) * 1000;
  // only a skew larger than the exec's own duration is measurable this way
  skew.set(id, t < h0 ? t - h0 : t > h1 ? t - h1 : 0);
  const addr = String(out.get('myaddr')?.addr);
  await forwardingOn(addr);
  return addr;
}

/**
 * Turns IPv4 forwarding on for the host interface of the sandbox at `addr`. The agent leaves
 * forwarding as the host has it (off here), and with it off the kernel drops every forwarded packet
 * before nftables is even asked — which would make E5 pass for the wrong reason and CIDR rules inert.
 * With it on, only the `inet space` rules stand between a sandbox and the world (the worst case).
 */
async function forwardingOn(addr: string): Promise<void> {
  const hostEnd = addr.replace(/\d+$/, (d) => String(Number(d) - 1));
  const links = JSON.parse(await sh('ip', ['-j', '-4', 'addr', 'show'])) as {
    ifname: string;
    addr_info?: { local?: string }[];
  }[];
  const link = links.find((l) => l.addr_info?.some((a) => a.local === hostEnd));
  expect(link, `host interface of ${addr}`).toBeDefined();
  await writeFile(`/proc/sys/net/ipv4/conf/${link!.ifname}/forwarding`, '1');
}

// ---------- third round, HTTP/TLS side (E12, E13, E15, E16, E17) ----------

/** Far-side events of the third round that must never happen (called first by {@link forbidden}). */
function forbiddenRound3(h: Hit): string | null {
  // E13: the HelloRetryRequest server read a ClientHello naming a server allowed to nobody
  if (h.role === 'hrr' && h.kind === 'hello' && !UPSTREAM_OK.has(String(h.sni).toLowerCase()))
    return `hrr read ClientHello #${h.n} naming ${JSON.stringify(h.sni)}`;
  return null;
}

/**
 * E16: `value` in any form the gateway promises to recognise, in what the sandbox received — read
 * as a client could: the raw bytes, and every gzip member found at any offset, unpacked, to depth 3.
 */
function noRealUnpacked(o: Out, value: string): string | null {
  const direct = noRealAnyForm(o, value);
  if (direct) return direct;
  const raw = Buffer.from(body(o), 'latin1');
  const texts: string[] = [];
  const unpackAll = (buf: Buffer, depth: number) => {
    if (depth > 3) return;
    for (let at = buf.indexOf(0x1f); at >= 0; at = buf.indexOf(0x1f, at + 1)) {
      if (buf[at + 1] !== 0x8b) continue;
      try {
        const text = gunzipSync(buf.subarray(at));
        texts.push(text.toString('latin1'));
        unpackAll(text, depth + 1);
      } catch {}
    }
  };
  unpackAll(raw, 0);
  for (const t of texts) {
    const hit = noRealAnyForm({ stage: 'unpacked', data: t }, value);
    if (hit) return `${hit} inside a gzip member`;
  }
  return null;
}

/** Every row of `ids` must be `blocked` (a filtered run of one round-3 test still fails on an escape). */
function expectBlocked(ids: string[]): void {
  const mine = rows.filter((r) => ids.includes(r.id));
  expect(mine.map((r) => r.id).sort()).toEqual([...ids].sort());
  expect(mine.filter((r) => r.verdict !== 'blocked')).toEqual([]);
}

describe('egress attack suite', () => {
  beforeAll(async () => {
    tmp = await mkdtemp(join(tmpdir(), 'atk-'));
    cleanups.push(() => rm(tmp, { recursive: true, force: true }));
    await makeCerts();
    await makeWorld();
    await startWorld();
    await startCanary();
    const log = pino(
      { level: 'info' },
      {
        write(line: string) {
          const j = JSON.parse(line) as Record<string, unknown>;
          if (typeof j.msg === 'string' && j.msg.startsWith('egress')) audit.push(j);
        },
      },
    );
    s = await startStack(
      { SPACE_WATCHDOG_INTERVAL_MS: '1000' },
      {
        upstreamDns: `${W.dns}:53`,
        denyCidrs: DENY.join(','),
        upstreamCaFile: join(tmp, 'ca.crt'),
        log,
        env: {
          SPACE_GATEWAY_HANDSHAKE_TIMEOUT_MS: String(HANDSHAKE_MS),
          SPACE_GATEWAY_MAX_CONNECTIONS: String(MAX_CONNS),
          SPACE_GATEWAY_DNS_QPS: '1000',
          SPACE_GATEWAY_RESOLVE_TIMEOUT_MS: '1000',
          SPACE_GATEWAY_DIAL_TIMEOUT_MS: '2000',
          SPACE_GATEWAY_NODE_CIDRS: `${W.lb}/32`,
          SPACE_GATEWAY_NODE_REFRESH_MS: String(NODE_REFRESH_MS),
          SPACE_GATEWAY_CREDENTIAL_CACHE_MS: String(CREDENTIAL_CACHE_MS),
        },
      },
    );
    // metadata stand-in: only this stack's sandboxes' packets to 169.254.169.254 go to the world
    await sh('ip', ['route', 'add', `${W.meta}/32`, 'via', W.good, 'dev', HOST_IF, 'table', RT_TABLE]);
    await sh('ip', [
      'rule',
      'add',
      'from',
      s.pool,
      'to',
      `${W.meta}/32`,
      'lookup',
      RT_TABLE,
      'pref',
      RT_TABLE,
    ]);
    cleanups.push(() => run('ip', ['rule', 'del', 'pref', RT_TABLE]));
    const cred = await s.call('PUT', '/v1/credentials/cred-api', { domains: ['api.cred.test'], value: REAL });
    expect(cred.status).toBe(200);
    [A, B] = await Promise.all([
      sandbox({ egress: POLICY, credentials: ['cred-api'] }),
      sandbox({
        egress: {
          ...POLICY,
          cidrs: [
            { cidr: `${W.good}/32`, ports: [8443] },
            { cidr: s.pool, ports: [7000] },
            { cidr: `${W.meta}/32`, ports: [8080] },
          ],
        },
        credentials: ['cred-api'],
      }),
    ]);
    [phA, phB, addrA, addrB] = await Promise.all([
      placeholderOf(A),
      placeholderOf(B),
      addressOf(A),
      addressOf(B),
    ]);
    expect(phA).not.toBe(phB);
  }, 300_000);

  afterAll(() => stopThenClean(s, cleanups), 120_000);

  it('positive path: plain allowed HTTP/HTTPS work; an injected credential reaches the upstream, never the sandbox', async () => {
    const mark = hits.length;
    const out = await batch('A', A, [
      atk(
        'POS',
        'pos-https',
        'HTTPS good.allowed.test',
        'tls',
        tls('good.allowed.test', 'good.allowed.test', { resolve: true, path: '/pos' }),
      ),
      atk('POS', 'pos-http', 'HTTP good.allowed.test', 'http', {
        ip: 'good.allowed.test',
        port: 80,
        resolve: true,
        req: get('/pos', 'good.allowed.test'),
      }),
      atk(
        'POS',
        'pos-cred',
        'HTTPS api.cred.test with the placeholder',
        'tls',
        tls('api.cred.test', 'api.cred.test', {
          resolve: true,
          verify: true,
          req: get('/ok-a', 'api.cred.test', [`Authorization: Bearer ${phA}`]),
        }),
      ),
    ]);
    const env = await batch(
      'A (root)',
      A,
      [
        atk('POS', 'pos-env', 'search env, /proc and files for the real value', 'env', {
          needle_b64: Buffer.from(REAL).toString('base64'),
        }),
      ],
      { user: 'root' },
    );
    out.set('pos-env', env.get('pos-env')!);
    for (const r of rows.splice(-4)) expect(r.verdict, JSON.stringify(r)).toBe('blocked'); // no far-side alarms
    expect(body(out.get('pos-https')!)).toContain('good https host=good.allowed.test sni=good.allowed.test');
    expect(body(out.get('pos-http')!)).toContain('good http host=good.allowed.test');
    expect(body(out.get('pos-cred')!)).toMatch(/^HTTP\/1\.1 200[\s\S]*cred ok \/ok-a/);
    expect(
      hits
        .slice(mark)
        .filter((h) => h.role === 'cred' && h.kind === 'https')
        .map((h) => h.auths),
    ).toEqual([[`Bearer ${REAL}`]]);
    expect(out.get('pos-env')).toMatchObject({ found: [] });
    expect(JSON.stringify(out.get('pos-env'))).toContain(phA); // the sandbox holds the placeholder only
    expect(allOutput).not.toContain(REAL);
  });

  it("teams: two teams' credentials of one name for one host; each upstream request carries its own team's value", async () => {
    expect((await s.call('POST', '/v1/teams', { id: 'tb' })).status).toBe(201);
    const made = await s.call<{ secret: string }>('POST', '/v1/keys', {
      name: 'tb-admin',
      team: 'tb',
      scopes: ['sandboxes:read', 'sandboxes:write', 'credentials:admin'],
    });
    expect(made.status).toBe(201);
    const TB = s.as(made.body.secret);
    CANARIES.push(REAL_TB);
    const put = await TB.call('PUT', '/v1/credentials/cred-api', {
      domains: ['api.cred.test'],
      value: REAL_TB,
    });
    expect(put.status).toBe(200);
    const C = await TB.createSandbox({ timeoutSec: 900, egress: POLICY, credentials: ['cred-api'] });
    owners.set(C, TB);
    await upload(C);
    const phC = await placeholderOf(C);
    await addressOf(C);
    /** The far side saw exactly one request on `path`, carrying exactly `value`. */
    const carried =
      (path: string, value: string, other: string): Judge =>
      (_o, far) => {
        const seen = far.filter((h) => h.role === 'cred' && h.url === path).map((h) => h.auths ?? []);
        if (seen.some((a) => a.some((x) => x.includes(other))))
          return `the other team's value reached ${path}`;
        if (seen.length !== 1 || seen[0]!.join() !== `Bearer ${value}`)
          return `invalid: upstream saw ${JSON.stringify(seen).slice(0, 200)} on ${path}`;
        return null;
      };
    const via = (ph: string, path: string, value: string, other: string) =>
      atk(
        'TEAM',
        `team-${path.slice(9)}-own-value`,
        `HTTPS api.cred.test with its own placeholder: upstream gets ${path.slice(9)}'s cred-api`,
        'tls',
        tls('api.cred.test', 'api.cred.test', {
          resolve: true,
          verify: true,
          req: get(path, 'api.cred.test', [`Authorization: Bearer ${ph}`]),
        }),
        carried(path, value, other),
      );
    await batch('A', A, [via(phA, '/ok-team-default', REAL, REAL_TB)]);
    await batch('C (team tb)', C, [via(phC, '/ok-team-tb', REAL_TB, REAL)]);
    for (const r of rows.splice(-2)) {
      expect(r.verdict, JSON.stringify(r)).toBe('blocked');
      rows.push(r);
    }
    expect(allOutput).not.toContain(REAL_TB);
  });

  it('E1–E3 + IP literal from the credential sandbox (E4 variant "credential")', async () => {
    await forgeHosts(A);
    await batch('A (credential)', A, coreAttacks(true));
  });

  it('E4: env, metadata, resources and no options at all change nothing', async () => {
    const variants: [string, Record<string, unknown>][] = [
      ['E4 env', { env: { HTTPS_PROXY: `http://${W.evil}:8080`, NO_PROXY: '*', FOO: 'bar' } }],
      ['E4 metadata', { metadata: { team: 'red', egress: 'allow-all' } }],
      ['E4 resources', { vcpus: 2, memoryMiB: 768 }],
      ['E4 plain', {}],
    ];
    const ids = await Promise.all(variants.map(([, o]) => sandbox({ egress: POLICY, ...o })));
    try {
      await Promise.all(ids.map((id) => addressOf(id)));
      for (const [i, [label]] of variants.entries()) {
        await forgeHosts(ids[i]!);
        await batch(label, ids[i]!, coreAttacks(false));
      }
    } finally {
      await Promise.all(ids.map((id) => s.call('DELETE', `/v1/sandboxes/${id}`)));
    }
  });

  it('T02/T03 DNS: other resolvers are answered by the gateway only, DoT refused, tunnelling never forwarded', async () => {
    const out = await batch('A', A, [
      atk(
        'T02',
        'dns-alt-udp',
        'UDP 53 to evil (an open resolver) for evil.test',
        'dns',
        { ip: W.evil, name: 'evil.test' },
        gatewayRefused,
      ),
      atk(
        'T02',
        'dns-alt-tcp',
        'TCP 53 to evil for evil.test',
        'dns',
        { ip: W.evil, name: 'evil.test', tcp: true },
        gatewayRefused,
      ),
      atk(
        'T02',
        'dns-alt-internal',
        'UDP 53 to the internal address',
        'dns',
        { ip: W.internal, name: 'x.evil.test' },
        gatewayRefused,
      ),
      atk(
        'T02',
        'dns-alt-meta',
        'UDP 53 to 169.254.169.254',
        'dns',
        { ip: W.meta, name: 'x.evil.test' },
        gatewayRefused,
      ),
      atk(
        'T02',
        'dns-odd-port',
        'a DNS query to evil on UDP 9999',
        'udp',
        { ip: W.evil, port: 9999, hex: '123401000001000000000000046576696c0474657374000001' + '0001' },
        noReply,
      ),
      atk(
        'T02',
        'dns-dot',
        'DoT (TLS on 853) to evil',
        'tls',
        { ip: W.evil, port: 853, sni: 'evil.test', timeout: 2 },
        refused,
      ),
      atk(
        'T02',
        'dns-allowed-via-alt',
        'allowed name via evil:53 answered by the gateway',
        'dns',
        { ip: W.evil, name: 'pkg.allowed.test' },
        (o) =>
          o.stage === 'reply' && o.rcode === 'NOERROR' && o.answers === 1
            ? null
            : `invalid: expected the gateway's answer, got ${JSON.stringify(o)}`,
      ),
      atk(
        'T03',
        'dns-tunnel-a-txt',
        '80 random 60-char labels under exfil.evil.test (A and TXT)',
        'dnsburst',
        { ip: W.host, count: 80, domain: 'exfil.evil.test' },
        (o) => {
          const r = o.rcodes as Record<string, number>;
          return (r.REFUSED ?? 0) + (r.timeout ?? 0) === 80 ? null : `answers ${JSON.stringify(r)}`;
        },
      ),
      atk(
        'T03',
        'dns-tunnel-allowed-suffix',
        'random labels below an allowed name',
        'dnsburst',
        { ip: W.host, count: 20, domain: 'pkg.allowed.test' },
        (o) => ((o.rcodes as Record<string, number>).NOERROR ? `answered ${JSON.stringify(o.rcodes)}` : null),
      ),
      atk(
        'T03',
        'dns-tunnel-tcp',
        'a long name over TCP 53',
        'dns',
        {
          ip: W.host,
          tcp: true,
          qtype: 'TXT',
          name: `${'a'.repeat(63)}.${'b'.repeat(63)}.${'c'.repeat(50)}.exfil.evil.test`,
        },
        gatewayRefused,
      ),
      atk(
        'T03',
        'dns-tunnel-overlong',
        'a 300-byte name',
        'dns',
        { ip: W.host, name: `${'q'.repeat(60)}.`.repeat(5) + 'evil.test' },
        gatewayRefused,
      ),
    ]);
    expect(out.get('dns-alt-udp')).toMatchObject({ rcode: 'REFUSED' });
    // the authoritative server only ever heard allowed names (also asserted per attempt by forbidden())
    expect(hits.filter((h) => h.role === 'dns' && !UPSTREAM_OK.has(String(h.name)))).toEqual([]);
  });

  it('T04/T05/T06/T09/T10/T11: rebinding, IP literals, SNI spoofing, shared IPs, keep-alive, canonicalisation', async () => {
    const absent = (o: Out) => (o.stage === 'resolved' ? `resolved ${JSON.stringify(o.addrs)}` : null);
    await batch('A', A, [
      atk(
        'T04',
        'rebind-dns',
        'rebind.allowed.test → internal: DNS',
        'resolve',
        { name: 'rebind.allowed.test', family: 2 },
        absent,
      ),
      atk(
        'T04',
        'rebind-tls',
        'rebind.allowed.test → internal: TLS',
        'tls',
        tls(W.good, 'rebind.allowed.test', { path: '/rebind' }),
        refused,
      ),
      atk(
        'T04',
        'rebind-http',
        'rebind.allowed.test → internal: HTTP',
        'http',
        { ip: W.good, port: 80, req: get('/rebind', 'rebind.allowed.test') },
        status(403),
      ),
      atk(
        'T04',
        'rebind-meta-tls',
        'meta.allowed.test → 169.254.169.254: TLS',
        'tls',
        tls(W.good, 'meta.allowed.test'),
        refused,
      ),
      atk(
        'T04',
        'rebind-meta-http',
        'meta.allowed.test → 169.254.169.254: HTTP',
        'http',
        { ip: W.good, port: 80, req: get('/latest/meta-data/', 'meta.allowed.test') },
        status(403),
      ),
      atk(
        'T04',
        'rebind-loop-http',
        'loop.allowed.test → 127.0.0.1: HTTP',
        'http',
        { ip: W.good, port: 80, req: get('/', 'loop.allowed.test') },
        status(403),
      ),
      atk(
        'T05',
        'ip-https-good',
        'HTTPS to the allowed IP without SNI',
        'tls',
        tls(W.good, null, { host: 'pkg.allowed.test' }),
        refused,
      ),
      atk(
        'T05',
        'ip-http-good',
        'HTTP to the allowed IP, Host = the IP',
        'http',
        { ip: W.good, port: 80, req: get('/', W.good) },
        status(403),
      ),
      atk('T05', 'ip-tcp-evil-22', 'raw TCP to evil :22', 'tcp', { ip: W.evil, port: 22 }, noConnect),
      atk(
        'T05',
        'ip-tcp-internal',
        'raw TCP to the internal server :8080',
        'tcp',
        { ip: W.internal, port: 8080 },
        noConnect,
      ),
      atk(
        'T06',
        'sni-spoof-evil',
        'TLS to the evil IP with SNI pkg.allowed.test',
        'tls',
        tls(W.evil, 'pkg.allowed.test', { path: '/t06' }),
        noForbiddenBody,
      ),
      atk(
        'T06',
        'sni-spoof-internal',
        'TLS to the internal IP with SNI pkg.allowed.test',
        'tls',
        tls(W.internal, 'pkg.allowed.test', { path: '/t06' }),
        noForbiddenBody,
      ),
      atk(
        'T06',
        'host-spoof-evil',
        'HTTP to the evil IP with Host pkg.allowed.test',
        'http',
        { ip: W.evil, port: 80, req: get('/t06', 'pkg.allowed.test') },
        noForbiddenBody,
      ),
      atk(
        'T09',
        'shared-8080',
        'the allowed address on TCP 8080',
        'tcp',
        { ip: W.good, port: 8080 },
        noConnect,
      ),
      atk('T09', 'shared-22', 'the allowed address on TCP 22', 'tcp', { ip: W.good, port: 22 }, noConnect),
      atk(
        'T09',
        'shared-8443',
        'the allowed address on TLS 8443 (no CIDR rule in A)',
        'tls',
        { ip: W.good, port: 8443, sni: 'pkg.allowed.test' },
        refused,
      ),
      atk(
        'T10',
        'keepalive-switch',
        'keep-alive: Host allowed, then Host evil.test',
        'http',
        {
          ip: W.good,
          port: 80,
          req: 'GET /1 HTTP/1.1\r\nHost: pkg.allowed.test\r\n\r\n',
          req2: 'GET /2 HTTP/1.1\r\nHost: evil.test\r\n\r\n',
        },
        (o) =>
          body(o).includes('good http') && /403/.test(body(o).split('||')[1] ?? '')
            ? null
            : (noForbiddenBody(o, []) ??
              (body(o).includes('good http')
                ? null
                : `invalid: first request not served: ${body(o).slice(0, 80)}`)),
      ),
      atk(
        'T10',
        'keepalive-pipelined',
        'two pipelined requests, the second to evil.shared.test',
        'http',
        {
          ip: W.good,
          port: 80,
          req: 'GET /1 HTTP/1.1\r\nHost: pkg.allowed.test\r\n\r\nGET /2 HTTP/1.1\r\nHost: evil.shared.test\r\nConnection: close\r\n\r\n',
        },
        noForbiddenBody,
      ),
      atk(
        'T10',
        'keepalive-intercepted',
        'intercepted keep-alive: Host api.cred.test, then evil.test',
        'tls',
        tls(W.cred, 'api.cred.test', {
          verify: true,
          req: `GET /ok-ka HTTP/1.1\r\nHost: api.cred.test\r\nAuthorization: Bearer ${phA}\r\n\r\nGET /refuse-ka HTTP/1.1\r\nHost: evil.test\r\nAuthorization: Bearer ${phA}\r\nConnection: close\r\n\r\n`,
        }),
        noReal,
      ),
      ...[
        'pkg.allowed.test.evil.test',
        'xpkg.allowed.test',
        'pkg.allowed.test@evil.test',
        'evil.test#pkg.allowed.test',
        '[pkg.allowed.test]',
        'evil.test:80',
        'pkg.allowed.test:8080',
        'pkg.allowed.test\u0000.evil.test',
        'evil.test\tpkg.allowed.test',
        'pkg.allowed.t\u0435st',
        'evil.test%2epkg.allowed.test',
        'EVIL.SHARED.TEST.',
      ].map((h, i) =>
        atk(
          'T11',
          `canon-host-${i}`,
          `Host ${JSON.stringify(h)}`,
          'http',
          { ip: W.good, port: 80, req: get('/t11', h) },
          noForbiddenBody,
        ),
      ),
      ...[
        'pkg.allowed.test.evil.test',
        'xpkg.allowed.test',
        'EVIL.SHARED.TEST.',
        `${'a'.repeat(60)}.`.repeat(3) + 'pkg.allowed.test',
      ].map((n, i) =>
        atk(
          'T11',
          `canon-sni-${i}`,
          `SNI ${n.slice(0, 40)}`,
          'tls',
          tls(W.good, n, { host: n, path: '/t11' }),
          noForbiddenBody,
        ),
      ),
    ]);
  });

  it('E5/T13–T19: IPv6, UDP/QUIC, ICMP, forged sources, metadata, host services, other sandboxes', async () => {
    const { v4, v6 } = hostAddresses();
    const apiPort = Number(new URL(s.apiUrl).port);
    const agentPort = Number(new URL(s.agent.url).port);
    const redisPort = Number(new URL(s.redisUrl).port);
    const gwTls = s.gateway!.tlsPort;
    const quic = `c3000000010854${randomBytes(8).toString('hex')}00004400${randomBytes(60).toString('hex')}`;
    const ntp = `1b${'00'.repeat(47)}`;
    // B listens on TCP/UDP 7000 for 25 s (T19 far side); A does the same for B's CIDR-rule attempt
    const listen = (id: string) =>
      s.call<{ command: { id: string }; stream: { url: string; token: string } }>(
        'POST',
        `/v1/sandboxes/${id}/commands`,
        {
          cmd: 'python3',
          args: [
            '/tmp/atk.py',
            JSON.stringify([{ id: 'listen', kind: 'listen', port: 7000, secs: 25, log: '/tmp/t19.log' }]),
          ],
          timeoutMs: 40_000,
        },
      );
    const [lb, la] = await Promise.all([listen(B), listen(A)]);
    await sleep(1500);
    const hostPorts = [apiPort, agentPort, redisPort, canaryPort, 22];
    expect(hostPorts).toHaveLength(T18_HOST_PORTS);
    t18HostAddresses = v4.length;
    const attempts: Attempt[] = [
      atk(
        'T13',
        'v6-host',
        `TCP to the host's IPv6 ${v6[0] ?? 'fd00::2'}`,
        'tcp',
        { ip: v6[0] ?? 'fd00::2', port: canaryPort },
        noConnect,
      ),
      atk(
        'T13',
        'v6-loop-host',
        "TCP to [::1] (the sandbox's own loopback) on the API port",
        'tcp',
        { ip: '::1', port: apiPort },
        noConnect,
      ),
      atk(
        'T13',
        'v6-mapped',
        'IPv4-mapped ::ffff:evil :8080',
        'tcp',
        { ip: `::ffff:${W.evil}`, port: 8080 },
        noConnect,
      ),
      atk(
        'T13',
        'v6-nat64',
        'NAT64 64:ff9b::evil :8080',
        'tcp',
        { ip: `64:ff9b::${W.evil}`, port: 8080 },
        noConnect,
      ),
      atk(
        'T13',
        'v6-udp',
        `UDP to the host's IPv6`,
        'udp',
        { ip: v6[0] ?? 'fd00::2', port: canaryPort },
        noReply,
      ),
      atk(
        'T13',
        'v6-aaaa',
        'AAAA of an allowed name (must be empty)',
        'resolve',
        { name: 'pkg.allowed.test', family: 10 },
        (o) => (o.stage === 'resolved' ? `got IPv6 ${JSON.stringify(o.addrs)}` : null),
      ),
      atk(
        'T14',
        'udp-quic-evil',
        'QUIC-like Initial to evil UDP 443',
        'udp',
        { ip: W.evil, port: 443, hex: quic },
        noReply,
      ),
      atk(
        'T14',
        'udp-quic-good',
        'QUIC-like Initial to the allowed server UDP 443',
        'udp',
        { ip: W.good, port: 443, hex: quic },
        noReply,
      ),
      atk('T14', 'udp-ntp', 'NTP to evil UDP 123', 'udp', { ip: W.evil, port: 123, hex: ntp }, noReply),
      atk('T14', 'udp-9999', 'UDP to evil 9999', 'udp', { ip: W.evil, port: 9999 }, noReply),
      atk(
        'T14',
        'udp-internal',
        'UDP to the internal server',
        'udp',
        { ip: W.internal, port: 9999 },
        noReply,
      ),
      atk('T15', 'icmp-evil', 'ICMP echo (1 KB pattern) to evil', 'icmp', { ip: W.evil }),
      atk('T15', 'icmp-internal', 'ICMP echo to the internal server', 'icmp', { ip: W.internal }),
      atk('T15', 'icmp-host', 'ICMP echo to the host end', 'icmp', { ip: W.host }, (o) =>
        JSON.stringify(o.r).includes('"reply from') ? `host answered: ${JSON.stringify(o.r)}` : null,
      ),
      atk(
        'T18',
        'meta-http',
        '169.254.169.254:80 (redirected: Host is an IP)',
        'http',
        { ip: W.meta, port: 80, req: get('/latest/meta-data/', W.meta) },
        status(403),
      ),
      atk(
        'T18',
        'meta-http-named',
        '169.254.169.254:80 with Host pkg.allowed.test',
        'http',
        { ip: W.meta, port: 80, req: get('/latest/meta-data/', 'pkg.allowed.test') },
        noForbiddenBody,
      ),
      atk(
        'T18',
        'meta-tls',
        '169.254.169.254:443 without SNI',
        'tls',
        tls(W.meta, null, { host: W.meta }),
        refused,
      ),
      atk('T18', 'meta-8080', '169.254.169.254:8080', 'tcp', { ip: W.meta, port: 8080 }, noConnect),
      atk('T18', 'meta-udp', '169.254.169.254 UDP', 'udp', { ip: W.meta, port: 9999 }, noReply),
      ...hostPorts.flatMap((port) => [
        atk(
          'T18',
          `host-end-${port}`,
          `host end ${addrA.replace(/\d+$/, 'x')}:${port}`,
          'tcp',
          { ip: addrA.replace(/\d+$/, (d) => String(Number(d) - 1)), port },
          noConnect,
        ),
        ...v4.map((ip) =>
          atk('T18', `host-${ip}-${port}`, `host address ${ip}:${port}`, 'tcp', { ip, port }, noConnect),
        ),
        atk(
          'T18',
          `host-world-end-${port}`,
          `the host's world-side address ${W.host}:${port}`,
          'tcp',
          { ip: W.host, port },
          noConnect,
        ),
      ]),
      atk(
        'T18',
        'host-loopback-api',
        "127.0.0.1 API port (the sandbox's own loopback)",
        'tcp',
        { ip: '127.0.0.1', port: apiPort },
        noConnect,
      ),
      atk(
        'T18',
        'host-loopback-redis',
        '127.0.0.1 Redis port',
        'tcp',
        { ip: '127.0.0.1', port: redisPort },
        noConnect,
      ),
      atk(
        'T18',
        'host-udp',
        'UDP to the host end',
        'udp',
        { ip: addrA.replace(/\d+$/, (d) => String(Number(d) - 1)), port: canaryPort },
        noReply,
      ),
      atk(
        'T18',
        'gateway-port-direct',
        'the gateway TLS port directly with SNI evil.test',
        'tls',
        { ip: addrA.replace(/\d+$/, (d) => String(Number(d) - 1)), port: gwTls, sni: 'evil.test' },
        refused,
      ),
      atk('T19', 'peer-tcp', 'TCP to sandbox B :7000', 'tcp', { ip: addrB, port: 7000 }, noConnect),
      atk('T19', 'peer-udp', 'UDP to sandbox B :7000', 'udp', { ip: addrB, port: 7000 }, noReply),
      atk(
        'T19',
        'peer-host-end',
        "TCP to B's host end :7000",
        'tcp',
        { ip: addrB.replace(/\d+$/, (d) => String(Number(d) - 1)), port: 7000 },
        noConnect,
      ),
      atk('T19', 'peer-icmp', 'ICMP to sandbox B', 'icmp', { ip: addrB }, (o) =>
        JSON.stringify(o.r).includes('"reply from') ? 'B answered' : null,
      ),
    ];
    await batch('A', A, attempts, { timeoutMs: 90_000, parallel: true });
    const auditMark = audit.length;
    // forged sources need root in the sandbox; each is judged by the world's `spoofed`/`evil` counters
    await batch(
      'A (root)',
      A,
      [
        atk('T16', 'spoof-peer', "raw UDP with B's source address to evil", 'spoof', {
          src: addrB,
          ip: W.evil,
          port: 9999,
        }),
        atk('T16', 'spoof-good', "raw UDP with the allowed server's address as source", 'spoof', {
          src: W.good,
          ip: W.evil,
          port: 9999,
        }),
        atk(
          'T16',
          'spoof-host',
          "raw UDP with the host end's address as source to the gateway DNS",
          'spoof',
          { src: addrA.replace(/\d+$/, (d) => String(Number(d) - 1)), ip: W.host, port: 53, payload: 'x' },
        ),
        atk('T16', 'spoof-zero', 'raw UDP from 0.0.0.0', 'spoof', { src: '0.0.0.0', ip: W.evil, port: 9999 }),
        atk('T15', 'icmp-evil-root', 'ICMP echo to evil as root (raw socket)', 'icmp', { ip: W.evil }),
      ],
      { user: 'root' },
    );
    // a forged source that got past the packet layer would reach the gateway as an unknown sandbox
    const unknown = audit.slice(auditMark).filter((l) => l.reason === 'unregistered-source');
    if (unknown.length)
      rows.push({
        t: 'T16',
        id: 'spoof-gateway-saw',
        sandbox: 'A (root)',
        verdict: 'escaped',
        note: `gateway saw ${JSON.stringify(unknown[0])}`,
      });
    // B (CIDR rule covering the whole sandbox pool on port 7000) tries sandbox A
    await batch('B (cidr rules: pool:7000, metadata:8080)', B, [
      atk(
        'T19',
        'peer-via-cidr',
        'TCP to sandbox A :7000 through a CIDR rule covering the pool',
        'tcp',
        { ip: addrA, port: 7000 },
        noConnect,
      ),
      atk(
        'T18',
        'meta-via-cidr',
        '169.254.169.254:8080 through a CIDR rule naming it',
        'tcp',
        { ip: W.meta, port: 8080 },
        noConnect,
      ),
    ]);
    const [rb, ra] = await Promise.all(
      [lb, la].map((l) => readEvents(l.body.stream.url, l.body.stream.token).then(collect)),
    );
    for (const [label, r, id] of [
      ['B', rb, B],
      ['A', ra, A],
    ] as const) {
      expect(r!.stdout.toString(), label).toContain('LISTENING');
      const log = await s.exec(id, { cmd: 'sh', args: ['-c', 'cat /tmp/t19.log 2>/dev/null; echo END'] });
      const peerHits = log.stdout.toString().replace('END', '').trim();
      if (peerHits)
        rows.push({
          t: 'T19',
          id: `peer-listener-${label}`,
          sandbox: label,
          verdict: 'escaped',
          note: `sandbox ${label} received: ${peerHits}`,
        });
    }
  });

  it('T20/T22: placeholder replay, wrong host, plain HTTP, reflection; duplicate Authorization and smuggling', async () => {
    const auth = (ph: string) => `Authorization: Bearer ${ph}`;
    // a placeholder outlives nothing: D's, replayed by B after D has ended
    const D = await s.createSandbox({ timeoutSec: 120, egress: POLICY, credentials: ['cred-api'] });
    const phD = await placeholderOf(D);
    const del = await s.call<{ operation: { id: string } }>('DELETE', `/v1/sandboxes/${D}`);
    expect(
      (await s.call<{ state: string }>('GET', `/v1/operations/${del.body.operation.id}?waitMs=30000`)).body
        .state,
    ).toBe('succeeded');
    const mark = hits.length;
    await batch('B', B, [
      atk(
        'T20',
        'replay-after-end',
        'B sends the placeholder of a sandbox that has ended',
        'tls',
        tls(W.cred, 'api.cred.test', {
          verify: true,
          req: get('/refuse-ended', 'api.cred.test', [auth(phD)]),
        }),
        status(403),
      ),
      atk(
        'T20',
        'replay-from-b',
        "B sends A's placeholder to the credential host",
        'tls',
        tls(W.cred, 'api.cred.test', {
          verify: true,
          req: get('/refuse-replay', 'api.cred.test', [auth(phA)]),
        }),
        status(403),
      ),
      atk(
        'T20',
        'replay-mixed',
        "B sends its own and A's placeholder",
        'tls',
        tls(W.cred, 'api.cred.test', {
          verify: true,
          req: get('/refuse-mixed', 'api.cred.test', [auth(phB), `X-Other: ${phA}`]),
        }),
        status(403),
      ),
    ]);
    const out = await batch('A', A, [
      atk(
        'T20',
        'ph-wrong-host',
        'placeholder to an allowed non-credential host (spliced)',
        'tls',
        tls(W.good, 'pkg.allowed.test', { req: get('/t20-wronghost', 'pkg.allowed.test', [auth(phA)]) }),
        noReal,
      ),
      atk(
        'T20',
        'ph-plain-http',
        'placeholder to the credential host over plain HTTP',
        'http',
        { ip: W.cred, port: 80, req: get('/noinj-http', 'api.cred.test', [auth(phA)]) },
        noReal,
      ),
      atk(
        'T20',
        'ph-ip-literal',
        'placeholder to the credential IP without SNI',
        'tls',
        tls(W.cred, null, { req: get('/noinj-ip', 'api.cred.test', [auth(phA)]) }),
        refused,
      ),
      atk(
        'T20',
        'ph-sni-spoof',
        'placeholder with SNI pkg.allowed.test, Host api.cred.test',
        'tls',
        tls(W.cred, 'pkg.allowed.test', { req: get('/noinj-sni', 'api.cred.test', [auth(phA)]) }),
        noReal,
      ),
      atk(
        'T20',
        'ph-in-query',
        'placeholder in the URL',
        'tls',
        tls(W.cred, 'api.cred.test', { verify: true, req: get(`/refuse-q?key=${phA}`, 'api.cred.test') }),
        status(403),
      ),
      atk(
        'T20',
        'ph-other-header',
        'placeholder in another header',
        'tls',
        tls(W.cred, 'api.cred.test', {
          verify: true,
          req: get('/refuse-h', 'api.cred.test', [`X-Api-Key: ${phA}`]),
        }),
        status(403),
      ),
      atk(
        'T20',
        'reflect-echo',
        'an endpoint that echoes the injected header back',
        'tls',
        tls(W.cred, 'api.cred.test', { verify: true, req: get('/echo', 'api.cred.test', [auth(phA)]) }),
        (o) =>
          noReal(o, []) ??
          (body(o).includes('cred echo') ? null : `invalid: echo not served: ${body(o).slice(0, 80)}`),
      ),
      atk(
        'T22',
        'dup-auth',
        'pre-set duplicate Authorization (attacker value second)',
        'tls',
        tls(W.cred, 'api.cred.test', {
          verify: true,
          req: get('/t22-dup', 'api.cred.test', [auth(phA), 'Authorization: Bearer attacker-token']),
        }),
        noReal,
      ),
      atk(
        'T22',
        'dup-auth-first',
        'pre-set duplicate Authorization (attacker value first)',
        'tls',
        tls(W.cred, 'api.cred.test', {
          verify: true,
          req: get('/t22-dup2', 'api.cred.test', ['Authorization: Bearer attacker-token', auth(phA)]),
        }),
        noReal,
      ),
      atk(
        'T22',
        'conn-auth',
        '`Connection: authorization` with the placeholder',
        'tls',
        tls(W.cred, 'api.cred.test', {
          verify: true,
          req: get('/t22-conn', 'api.cred.test', [auth(phA), 'Connection: authorization']),
        }),
        noReal,
      ),
      atk(
        'T22',
        'smuggle-cl-te',
        'CL+TE with a smuggled request to evil.test after injection',
        'tls',
        tls(W.cred, 'api.cred.test', {
          verify: true,
          req: `POST /t22-smuggle HTTP/1.1\r\nHost: api.cred.test\r\n${auth(phA)}\r\nContent-Length: 60\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /refuse-smuggled HTTP/1.1\r\nHost: evil.test\r\n\r\n`,
        }),
        noReal,
      ),
      atk(
        'T22',
        'smuggle-dup-cl',
        'duplicate Content-Length',
        'tls',
        tls(W.cred, 'api.cred.test', {
          verify: true,
          req: `POST /refuse-dupcl HTTP/1.1\r\nHost: api.cred.test\r\nContent-Length: 5\r\nContent-Length: 40\r\n\r\nhello`,
        }),
        status(400),
      ),
      atk(
        'T22',
        'dot-segment',
        'GET /public/../refuse-admin',
        'tls',
        tls(W.cred, 'api.cred.test', {
          verify: true,
          req: get('/public/../refuse-admin', 'api.cred.test', [auth(phA)]),
        }),
        status(400),
      ),
      atk(
        'T22',
        'crlf-value',
        'CRLF-injected header value',
        'tls',
        tls(W.cred, 'api.cred.test', {
          verify: true,
          req: `GET /refuse-crlf HTTP/1.1\r\nHost: api.cred.test\r\nX-A: a\rHost: evil.test\r\n\r\n`,
        }),
        noReal,
      ),
    ]);
    expect(body(out.get('reflect-echo')!)).toContain('cred echo');
    const cred = hits
      .slice(mark)
      .filter((h) => h.role === 'cred' && (h.kind === 'https' || h.kind === 'http'));
    // what the credential upstream saw: the real value only on /echo and the T22 requests, never twice
    for (const h of cred) expect(h.auths?.length ?? 0, JSON.stringify(h)).toBeLessThanOrEqual(1);
    expect(cred.filter((h) => h.url?.startsWith('/noinj') && h.auths?.some((a) => a.includes(REAL)))).toEqual(
      [],
    );
    expect(allOutput).not.toContain(REAL);
  });

  it('T24: slowloris and oversized heads from A while B is still served', async () => {
    const hello = await captureHello('pkg.allowed.test');
    const [outA, outB] = await Promise.all([
      batch('A', A, [
        atk(
          'T24',
          'slowloris',
          `${MAX_CONNS + 4} connections trickling a ClientHello 1 byte / 300 ms`,
          'slowloris',
          { ip: W.good, n: MAX_CONNS + 4, every: 0.3, secs: 8, hello: hello.toString('hex') },
          (o) =>
            o.closed === o.opened && Number(o.last_close) < HANDSHAKE_MS / 1000 + 2.5
              ? null
              : `gateway kept trickling connections open: ${JSON.stringify(o)}`,
        ),
        atk(
          'T24',
          'huge-head',
          'a 1 MB request head',
          'http',
          {
            ip: W.good,
            port: 80,
            req: `GET /t24-huge HTTP/1.1\r\nHost: pkg.allowed.test\r\nX-Pad: {PAD}\r\n\r\n`,
            pad: 1 << 20,
          },
          (o) => (body(o).includes('good http') ? 'served' : null),
        ),
      ]),
      (async () => {
        await sleep(2500); // B asks while A's trickle is under way
        return batch('B (served during A’s slowloris)', B, [
          atk(
            'T24',
            'served-during',
            'B: 5 HTTPS requests to good.allowed.test',
            'latency',
            { ip: W.good, port: 443, name: 'good.allowed.test', n: 5 },
            (o) => (o.ok === 5 && Number(o.median_ms) < 1500 ? null : `B starved: ${JSON.stringify(o)}`),
          ),
        ]);
      })(),
    ]);
    expect(outA.get('slowloris')).toMatchObject({ stage: 'done' });
    expect(outB.get('served-during')).toMatchObject({ ok: 5 });
    expect(hits.some((h) => h.url === '/t24-huge')).toBe(false);
    expect(audit.some((l) => l.reason === 'handshake-timeout')).toBe(true);
  });

  it('T25: tightening the policy with PATCH closes open connections', async () => {
    const mark = hits.length;
    const cmd = await s.call<{ command: { id: string }; stream: { url: string; token: string } }>(
      'POST',
      `/v1/sandboxes/${A}/commands`,
      {
        cmd: 'python3',
        args: [
          '/tmp/atk.py',
          JSON.stringify([{ id: 't25', kind: 't25', ip: W.good, name: 'pkg.allowed.test', wait: 12 }]),
        ],
        timeoutMs: 40_000,
      },
    );
    expect(cmd.status).toBe(201);
    const stream = readEvents(cmd.body.stream.url, cmd.body.stream.token).then(collect);
    for (let i = 0; i < 100 && hits.slice(mark).filter((h) => h.url === '/t25-open').length < 2; i++)
      await sleep(100);
    expect(hits.slice(mark).filter((h) => h.url === '/t25-open')).toHaveLength(2);
    const tighter = { allow: ALLOWED.filter((n) => n !== 'pkg.allowed.test') };
    const patch = await s.call('PATCH', `/v1/sandboxes/${A}/egress`, tighter);
    expect(patch.status).toBe(200);
    const how = 'PATCH 200';
    const r = await stream;
    allOutput += r.stdout.toString();
    const line = r.stdout
      .toString()
      .split('\n')
      .find((l) => l.startsWith('{"id": "t25"'));
    const res = line ? (JSON.parse(line) as { out: { r: Record<string, string> } }).out.r : null;
    const after = hits.slice(mark).filter((h) => h.url === '/t25-after');
    const verdict = !res
      ? 'not-run'
      : after.length > 0 || !/closed/.test(res.tls ?? '') || !/closed/.test(res.http ?? '')
        ? 'escaped'
        : 'blocked';
    rows.push({
      t: 'T25',
      id: 'policy-tighten',
      sandbox: 'A',
      verdict,
      note: `${how}; ${JSON.stringify(res)}; far side after: ${after.length} requests`,
    });
    const restored = await s.call('PATCH', `/v1/sandboxes/${A}/egress`, { allow: ALLOWED });
    expect(restored.status).toBe(200);
  });

  it('latency: HTTPS through the gateway vs direct (CIDR rule), median of 30, same run', async () => {
    direct8443 = true;
    try {
      const r = await s.exec(B, {
        cmd: 'python3',
        args: [
          '/tmp/atk.py',
          JSON.stringify([
            { id: 'warm', kind: 'latency', ip: W.good, port: 443, name: 'good.allowed.test', n: 3 },
            { id: 'gateway', kind: 'latency', ip: W.good, port: 443, name: 'good.allowed.test', n: 30 },
            { id: 'direct', kind: 'latency', ip: W.good, port: 8443, name: 'good.allowed.test', n: 30 },
          ]),
        ],
        timeoutMs: 90_000,
      });
      const res = Object.fromEntries(
        r.stdout
          .toString()
          .split('\n')
          .filter((l) => l.startsWith('{'))
          .map((l) => JSON.parse(l) as { id: string; out: { median_ms: number; ok: number } })
          .map((j) => [j.id, j.out]),
      );
      console.log(
        `latency (new TLS connection + GET from inside a sandbox, n=30, median): gateway ${res.gateway?.median_ms?.toFixed(2)} ms, direct ${res.direct?.median_ms?.toFixed(2)} ms, added ${(res.gateway!.median_ms - res.direct!.median_ms).toFixed(2)} ms`,
      );
      expect(res.gateway).toMatchObject({ ok: 30 });
      expect(res.direct).toMatchObject({ ok: 30 });
    } finally {
      direct8443 = false;
    }
  });

  it('E6: one request, two names — duplicate Host, folding, ambiguous framing, HTTP/2 — refused on every request', async () => {
    const two = (a: string, b: string, path: string) =>
      `GET ${path} HTTP/1.1\r\nHost: ${a}\r\nHost: ${b}\r\nConnection: close\r\n\r\n`;
    await batch('A', A, [
      atk(
        'E6',
        'e6-two-hosts',
        'Host allowed, then Host forbidden (same address serves both)',
        'http',
        { ip: W.good, port: 80, req: two('pkg.allowed.test', 'evil.shared.test', '/e6a') },
        status(400),
      ),
      atk(
        'E6',
        'e6-two-hosts-rev',
        'Host forbidden, then Host allowed',
        'http',
        { ip: W.good, port: 80, req: two('evil.shared.test', 'pkg.allowed.test', '/e6b') },
        status(400),
      ),
      atk(
        'E6',
        'e6-keepalive',
        'a clean first request, then two Hosts on the same connection',
        'http',
        {
          ip: W.good,
          port: 80,
          req: 'GET /e6c HTTP/1.1\r\nHost: pkg.allowed.test\r\n\r\n',
          req2: two('pkg.allowed.test', 'evil.shared.test', '/e6d'),
        },
        (o, far) =>
          noForbiddenBody(o, far) ??
          (/\|\|HTTP\/1\.1 400/.test(body(o)) || !body(o).includes('||HTTP/1.1 200')
            ? null
            : `second request served: ${body(o).slice(0, 120)}`),
      ),
      atk(
        'E6',
        'e6-fold',
        'Host continued on a folded line',
        'http',
        {
          ip: W.good,
          port: 80,
          req: 'GET /e6e HTTP/1.1\r\nHost: pkg.allowed.test\r\n evil.shared.test\r\nConnection: close\r\n\r\n',
        },
        status(400),
      ),
      atk(
        'E6',
        'e6-cl-te',
        'CL+TE with a smuggled request for the forbidden name',
        'http',
        {
          ip: W.good,
          port: 80,
          req: 'POST /e6f HTTP/1.1\r\nHost: pkg.allowed.test\r\nContent-Length: 56\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /e6g HTTP/1.1\r\nHost: evil.shared.test\r\n\r\n',
        },
        status(400),
      ),
      atk(
        'E6',
        'e6-te-gzip',
        'Transfer-Encoding: gzip, chunked',
        'http',
        {
          ip: W.good,
          port: 80,
          req: 'POST /e6h HTTP/1.1\r\nHost: pkg.allowed.test\r\nTransfer-Encoding: gzip, chunked\r\nConnection: close\r\n\r\n0\r\n\r\n',
        },
        status(400),
      ),
      atk(
        'E6',
        'e6-h2-prior',
        'HTTP/2 prior knowledge on :80 (no :authority is ever read)',
        'http',
        { ip: W.good, port: 80, req: 'PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n' },
        refused,
      ),
      atk(
        'E6',
        'e6-h2c-upgrade',
        'Upgrade: h2c to the allowed name',
        'http',
        {
          ip: W.good,
          port: 80,
          req: 'GET /e6i HTTP/1.1\r\nHost: pkg.allowed.test\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n\r\n',
        },
        (o, far) => noForbiddenBody(o, far) ?? (/^HTTP\/1\.1 101/.test(body(o)) ? 'upgraded to h2c' : null),
      ),
      atk(
        'E6',
        'e6-intercepted',
        'intercepted TLS: Host api.cred.test, then Host evil.test',
        'tls',
        tls(W.cred, 'api.cred.test', {
          verify: true,
          req: two('api.cred.test', 'evil.test', '/refuse-e6').replace(
            'Connection: close\r\n',
            `Authorization: Bearer ${phA}\r\nConnection: close\r\n`,
          ),
        }),
        status(400),
      ),
    ]);
  });

  it("E7: the node's own addresses (interfaces, gained later, cluster config) are never dialled nor answered", async () => {
    await sh('ip', ['addr', 'add', `${W.node}/32`, 'dev', HOST_IF]);
    cleanups.push(() => run('ip', ['addr', 'del', `${W.node}/32`, 'dev', HOST_IF]));
    await startNodeServices(W.host);
    await startNodeServices(W.node);
    await sleep(3 * NODE_REFRESH_MS); // the gateway re-reads the node's addresses every NODE_REFRESH_MS
    const noAnswer: Judge = (o) =>
      o.stage === 'reply' && Number(o.answers) > 0 ? `DNS answered ${o.answers} address(es)` : null;
    const list: Attempt[] = [];
    for (const [name, what] of [
      ['node.allowed.test', "the node's address on this link"],
      ['node2.allowed.test', 'an address the node gained after the gateway started'],
      ['lb.allowed.test', 'a load balancer address from the cluster config'],
    ] as const) {
      const tag = name.split('.')[0];
      list.push(
        atk('E7', `e7-${tag}-dns`, `DNS ${name} (${what})`, 'dns', { ip: W.host, name }, noAnswer),
        atk(
          'E7',
          `e7-${tag}-http`,
          `HTTP Host ${name}`,
          'http',
          { ip: W.good, port: 80, req: get(`/e7-${tag}`, name) },
          status(403),
        ),
        atk(
          'E7',
          `e7-${tag}-tls`,
          `TLS SNI ${name}`,
          'tls',
          tls(W.good, name, { path: `/e7-${tag}` }),
          refused,
        ),
      );
    }
    await batch('A', A, list);
    expect(
      audit.filter((l) => l.reason === 'resolved-to-denied-address' && String(l.name).startsWith('node2'))
        .length,
    ).toBeGreaterThan(0);
  });

  // ---- E14 ----
  it('E14: addresses the node owns through local routes (AnyIP ranges added at run time), broadcast and multicast are never dialled nor answered', async () => {
    for (const range of [E14_ANYIP_RANGE, E14_ANYIP_RANGE2]) {
      await sh('ip', ['route', 'add', 'local', range, 'dev', 'lo']);
      cleanups.push(() => run('ip', ['route', 'del', 'local', range, 'dev', 'lo']));
    }
    // servers on the node, bound where the local routes make it answer: any connection is an escape
    await startNodeServices(E14_RECORDS['anyip.allowed.test']!);
    await startNodeServices(E14_RECORDS['anyip2.allowed.test']!);
    await sleep(3 * NODE_REFRESH_MS); // at the latest the periodic refresh has read the routes by now
    const noAnswer: Judge = (o) =>
      o.stage === 'reply' && Number(o.answers) > 0 ? `DNS answered ${o.answers} address(es)` : null;
    // the gateway itself must refuse the name (403), not merely fail to dial the address
    const refused403: Judge = (o, far) =>
      noForbiddenBody(o, far) ??
      (o.stage === 'response' && body(o).startsWith('HTTP/1.1 403')
        ? null
        : `not refused by the gateway: ${body(o).slice(0, 60) || o.stage}`);
    const list: Attempt[] = [];
    for (const name of Object.keys(E14_RECORDS)) {
      const tag = name.split('.')[0];
      list.push(
        atk('E14', `e14-${tag}-dns`, `DNS ${name}`, 'dns', { ip: W.host, name }, noAnswer),
        atk(
          'E14',
          `e14-${tag}-http`,
          `HTTP Host ${name}`,
          'http',
          { ip: W.good, port: 80, req: get(`/e14-${tag}`, name) },
          refused403,
        ),
        atk(
          'E14',
          `e14-${tag}-tls`,
          `TLS SNI ${name}`,
          'tls',
          tls(W.good, name, { path: `/e14-${tag}` }),
          refused,
        ),
      );
    }
    await batch('A', A, list);
    // this block's own verdicts (the whole-run table checks them again)
    expect(rows.filter((r) => r.t === 'E14' && r.verdict !== 'blocked')).toEqual([]);
    const denied = new Set(
      audit.filter((l) => l.reason === 'resolved-to-denied-address').map((l) => String(l.name)),
    );
    expect(Object.keys(E14_RECORDS).filter((n) => !denied.has(n))).toEqual([]);
  });
  // ---- end E14 ----

  it('E8: in allow-all mode a denied name holds by address and through CNAME chains', async () => {
    const C = await sandbox({ egress: { mode: 'allow-all', deny: ['evil.test', '*.evil.test'] } });
    try {
      await addressOf(C);
      e8Window.from = Date.now();
      const noAnswer: Judge = (o) =>
        o.stage === 'reply' && Number(o.answers) > 0 ? `DNS answered ${o.answers} address(es)` : null;
      const out = await batch('C (allow-all)', C, [
        atk('E8', 'e8-pos', 'allow-all still reaches an allowed name', 'http', {
          ip: W.good,
          port: 80,
          req: get('/e8-pos', 'good.allowed.test'),
        }),
        atk(
          'E8',
          'e8-alias-http',
          'HTTP Host alias.test (A record = the denied server)',
          'http',
          { ip: W.good, port: 80, req: get('/e8a', 'alias.test') },
          status(403),
        ),
        atk(
          'E8',
          'e8-alias-tls',
          'TLS SNI alias.test',
          'tls',
          tls(W.good, 'alias.test', { path: '/e8b' }),
          refused,
        ),
        atk('E8', 'e8-alias-dns', 'DNS alias.test', 'dns', { ip: W.host, name: 'alias.test' }, noAnswer),
        atk(
          'E8',
          'e8-cname-http',
          'HTTP Host cname.test (CNAME to cdn.evil.test)',
          'http',
          { ip: W.good, port: 80, req: get('/e8c', 'cname.test') },
          status(403),
        ),
        atk('E8', 'e8-cname-dns', 'DNS cname.test', 'dns', { ip: W.host, name: 'cname.test' }, noAnswer),
      ]);
      const pos = rows.findIndex((r) => r.id === 'e8-pos');
      expect(rows[pos]!.verdict).toBe('blocked'); // no far-side alarm
      rows.splice(pos, 1); // a positive check, not an attack
      expect(body(out.get('e8-pos')!)).toContain('good http host=good.allowed.test');
    } finally {
      e8Window.to = Date.now() + 1000;
      await s.call('DELETE', `/v1/sandboxes/${C}`);
    }
  });

  it('E10: reflected values are masked in every form the gateway recognises; method/path limits keep the value from echo endpoints', async () => {
    const V = `sk-scoped-${randomBytes(16).toString('hex')}`;
    CANARIES.push(V);
    expect(
      (
        await s.call('PUT', '/v1/credentials/cred-scoped', {
          domains: ['api.cred.test'],
          value: V,
          methods: ['GET'],
          paths: ['/ok*'],
        })
      ).status,
    ).toBe(200);
    const F = await sandbox({ egress: POLICY, credentials: ['cred-scoped'] });
    try {
      const r = await s.exec(F, { cmd: 'printenv', args: ['CRED_SCOPED'] });
      const phF = r.stdout.toString().trim();
      const auth = (ph: string) => `Authorization: Bearer ${ph}`;
      const echo = (path: string) =>
        atk(
          'E10',
          `e10${path.replace('/', '-')}`,
          `credential host reflects the value: ${path}`,
          'tls',
          tls(W.cred, 'api.cred.test', { verify: true, req: get(path, 'api.cred.test', [auth(phA)]) }),
          (o) =>
            noRealAnyForm(o, REAL) ??
            (/^HTTP\/1\.1 200/.test(body(o)) ? null : `invalid: not served: ${body(o).slice(0, 80)}`),
        );
      await batch('A', A, ['/echo-name', '/echo-b64', '/echo-hex', '/echo-gz'].map(echo));
      // the positive check (last in the batch) may fall in a refused attempt's time window
      const valueSent = (far: Hit[]) =>
        far.filter(
          (h) => h.role === 'cred' && h.url !== '/ok-scoped' && (h.auths ?? []).some((a) => a.includes(V)),
        );
      const scoped = (id: string, what: string, req: string): Attempt =>
        atk(
          'E10',
          id,
          what,
          'tls',
          tls(W.cred, 'api.cred.test', { verify: true, req }),
          (o, far) =>
            noRealAnyForm(o, V) ??
            (valueSent(far).length > 0
              ? `value sent to ${valueSent(far)
                  .map((h) => `${h.method} ${h.url}`)
                  .join(', ')}`
              : null),
        );
      const mark = hits.length;
      await batch('F (scoped credential)', F, [
        scoped(
          'e10-scope-path',
          'GET /echo with a credential limited to /ok*',
          get('/echo', 'api.cred.test', [auth(phF)]),
        ),
        scoped(
          'e10-scope-method',
          'POST /ok-x with a credential limited to GET',
          `POST /ok-x HTTP/1.1\r\nHost: api.cred.test\r\n${auth(phF)}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n`,
        ),
        scoped(
          'e10-scope-encoded',
          'GET /ok%2f..%2fecho (encoded separators)',
          get('/ok%2f..%2fecho', 'api.cred.test', [auth(phF)]),
        ),
        atk(
          'E10',
          'e10-scope-ok',
          'GET /ok-scoped (allowed)',
          'tls',
          tls(W.cred, 'api.cred.test', {
            verify: true,
            req: get('/ok-scoped', 'api.cred.test', [auth(phF)]),
          }),
        ),
      ]);
      const pos = rows.findIndex((x) => x.id === 'e10-scope-ok');
      expect(rows[pos]!.verdict).toBe('blocked');
      rows.splice(pos, 1); // a positive check, not an attack
      const seen = hits.slice(mark).filter((h) => h.role === 'cred' && h.kind === 'https');
      expect(seen.map((h) => [h.url, h.auths])).toEqual([['/ok-scoped', [`Bearer ${V}`]]]);
    } finally {
      await s.call('DELETE', `/v1/sandboxes/${F}`);
      await s.call('DELETE', '/v1/credentials/cred-scoped');
    }
  });

  it("E11: malformed upstream heads end one exchange, never the gateway; one sandbox's flood leaves another served", async () => {
    const auth = `Authorization: Bearer ${phA}`;
    await batch('A', A, [
      atk(
        'E11',
        'e11-http-status',
        'allowed upstream answers `200 O\\x01K`',
        'http',
        { ip: W.good, port: 80, req: get('/e11-badstatus', 'pkg.allowed.test') },
        status(502),
      ),
      atk(
        'E11',
        'e11-http-header',
        'allowed upstream answers a header name with a control character',
        'http',
        { ip: W.good, port: 80, req: get('/e11-badheader', 'pkg.allowed.test') },
        status(502),
      ),
      atk(
        'E11',
        'e11-cred-status',
        'credential host answers `200 O\\x01K`',
        'tls',
        tls(W.cred, 'api.cred.test', {
          verify: true,
          req: get('/ok-e11-badstatus', 'api.cred.test', [auth]),
        }),
        status(502),
      ),
      atk(
        'E11',
        'e11-still-up',
        'the next request is served (the gateway did not go down)',
        'http',
        { ip: W.good, port: 80, req: get('/after-e11', 'pkg.allowed.test') },
        (o) =>
          body(o).includes('good http host=pkg.allowed.test')
            ? null
            : `gateway did not serve: ${body(o).slice(0, 80)}`,
      ),
    ]);
    const [, outB] = await Promise.all([
      batch('A', A, [
        atk(
          'E11',
          'e11-flood',
          `A floods: 3000 DNS queries and ${MAX_CONNS * 3} new TLS connections`,
          'flood',
          { ip: W.good, name: 'pkg.allowed.test', dns: 3000, conns: MAX_CONNS * 3, port: 443, secs: 3 },
        ),
      ]),
      (async () => {
        await sleep(1500);
        return batch('B (served during A’s flood)', B, [
          atk(
            'E11',
            'e11-served-during',
            'B: DNS and 5 HTTPS requests during A’s flood',
            'latency',
            { ip: W.good, port: 443, name: 'good.allowed.test', n: 5 },
            (o) => (o.ok === 5 ? null : `B starved: ${JSON.stringify(o)}`),
          ),
        ]);
      })(),
    ]);
    expect(outB.get('e11-served-during')).toMatchObject({ ok: 5 });
    expect(audit.some((l) => l.reason === 'malformed-response')).toBe(true);
  });

  it('E9: revocation and rotation reach the gateway within its cache time, survive a gateway restart (which orphans no sandbox); the placeholder then goes out as is', async () => {
    const [V1, V2, V3] = [1, 2, 3].map((i) => `sk-rev${i}-${randomBytes(16).toString('hex')}`);
    CANARIES.push(V1!, V2!, V3!);
    const put = (value: string) =>
      s.call('PUT', '/v1/credentials/cred-rev', { domains: ['api.cred.test'], value });
    expect((await put(V1!)).status).toBe(200);
    const E = await sandbox({ egress: POLICY, credentials: ['cred-rev'] });
    try {
      const phE = (await s.exec(E, { cmd: 'printenv', args: ['CRED_REV'] })).stdout.toString().trim();
      expect(phE).toMatch(/^space_ph_/);
      const seenAt = (far: Hit[], url: string) =>
        far.filter((h) => h.role === 'cred' && h.url === url).flatMap((h) => h.auths ?? []);
      const ask = (id: string, what: string, expected: string) =>
        batch('E', E, [
          atk(
            'E9',
            id,
            what,
            'tls',
            tls(W.cred, 'api.cred.test', {
              verify: true,
              req: get(`/${id}`, 'api.cred.test', [`Authorization: Bearer ${phE}`]),
            }),
            (o, far) => {
              const seen = seenAt(far, `/${id}`);
              if (JSON.stringify(o).match(/sk-rev\d-/)) return 'a real value reached the sandbox';
              return JSON.stringify(seen) === JSON.stringify([expected])
                ? null
                : `upstream saw ${JSON.stringify(seen)}, expected ${expected.slice(0, 12)}…`;
            },
          ),
        ]);
      await ask('e9-before', 'before: the value is injected', `Bearer ${V1}`);
      expect(rows.pop()).toMatchObject({ verdict: 'blocked' }); // positive check
      expect((await put(V2!)).status).toBe(200);
      await sleep(CREDENTIAL_CACHE_MS + 500);
      await ask('e9-rotated', 'after rotation: the new value', `Bearer ${V2}`);
      expect(rows.pop()).toMatchObject({ verdict: 'blocked' }); // positive check
      expect((await s.call('DELETE', '/v1/credentials/cred-rev')).status).toBe(204);
      await sleep(CREDENTIAL_CACHE_MS + 500);
      await ask(
        'e9-revoked',
        `${CREDENTIAL_CACHE_MS + 500} ms after DELETE: the placeholder goes out as is`,
        `Bearer ${phE}`,
      );
      // a gateway restart: every running sandbox is registered again by the agent, and only those
      // (deletes of earlier tests may still be under way: wait until the registry is the running set)
      // every team's running sandboxes (a key lists only its own team's)
      const running = async () =>
        (
          await Promise.all(
            [s, ...new Set(owners.values())].map(
              async (c) =>
                (
                  await c.call<{ sandboxes: { id: string }[] }>('GET', '/v1/sandboxes?state=running')
                ).body.sandboxes,
            ),
          )
        )
          .flat()
          .map((x) => x.id)
          .filter((id, i, all) => all.indexOf(id) === i)
          .sort();
      const registered = () =>
        s
          .gateway!.deps.registry.list()
          .map((r) => r.sandboxId)
          .sort();
      let before = await running();
      for (let i = 0; i < 40 && JSON.stringify(registered()) !== JSON.stringify(before); i++) {
        await sleep(250);
        before = await running();
      }
      expect(registered()).toEqual(before); // positive check: the comparison below can pass
      await s.restartGateway();
      for (let i = 0; i < 40 && s.gateway!.deps.registry.size < before.length; i++) await sleep(250);
      const after = registered();
      rows.push({
        t: 'E11',
        id: 'e11-restart-orphans',
        sandbox: '-',
        verdict: JSON.stringify(after) === JSON.stringify(before) ? 'blocked' : 'escaped',
        note: `registered before restart ${before.length}, after ${after.length}`,
      });
      await ask('e9-after-restart', 'after a gateway restart: still revoked', `Bearer ${phE}`);
      expect((await put(V3!)).status).toBe(200); // the same name registered again: a new generation
      await sleep(CREDENTIAL_CACHE_MS + 500);
      await ask(
        'e9-recreated',
        'a credential re-created under the same name does not reach the old grant',
        `Bearer ${phE}`,
      );
    } finally {
      await s.call('DELETE', `/v1/sandboxes/${E}`);
      await s.call('DELETE', '/v1/credentials/cred-rev');
    }
  });

  it('E12: a body on GET/HEAD/DELETE/OPTIONS (chunked, or a Content-Length that Connection names) is framed by the gateway, never a second request', async () => {
    const smuggled = (path: string) => `GET ${path} HTTP/1.1\r\nHost: evil.shared.test\r\n\r\n`;
    const chunked = (method: string, path: string) => {
      const inner = smuggled(`${path}-smuggled`);
      return `${method} ${path} HTTP/1.1\r\nHost: pkg.allowed.test\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n${inner.length.toString(16)}\r\n${inner}\r\n0\r\n\r\n`;
    };
    const namedLength = (method: string, path: string) => {
      const inner = smuggled(`${path}-smuggled`);
      return `${method} ${path} HTTP/1.1\r\nHost: pkg.allowed.test\r\nContent-Length: ${inner.length}\r\nConnection: close, Content-Length\r\n\r\n${inner}`;
    };
    /** The far side served the forbidden host (forbidden() flags it too), or the sandbox read its answer. */
    const notSmuggled: Judge = (o, far) =>
      noForbiddenBody(o, far) ??
      (body(o).includes('host=evil.shared.test')
        ? `smuggled request served: ${body(o).slice(0, 120)}`
        : null);
    const ids: string[] = [];
    const attempt = (id: string, what: string, req: string) => {
      ids.push(id);
      // this attempt's own smuggled request, read by the server as a request of its own
      const own = /(\/e12[a-z])-smuggled/.exec(req)![0];
      return atk('E12', id, what, 'http', { ip: W.good, port: 80, req }, (o, far) =>
        far.some((h) => h.role === 'good' && h.url === own)
          ? `the server read ${own} as a request for ${far.find((h) => h.url === own)!.host}`
          : notSmuggled(o, far),
      );
    };
    await batch('A', A, [
      attempt(
        'e12-get-chunked',
        'GET with a chunked body holding a request for evil.shared.test',
        chunked('GET', '/e12a'),
      ),
      attempt('e12-head-chunked', 'HEAD with a chunked body', chunked('HEAD', '/e12b')),
      attempt('e12-delete-chunked', 'DELETE with a chunked body', chunked('DELETE', '/e12c')),
      attempt('e12-options-chunked', 'OPTIONS with a chunked body', chunked('OPTIONS', '/e12d')),
      attempt(
        'e12-get-length-named',
        'GET with a Content-Length that Connection names',
        namedLength('GET', '/e12e'),
      ),
      attempt(
        'e12-delete-length-named',
        'DELETE with a Content-Length that Connection names',
        namedLength('DELETE', '/e12f'),
      ),
      attempt(
        'e12-keepalive-second',
        'a clean request, then a chunked GET on the same connection',
        `GET /e12g HTTP/1.1\r\nHost: pkg.allowed.test\r\n\r\n${chunked('GET', '/e12h')}`,
      ),
    ]);
    expectBlocked(ids);
  });

  it('E13: after a HelloRetryRequest the second ClientHello must name the same server (every spliced hello is checked)', async () => {
    const hrr = (extra: Record<string, unknown>) => ({ ip: W.hrr, sni1: 'hrr.allowed.test', ...extra });
    const served = (o: Out) => {
      const m = /hrr served (\S+)/.exec(body(o));
      return m && m[1] !== 'hrr.allowed.test' ? `the server served ${m[1]}` : null;
    };
    const ids = ['e13-hrr-other', 'e13-hrr-nosni', 'e13-hrr-ccs-split', 'e13-hrr-pipelined'];
    await batch('A', A, [
      atk('E13', ids[0]!, 'second hello names evil.test', 'hrr', hrr({ sni2: 'evil.test' }), served),
      atk(
        'E13',
        ids[1]!,
        'second hello has no SNI (default virtual host)',
        'hrr',
        hrr({ sni2: null }),
        served,
      ),
      atk(
        'E13',
        ids[2]!,
        'change_cipher_spec, then the second hello split across two records',
        'hrr',
        hrr({ sni2: 'evil.test', ccs: true, split: true }),
        served,
      ),
      atk(
        'E13',
        ids[3]!,
        'both hellos sent at once, before the server answered',
        'hrr',
        hrr({ sni2: 'evil.test', pipelined: true }),
        served,
      ),
    ]);
    expectBlocked(ids);
    // positive control, on its own: a legitimate retry reaches the server, whose log shows both hellos
    const mark = hits.length;
    await batch('A', A, [
      atk(
        'E13',
        'e13-hrr-same',
        'second hello names the same server (positive)',
        'hrr',
        hrr({ sni2: 'HRR.allowed.test' }),
      ),
    ]);
    const pos = rows.findIndex((x) => x.id === 'e13-hrr-same');
    expect(rows[pos]!.verdict).toBe('blocked');
    rows.splice(pos, 1);
    const hellos = hits.slice(mark).filter((h) => h.role === 'hrr' && h.kind === 'hello');
    expect(hellos.filter((h) => h.sni === 'HRR.allowed.test')).toHaveLength(1);
  });

  it('E15: a path limit means the path the server will route: path parameters and other router normalisations never receive the value', async () => {
    const V = `sk-e15-${randomBytes(16).toString('hex')}`;
    CANARIES.push(V);
    const put = await s.call('PUT', '/v1/credentials/cred-e15', {
      domains: ['api.cred.test'],
      value: V,
      methods: ['GET'],
      paths: ['/v1/*'],
    });
    expect(put.status).toBe(200);
    const G = await sandbox({ egress: POLICY, credentials: ['cred-e15'] });
    try {
      const phG = (await s.exec(G, { cmd: 'printenv', args: ['CRED_E15'] })).stdout.toString().trim();
      expect(phG).toMatch(/^space_ph_/);
      /** The far side received the value on this attempt's own path. */
      const sentOn =
        (path: string): Judge =>
        (o, far) =>
          noRealAnyForm(o, V) ??
          (far.some((h) => h.role === 'cred' && h.url === path && (h.auths ?? []).some((a) => a.includes(V)))
            ? `value sent to GET ${path}`
            : null);
      const paths: [string, string][] = [
        ['e15-servlet-param', '/v1/..;/echo'],
        ['e15-named-param', '/v1/..;jsessionid=0/echo'],
        ['e15-double-encoded', '/v1/%252e%252e/echo'],
        ['e15-encoded-semicolon', '/v1/..%3b/echo'],
        ['e15-nul', '/v1/..%00/echo'],
        ['e15-trailing-space', '/v1/..%20/echo'],
        ['e15-three-dots', '/v1/.../echo'],
        ['e15-iis-u', '/v1/%u002e%u002e/echo'],
        ['e15-overlong', '/v1/%c0%ae%c0%ae/echo'],
        ['e15-nfkc', '/v1/%E2%80%A5/echo'],
      ];
      const mark = hits.length;
      await batch('G (credential limited to GET /v1/*)', G, [
        ...paths.map(([id, path]) =>
          atk(
            'E15',
            id,
            `GET ${path} with a credential limited to /v1/*`,
            'tls',
            tls(W.cred, 'api.cred.test', {
              verify: true,
              req: get(path, 'api.cred.test', [`Authorization: Bearer ${phG}`]),
            }),
            sentOn(path),
          ),
        ),
        atk(
          'E15',
          'e15-ok',
          'GET /v1/ok-e15 (allowed)',
          'tls',
          tls(W.cred, 'api.cred.test', {
            verify: true,
            req: get('/v1/ok-e15', 'api.cred.test', [`Authorization: Bearer ${phG}`]),
          }),
        ),
      ]);
      const pos = rows.findIndex((x) => x.id === 'e15-ok');
      expect(rows[pos]!.verdict).toBe('blocked');
      rows.splice(pos, 1); // a positive check, not an attack
      const withValue = hits
        .slice(mark)
        .filter((h) => h.role === 'cred' && (h.auths ?? []).some((a) => a.includes(V)));
      expect(withValue.map((h) => h.url)).toContain('/v1/ok-e15');
      expectBlocked(paths.map(([id]) => id));
    } finally {
      await s.call('DELETE', `/v1/sandboxes/${G}`);
      await s.call('DELETE', '/v1/credentials/cred-e15');
    }
  });

  it('E16: a gzip body followed by anything (NUL and the value, a hidden member, header fields, nesting) is masked whole or refused', async () => {
    const variants: [string, string][] = [
      ['e16-nul', 'a gzip member, a NUL, then the value'],
      ['e16-hex', 'a gzip member, a NUL, then the value in hex'],
      ['e16-b64', 'a gzip member, a NUL, then the value in base64'],
      ['e16-member', 'a gzip member, a NUL, then a member holding the value'],
      ['e16-nested', 'gzip inside gzip holding the value'],
      ['e16-fname', 'the value as the gzip FNAME header field'],
    ];
    await batch(
      'A',
      A,
      variants.map(([id, what]) =>
        atk(
          'E16',
          id,
          `credential host answers ${what}`,
          'tls',
          tls(W.cred, 'api.cred.test', {
            verify: true,
            req: get(`/echo-${id}`, 'api.cred.test', [`Authorization: Bearer ${phA}`]),
          }),
          (o) => noRealUnpacked(o, REAL),
        ),
      ),
    );
    expectBlocked(variants.map(([id]) => id));
  });

  it("E17: one sandbox's gzip downloads from a credential host leave another sandbox's HTTPS and DNS served (same-run baseline)", async () => {
    const measure = (id: string, what: string, judge?: Judge) =>
      atk('E17', id, what, 'latdns', { ip: W.good, name: 'good.allowed.test', n: 24 }, judge);
    const base = (await batch('B (baseline)', B, [measure('e17-baseline', 'B alone: DNS + HTTPS')])).get(
      'e17-baseline',
    )!;
    expect(rows.pop()).toMatchObject({ verdict: 'blocked' }); // a measurement, not an attack
    expect(base).toMatchObject({ fails: 0 });
    /** Generous: ten times B's own figure alone, plus 300 ms. */
    const bound = (alone: unknown) => 10 * Number(alone) + 300;
    const [outA, outB] = await Promise.all([
      batch('A', A, [
        atk(
          'E17',
          'e17-flood',
          'A: 4 threads download a gzip body that unpacks to 96 MiB, for 8 s',
          'getloop',
          {
            ip: W.cred,
            sni: 'api.cred.test',
            path: '/echo-e17-bomb',
            threads: 4,
            secs: 8,
            max: 160,
          },
        ),
      ]),
      (async () => {
        await sleep(1500);
        return batch('B (during A’s downloads)', B, [
          measure('e17-served-during', 'B: DNS + HTTPS during A’s downloads', (o) => {
            const slow: string[] = [];
            for (const k of ['https_median_ms', 'https_p95_ms', 'dns_median_ms', 'dns_p95_ms'] as const) {
              if (!(Number(o[k]) <= bound(base[k])))
                slow.push(`${k} ${Number(o[k]).toFixed(0)} vs ${Number(base[k]).toFixed(0)} alone`);
            }
            if (Number(o.dns_lost) > 1) slow.push(`${o.dns_lost} DNS queries lost`);
            return slow.length > 0 ? `B slowed: ${slow.join('; ')}` : null;
          }),
        ]);
      })(),
    ]);
    const during = outB.get('e17-served-during');
    console.log(
      `E17: B alone ${JSON.stringify(base)}\nE17: B during A's gzip downloads ${JSON.stringify(during)}\nE17: A's downloads ${JSON.stringify(outA.get('e17-flood'))}`,
    );
    expectBlocked(['e17-flood', 'e17-served-during']);
  });

  it('prints N attempts, M blocked, K escaped — and nothing escaped', async () => {
    await sleep(300);
    // the whole run, once more: the forbidden servers and the upstream DNS server
    const stray = hits.map((h) => ({ h, why: forbidden(h) })).filter((x) => x.why && !(x.h.port === 8443));
    if (stray.length)
      rows.push({
        t: 'ALL',
        id: 'far-side-whole-run',
        sandbox: '-',
        verdict: 'escaped',
        note: stray.map((x) => x.why).join('; '),
      });
    for (const v of CANARIES.filter((c) => allOutput.includes(c)))
      rows.push({
        t: 'E9/E10',
        id: 'other-value-in-sandbox',
        sandbox: '-',
        verdict: 'escaped',
        note: `sandbox output contained the real value ${v.slice(0, 10)}…`,
      });
    if (allOutput.includes(REAL))
      rows.push({
        t: 'T20',
        id: 'real-value-in-sandbox',
        sandbox: '-',
        verdict: 'escaped',
        note: 'sandbox output contained the real value',
      });
    const width = (k: keyof Row) => Math.max(...rows.map((r) => r[k].length), 4);
    const table = rows
      .map(
        (r) =>
          `${r.t.padEnd(width('t'))}  ${r.id.padEnd(width('id'))}  ${r.sandbox.padEnd(width('sandbox'))}  ${r.verdict.padEnd(8)}  ${r.note.slice(0, 220)}`,
      )
      .join('\n');
    const n = rows.length;
    const m = rows.filter((r) => r.verdict === 'blocked').length;
    const k = rows.filter((r) => r.verdict === 'escaped').length;
    const residual = rows.filter((r) => r.verdict === 'residual').length;
    const broken = rows.filter((r) => r.verdict === 'not-run' || r.verdict === 'invalid').length;
    console.log(
      `${table}\n\n${n} attempts, ${m} blocked, ${k} escaped (${residual} documented residual, ${broken} failed to run); sandbox clock skew ms: ${JSON.stringify([...skew.values()])}`,
    );
    expect(world?.exitCode).toBeNull();
    expect(rows.filter((r) => r.verdict !== 'blocked' && r.verdict !== 'residual')).toEqual([]);
    expect(k).toBe(0);
    // a host with a second address (a bridge, a VPN) gets T18's per-port attempt on it too
    expect(n).toBe(EXPECTED_ATTEMPTS + T18_HOST_PORTS * (t18HostAddresses - 1));
  });

  // last, after the whole-run verdict (these hits are on purpose): a listener that cannot record a
  // hit would make every "blocked" above meaningless
  it('positive control: every forbidden listener records a hit when reached on purpose', async () => {
    const mark = hits.length;
    const tcp = [80, 443, 8443, 22, 853, 7000, 8080];
    const udp = [123, 443, 9999];
    const want: { role: string; kind: 'tcp' | 'udp'; port: number; address: string }[] = [];
    for (const role of ['evil', 'internal', 'meta', 'lb'] as const) {
      for (const port of tcp) want.push({ role, kind: 'tcp', port, address: W[role] });
      for (const port of [...udp, ...(role === 'evil' ? [] : [53])])
        want.push({ role, kind: 'udp', port, address: W[role] });
    }
    // good's forbidden ports too (only 80/443/8443 by name or CIDR rule may reach it)
    for (const port of [22, 853, 7000, 8080]) want.push({ role: 'good', kind: 'tcp', port, address: W.good });
    for (const port of [...udp, 53]) want.push({ role: 'good', kind: 'udp', port, address: W.good });
    // from inside the world's own namespace, where every role's address is local
    const probe = `const net=require('net'),dgram=require('dgram');const t=${JSON.stringify(want)};let left=t.length;const done=()=>{if(--left===0)setTimeout(()=>process.exit(0),200)};for(const w of t){if(w.kind==='tcp'){const c=net.connect(w.port,w.address,()=>{c.end('x');done()});c.on('error',done);}else{const u=dgram.createSocket('udp4');u.send('x',w.port,w.address,()=>{u.close();done()});}}setTimeout(()=>process.exit(1),5000);`;
    await run('ip', ['netns', 'exec', NS, process.execPath, '-e', probe]);
    const missing = () =>
      want.filter(
        (w) => !hits.slice(mark).some((h) => h.role === w.role && h.kind === w.kind && h.port === w.port),
      );
    for (let i = 0; i < 50 && missing().length > 0; i++) await sleep(100);
    expect(missing().map((w) => `${w.role} ${w.kind}:${w.port}`)).toEqual([]);
    // and each of them is one the verdict calls forbidden
    for (const h of hits.slice(mark))
      expect(forbidden(h) ?? `${h.role} ${h.kind}:${h.port} not forbidden`).not.toMatch(/not forbidden$/);
  });
});
