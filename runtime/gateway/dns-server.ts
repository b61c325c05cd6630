/**
 * The sandboxes' only resolver (UDP and TCP; port 53 is redirected here). A query from an
 * unregistered source is dropped. For an allowed name, A is answered from the gateway's own
 * upstream resolution minus the deny set (short TTL) and AAAA with an empty NOERROR (sandboxes
 * have no IPv6). Everything else — names the policy refuses, other types, malformed or over-long
 * names, queries over the per-sandbox rate — gets REFUSED and is never forwarded upstream (T03, T05).
 */
import { createSocket, type Socket as UdpSocket } from 'node:dgram';
import { createServer, type Server, type Socket } from 'node:net';
import dnsPacket, { type Answer, type DecodedPacket, type Question } from 'dns-packet';
import type { Audit, Decision, DenyReason } from './audit.ts';
import { decideClaim, resolveForSandbox } from './decide.ts';
import { MAX_NAME_BYTES } from './policy.ts';
import { canonicalAddress, type Registry, type TrackedConnection } from './registry.ts';
import type { UpstreamResolver } from './resolver.ts';

/** DNS response codes used here. */
const RCODE = { NOERROR: 0, FORMERR: 1, SERVFAIL: 2, REFUSED: 5 } as const;
/** Most A records in one answer (keeps UDP answers under 512 bytes without EDNS). */
const MAX_ANSWERS = 16;
/** Most concurrent queries in flight on one TCP connection before it is paused. */
const MAX_TCP_INFLIGHT = 16;
/** A DNS-over-TCP connection with no query for this long is closed, ms. */
const TCP_IDLE_MS = 10_000;

/** What the DNS server needs. */
export interface DnsDeps {
  registry: Registry;
  resolver: UpstreamResolver;
  audit: Audit;
  /** Longest TTL in answers, s. */
  answerTtlSec: number;
}

/** A minimal response header only (when the query could not be decoded): id, QR, the rcode. */
function bareResponse(query: Buffer, rcode: number): Buffer | null {
  if (query.length < 12) return null;
  const out = Buffer.alloc(12);
  query.copy(out, 0, 0, 2);
  out.writeUInt16BE(0x8000 | (query.readUInt16BE(2) & 0x7900) | rcode, 2); // QR, opcode, RD kept
  return out;
}

function respond(q: DecodedPacket, question: Question, rcode: number, answers: Answer[] = []): Buffer {
  return dnsPacket.encode({
    type: 'response',
    id: q.id,
    flags: (q.flag_rd ? dnsPacket.RECURSION_DESIRED : 0) | dnsPacket.RECURSION_AVAILABLE | rcode,
    questions: [question],
    answers,
  });
}

// once-per-second log suppression for floods (rate-limited and unregistered sources)
const lastLogged = new Map<string, number>();
function shouldLog(key: string): boolean {
  const now = Date.now();
  if ((lastLogged.get(key) ?? 0) > now - 1000) return false;
  if (lastLogged.size > 10_000) lastLogged.clear();
  lastLogged.set(key, now);
  return true;
}

/**
 * Answers one DNS message `buf` from `sourceAddress`. Returns the response bytes, or null to drop
 * (unregistered source, or a message too short to answer). Never throws.
 */
export async function answerQuery(
  deps: DnsDeps,
  sourceAddress: string | undefined,
  buf: Buffer,
): Promise<Buffer | null> {
  const source = canonicalAddress(sourceAddress) ?? String(sourceAddress);
  const reg = deps.registry.lookup(source);
  const d: Decision = {
    protocol: 'dns',
    source,
    sandboxId: reg?.sandboxId ?? null,
    name: null,
    address: null,
    port: null,
    rule: null,
  };
  const deny = (reason: DenyReason, quiet = false) => deps.audit.deny({ ...d, reason }, quiet);
  if (!reg) {
    deny('unregistered-source', !shouldLog(`unreg:${source}`));
    return null;
  }
  if (!reg.dnsBucket.take()) {
    deny('rate-limited', !shouldLog(`rate:${reg.sandboxId}`));
    return bareResponse(buf, RCODE.REFUSED);
  }
  let q: DecodedPacket;
  try {
    q = dnsPacket.decode(buf);
  } catch (err) {
    deny(/too long/.test(String((err as Error).message)) ? 'name-too-long' : 'malformed-query');
    return bareResponse(buf, RCODE.FORMERR);
  }
  const question = q.questions?.[0];
  const opcode = (q as { opcode?: string }).opcode;
  if (q.type !== 'query' || opcode !== 'QUERY' || q.questions?.length !== 1 || !question) {
    deny('malformed-query');
    return bareResponse(buf, RCODE.REFUSED);
  }
  d.name = question.name.slice(0, 255);
  if (question.name.length > MAX_NAME_BYTES) {
    deny('name-too-long');
    return respond(q, question, RCODE.REFUSED);
  }
  const claim = decideClaim(reg.policy, question.name);
  d.name = claim.name;
  d.rule = claim.rule;
  if (!claim.allowed) {
    deny(claim.reason);
    return respond(q, question, RCODE.REFUSED);
  }
  if (question.class !== undefined && question.class !== 'IN') {
    deny('unsupported-query');
    return respond(q, question, RCODE.REFUSED);
  }
  if (question.type === 'AAAA') {
    deps.audit.allow({ ...d, rule: `${claim.rule} (AAAA empty)` });
    return respond(q, question, RCODE.NOERROR);
  }
  if (question.type !== 'A') {
    deny('unsupported-query');
    return respond(q, question, RCODE.REFUSED);
  }
  try {
    // the same screening as dialling: deny set, denied names' addresses, CNAME chains (E7, E8)
    const r = await resolveForSandbox(deps.resolver, reg.policy, claim.name);
    const ttl = Math.min(deps.answerTtlSec, r.ttlSec);
    const answers: Answer[] = r.allowed
      .slice(0, MAX_ANSWERS)
      .map((address) => ({ type: 'A', name: question.name, class: 'IN', ttl, data: address }));
    if (answers.length === 0 && r.reason !== null) {
      // rebinding, the node's own address, a denied name's address: the sandbox gets no address at all
      d.address = r.denied[0] ?? null;
      deny(r.reason);
      return respond(q, question, RCODE.NOERROR);
    }
    deps.audit.allow({ ...d, address: r.allowed[0] ?? null });
    return respond(q, question, RCODE.NOERROR, answers);
  } catch {
    deny('resolution-failed');
    return respond(q, question, RCODE.SERVFAIL);
  }
}

