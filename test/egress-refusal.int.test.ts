/**
 * Runtime case R24: denied egress fails fast on every port, and removing a CIDR
 * rule closes what it had allowed. From inside a real gVisor sandbox of a real single-node stack
 * (with its gateway), against a "far" server in a network namespace of the test's own
 * (198.18.<k>.0/24, a benchmark range no real network uses), judged on both sides: the sandbox's
 * client must be told no (reset / ICMP unreachable) well before its own 5 s timeout — a
 * correctness bound against a silent drop, not a speed goal — and the far side must have seen
 * nothing of a denied connection.
 */
import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { randomInt } from 'node:crypto';
import { once } from 'node:events';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { SandboxNetworks } from '../runtime/agent/host/network.ts';
import { DEFAULT_DENY_CIDRS } from '../runtime/gateway/addresses.ts';
import { type Stack, startStack, stopThenClean, waitFor } from './stack.ts';
import { makeWorldLink, worldLinkNames } from './world-link.ts';

const LINK = worldLinkNames('rej');

/** A 198.18.<k>.0/24 no route of this host's lies in yet. @throws Error when all are taken. */
function freeNet(): string {
  const routes = JSON.parse(
    execFileSync('ip', ['-j', '-4', 'route', 'show', 'table', 'all'], { encoding: 'utf8' }),
  ) as {
    dst?: string;
  }[];
  const used = new Set(routes.map((r) => /^198\.18\.(\d+)\./.exec(r.dst ?? '')?.[1]).filter(Boolean));
  const free = Array.from({ length: 254 }, (_, i) => i + 1).filter((k) => !used.has(String(k)));
  if (free.length === 0) throw new Error('every 198.18.<k>.0/24 is taken: remove leftover rej-* namespaces');
  return `198.18.${free[randomInt(free.length)]}`;
}
const NET = freeNet();
const HOST = `${NET}.1`;
const FAR = `${NET}.2`;
/** The one port a CIDR rule opens to FAR. */
const OPEN = 8443;
/** Ports clients commonly hang on when egress is dropped (ssh, postgres, redis, http-alt). */
const DENIED_TCP = [22, 5432, 6379, 8080];
const DENIED_UDP = [9999, 123];
/** The client's own timeout in the sandbox, s, and the bound a refusal must arrive within, s. */
const CLIENT_TIMEOUT_S = 5;
const REFUSED_WITHIN_S = 2;

/** What the far side saw: connections, data, errors (one JSON line each from the world process). */
interface FarEvent {
  kind: 'listening' | 'conn' | 'data' | 'error' | 'close' | 'udp' | 'pushed';
  port?: number;
  from?: string;
  data?: string;
  code?: string;
  /** Which connection (numbered by the far server in accept order). */
  n?: number;
}
const far: FarEvent[] = [];
let world: ChildProcess;

/** The far server: TCP listeners on OPEN and every denied port, UDP ones too; `push <text>` on stdin writes to every open connection. */
const WORLD = `
const net = require('node:net'), dgram = require('node:dgram'), rl = require('node:readline');
const say = (e) => process.stdout.write(JSON.stringify(e) + '\\n');
const conns = new Set();
let count = 0;
for (const port of ${JSON.stringify([OPEN, ...DENIED_TCP])}) {
  net.createServer((c) => {
    const n = ++count;
    conns.add(c);
    say({ kind: 'conn', port, n, from: c.remoteAddress });
    c.on('data', (d) => say({ kind: 'data', port, n, data: d.toString() }));
    c.on('error', (e) => say({ kind: 'error', port, n, code: e.code }));
    c.on('close', () => { conns.delete(c); say({ kind: 'close', port, n }); });
    c.write('hello\\n');
  }).listen(port, ${JSON.stringify(FAR)}, () => say({ kind: 'listening', port }));
}
for (const port of ${JSON.stringify(DENIED_UDP)}) {
  const u = dgram.createSocket('udp4');
  u.on('message', (m, r) => { say({ kind: 'udp', port, from: r.address }); u.send('pong', r.port, r.address); });
  u.bind(port, ${JSON.stringify(FAR)});
}
rl.createInterface({ input: process.stdin }).on('line', (line) => {
  if (!line.startsWith('push ')) return;
  for (const c of conns) c.write(line.slice(5) + '\\n');
  say({ kind: 'pushed', data: line.slice(5) });
});
`;

/**
 * The client in the sandbox: each probe connects (TCP) or sends and waits for an answer (UDP) with
 * a CLIENT_TIMEOUT_S timeout, and reports what it got and how long it took, s.
 */
const PROBE = `
import json, socket, sys, time
out = []
for p in json.loads(sys.argv[1]):
    t0 = time.monotonic()
    kind = socket.SOCK_STREAM if p['proto'] == 'tcp' else socket.SOCK_DGRAM
    s = socket.socket(socket.AF_INET, kind)
    s.settimeout(${CLIENT_TIMEOUT_S})
    try:
        s.connect((p['addr'], p['port']))
        if p['proto'] == 'udp':
            s.send(b'ping')
            s.recv(100)
            got = 'answered'
        else:
            got = 'connected'
    except socket.timeout:
        got = 'timeout'
    except OSError as e:
        got = __import__('errno').errorcode.get(e.errno, str(e.errno))
    s.close()
    out.append({**p, 'got': got, 's': round(time.monotonic() - t0, 3)})
print(json.dumps(out))
`;

/**
 * Holds one connection to FAR:OPEN: reads the greeting, says so, waits for /tmp/go, then sends a
 * line and reads until the connection ends, a line with `bye` arrives or CLIENT_TIMEOUT_S passes;
 * reports everything it read and how the read ended.
 */
const HOLD = `
import json, os, socket, time
s = socket.create_connection((${JSON.stringify(FAR)}, ${OPEN}), timeout=${CLIENT_TIMEOUT_S})
first = s.recv(100).decode()
open('/tmp/held', 'w').write(first)
for _ in range(600):
    if os.path.exists('/tmp/go'): break
    time.sleep(0.05)
got, end = '', None
t0 = time.monotonic()
try:
    s.sendall(b'ping\\n')
    while True:
        d = s.recv(100)
        if not d:
            end = 'eof'
            break
        got += d.decode()
        if 'bye' in got:
            end = 'bye'
            break
except socket.timeout:
    end = 'timeout'
except OSError as e:
    end = __import__('errno').errorcode.get(e.errno, str(e.errno))
print(json.dumps({'first': first, 'got': got, 'end': end, 's': round(time.monotonic() - t0, 3)}))
`;

const REFUSALS = ['ECONNREFUSED', 'EHOSTUNREACH', 'ENETUNREACH', 'ECONNRESET'];