/** The DNS server: one UDP socket and one TCP server on the same port. */
export interface DnsServer {
  readonly udp: UdpSocket;
  readonly tcp: Server;
  /** Binds both on `host:port` (0 = a free port, the same for both); resolves with the port. */
  listen(host: string, port: number): Promise<number>;
  close(): Promise<void>;
}

/** Builds the DNS server (not listening). */
export function createDnsServer(deps: DnsDeps): DnsServer {
  const udp = createSocket({ type: 'udp4' });
  udp.on('message', (msg, rinfo) => {
    void answerQuery(deps, rinfo.address, msg).then((out) => {
      if (out) udp.send(out, rinfo.port, rinfo.address);
    });
  });
  udp.on('error', () => {});
  const tcp = createServer((socket) => handleTcp(deps, socket));

  return {
    udp,
    tcp,
    async listen(host, port) {
      await new Promise<void>((resolve, reject) => {
        tcp.once('error', reject);
        tcp.listen(port, host, () => resolve());
      });
      const bound = (tcp.address() as { port: number }).port;
      await new Promise<void>((resolve, reject) => {
        udp.once('error', reject);
        udp.bind(bound, host, () => resolve());
      });
      return bound;
    },
    async close() {
      await new Promise<void>((resolve) => udp.close(() => resolve()));
      await new Promise<void>((resolve) => tcp.close(() => resolve()));
    },
  };
}

/** DNS over TCP: 2-byte length-prefixed messages, a bounded number in flight, idle timeout. */
function handleTcp(deps: DnsDeps, socket: Socket): void {
  socket.on('error', () => {});
  const reg = deps.registry.lookup(socket.remoteAddress);
  const source = canonicalAddress(socket.remoteAddress) ?? String(socket.remoteAddress);
  const base: Decision = {
    protocol: 'dns',
    source,
    sandboxId: reg?.sandboxId ?? null,
    name: null,
    address: null,
    port: null,
    rule: null,
  };
  if (!reg) {
    deps.audit.deny({ ...base, reason: 'unregistered-source' }, !shouldLog(`unreg:${source}`));
    socket.destroy();
    return;
  }
  const conn: TrackedConnection = {
    protocol: 'dns',
    name: null,
    intercepted: false,
    close: () => socket.destroy(),
  };
  const admitted = deps.registry.admit(reg, conn);
  if (admitted !== true) {
    deps.audit.deny({ ...base, reason: admitted });
    socket.destroy();
    return;
  }
  deps.audit.metrics.connections.inc({ protocol: 'dns' });
  socket.once('close', () => {
    deps.registry.release(reg, conn);
    deps.audit.metrics.connections.dec({ protocol: 'dns' });
  });
  socket.setTimeout(TCP_IDLE_MS, () => socket.destroy());
  let pending: Buffer = Buffer.alloc(0);
  let inflight = 0;
  socket.on('data', (chunk: Buffer) => {
    pending = pending.length === 0 ? chunk : Buffer.concat([pending, chunk]);
    while (pending.length >= 2) {
      const len = pending.readUInt16BE(0);
      if (pending.length < 2 + len) break;
      const msg = pending.subarray(2, 2 + len);
      pending = pending.subarray(2 + len);
      inflight++;
      if (inflight >= MAX_TCP_INFLIGHT) socket.pause();
      void answerQuery(deps, socket.remoteAddress, msg).then((out) => {
        inflight--;
        if (inflight < MAX_TCP_INFLIGHT) socket.resume();
        if (!out || socket.destroyed) return;
        const framed = Buffer.alloc(2 + out.length);
        framed.writeUInt16BE(out.length, 0);
        out.copy(framed, 2);
        socket.write(framed);
      });
    }
  });
}