describe('R24: denied egress is refused at once, and a removed CIDR rule closes its connections', () => {
  let s: Stack;
  let id: string;
  let hostEnd = '';
  const cleanups: (() => Promise<unknown>)[] = [];

  beforeAll(async () => {
    // routed: replies to the CIDR rule's connection come back on this link and go on to the sandbox
    await makeWorldLink(LINK, { hostCidr: `${HOST}/24`, nsCidrs: [`${FAR}/24`], routed: true }, cleanups);
    world = spawn('ip', ['netns', 'exec', LINK.ns, process.execPath, '-e', WORLD], {
      stdio: ['pipe', 'pipe', 'inherit'],
    });
    cleanups.push(async () => {
      if (world.exitCode === null && world.signalCode === null) {
        world.kill('SIGKILL');
        await once(world, 'exit');
      }
    });
    let buf = '';
    world.stdout!.on('data', (d: Buffer) => {
      buf += d.toString();
      for (let nl = buf.indexOf('\n'); nl >= 0; nl = buf.indexOf('\n')) {
        far.push(JSON.parse(buf.slice(0, nl)) as FarEvent);
        buf = buf.slice(nl + 1);
      }
    });
    await waitFor('the far server to listen', async () =>
      far.filter((e) => e.kind === 'listening').length === 1 + DENIED_TCP.length ? true : undefined,
    );
    // nothing resolves names here: the gateway's upstream is a port nobody answers on
    s = await startStack({}, { upstreamDns: '127.0.0.1:9', denyCidrs: DEFAULT_DENY_CIDRS.join(',') });
    id = await s.createSandbox({
      timeoutSec: 600,
      egress: { allow: [], cidrs: [{ cidr: `${FAR}/32`, ports: [OPEN] }] },
    });
    // the sandbox's own address: the source a UDP socket is given for an outside destination (a
    // connect on UDP only chooses the route; nothing is sent)
    const ip = await s.exec(id, {
      cmd: 'python3',
      args: ['-c', `import socket; u=socket.socket(2,2); u.connect(('${FAR}',9)); print(u.getsockname()[0])`],
    });
    const sandboxAddress = ip.stdout.toString().trim();
    hostEnd = sandboxAddress.replace(/\d+$/, (d) => String(Number(d) - 1));
    expect(hostEnd).toMatch(/^\d+\.\d+\.\d+\.\d+$/);
  }, 300_000);

  afterAll(() => stopThenClean(s, cleanups), 120_000);

  async function probe(list: { addr: string; port: number; proto: 'tcp' | 'udp' }[]) {
    const r = await s.exec(id, {
      cmd: 'python3',
      args: ['-c', PROBE, JSON.stringify(list)],
      timeoutMs: 120_000,
    });
    expect(r.exit.exitCode, r.stderr.toString()).toBe(0);
    return JSON.parse(r.stdout.toString()) as {
      addr: string;
      port: number;
      proto: string;
      got: string;
      s: number;
    }[];
  }

  it('TCP to any port no rule allows is refused well within the client timeout (forwarded and host-bound), and never arrives', async () => {
    const mark = far.length;
    const targets = [
      // forwarded: the far server (a rule opens only OPEN there), and an address no rule names
      ...DENIED_TCP.map((port) => ({ addr: FAR, port, proto: 'tcp' as const })),
      { addr: `${NET}.77`, port: 22, proto: 'tcp' as const },
      // to the node itself: the sandbox's own host end
      ...[22, 6379, 8080].map((port) => ({ addr: hostEnd, port, proto: 'tcp' as const })),
    ];
    const got = await probe(targets);
    const slow = got.filter((g) => !REFUSALS.includes(g.got) || g.s >= REFUSED_WITHIN_S);
    expect(slow, JSON.stringify(got)).toEqual([]);
    expect(far.slice(mark).filter((e) => e.kind === 'conn')).toEqual([]);
  });

  it('UDP no rule allows is answered with an ICMP unreachable, never delivered', async () => {
    const mark = far.length;
    const targets = [
      ...DENIED_UDP.map((port) => ({ addr: FAR, port, proto: 'udp' as const })),
      { addr: hostEnd, port: 9999, proto: 'udp' as const },
    ];
    const got = await probe(targets);
    const slow = got.filter((g) => !REFUSALS.includes(g.got) || g.s >= REFUSED_WITHIN_S);
    expect(slow, JSON.stringify(got)).toEqual([]);
    expect(far.slice(mark).filter((e) => e.kind === 'udp')).toEqual([]);
  });

  it('the port the rule opens still connects (the refusals are not everything refused)', async () => {
    const got = await probe([{ addr: FAR, port: OPEN, proto: 'tcp' }]);
    expect(got[0]?.got).toBe('connected');
  });

  const RULE = { cidr: `${FAR}/32`, ports: [OPEN] };

  /** Opens a held connection to FAR:OPEN from the sandbox; returns its exec and the far side's number for it. */
  async function hold() {
    await s.exec(id, { cmd: 'rm', args: ['-f', '/tmp/go', '/tmp/held'] });
    const mark = far.length;
    const held = s.exec(id, { cmd: 'python3', args: ['-c', HOLD], timeoutMs: 120_000 });
    await waitFor('the sandbox to hold its connection', async () => {
      const r = await s.exec(id, { cmd: 'cat', args: ['/tmp/held'] });
      return r.stdout.toString().startsWith('hello') ? true : undefined;
    });
    const opened = far.slice(mark).filter((e) => e.kind === 'conn' && e.port === OPEN);
    expect(opened).toHaveLength(1);
    const n = opened[0]!.n;
    return { held, mine: (e: FarEvent) => e.n === n };
  }

  const patchEgress = async (egress: Record<string, unknown>) =>
    expect((await s.call('PATCH', `/v1/sandboxes/${id}/egress`, egress)).status).toBe(200);

  it.each([
    ['removed', { allow: [], cidrs: [] }],
    ['narrowed to another port', { allow: [], cidrs: [{ ...RULE, ports: [OPEN + 1] }] }],
    ['narrowed to another address', { allow: [], cidrs: [{ cidr: `${NET}.3/32`, ports: [OPEN] }] }],
  ])(
    'a CIDR rule %s resets the connection it had allowed, at both ends, instead of black-holing it',
    async (_what, egress) => {
      await patchEgress({ allow: [], cidrs: [RULE] });
      const { held, mine } = await hold();
      await patchEgress(egress);
      // the far end speaks first: what it sends must not reach the sandbox, and it is told the
      // connection is gone (a reset), not left to time out
      world.stdin!.write('push after-removal bye\n');
      await waitFor(
        'the far end to see its connection end',
        async () =>
          far.some((e) => mine(e) && (e.kind === 'error' || e.kind === 'close')) ? true : undefined,
        10_000,
      );
      expect(far.find((e) => mine(e) && e.kind === 'error')?.code).toBe('ECONNRESET');
      // then the sandbox speaks: it is told at once, and never got the far end's line
      await s.exec(id, { cmd: 'touch', args: ['/tmp/go'] });
      const r = await held;
      const out = JSON.parse(r.stdout.toString()) as { got: string; end: string; s: number };
      expect(out.got).not.toContain('after-removal');
      expect(REFUSALS, JSON.stringify(out)).toContain(out.end);
      expect(out.s).toBeLessThan(REFUSED_WITHIN_S);
      expect(far.filter((e) => mine(e) && e.kind === 'data')).toEqual([]);
    },
  );

  it('a policy change that keeps the rule leaves its open connection alone, both ways', async () => {
    await patchEgress({ allow: [], cidrs: [RULE] });
    const { held, mine } = await hold();
    await patchEgress({ allow: ['other.test'], cidrs: [RULE, { cidr: `${NET}.3/32`, ports: [22] }] });
    world.stdin!.write('push still-here bye\n');
    await s.exec(id, { cmd: 'touch', args: ['/tmp/go'] });
    const out = JSON.parse((await held).stdout.toString()) as { got: string; end: string };
    expect(out).toMatchObject({ end: 'bye', got: expect.stringContaining('still-here') });
    await waitFor('the sandbox line to arrive', async () =>
      far.some((e) => mine(e) && e.kind === 'data' && e.data?.includes('ping')) ? true : undefined,
    );
    // no reset at the far end (the script's own close at exit is a FIN, not an error)
    expect(far.filter((e) => mine(e) && e.kind === 'error')).toEqual([]);
  });

  it('an agent restart re-adopting the sandbox (its network layer) leaves the connection its rule allows alone', async () => {
    await patchEgress({ allow: [], cidrs: [RULE] });
    const { held, mine } = await hold();
    // what a restarted agent does before it applies the sandbox's policy again: the base ruleset
    // and each adopted sandbox's chains, installed anew
    const g = s.gateway!;
    const found = await new SandboxNetworks({
      pool: s.pool,
      gateway: { dns: g.dnsPort, http: g.httpPort, tls: g.tlsPort },
    }).adopt();
    expect(found.length).toBeGreaterThan(0);
    world.stdin!.write('push still-here bye\n');
    await s.exec(id, { cmd: 'touch', args: ['/tmp/go'] });
    const out = JSON.parse((await held).stdout.toString()) as { got: string; end: string };
    expect(out).toMatchObject({ end: 'bye', got: expect.stringContaining('still-here') });
    expect(far.filter((e) => mine(e) && e.kind === 'error')).toEqual([]);
  });
});
