/**
 * The far side of the attack suite (`attacks.int.test.ts`), run inside an `atk-…` network namespace:
 * `ip netns exec atk-… node test/attack-world.ts '<json config>'`.
 *
 * Per role (good, evil, internal, meta) a set of listeners on the role's address: HTTP :80, HTTPS
 * :443 and :8443, plain TCP catch-alls (22, 853, 7000, 8080) and UDP catch-alls (53 except on the
 * DNS role, 123, 443, 9999). The `cred` role is the credential upstream: HTTPS that checks
 * `Authorization: Bearer <real value>` (and `/echo` reflects the headers it received; `/echo-e16-…`
 * and `/echo-e17-bomb` answer the third round's packed bodies). `hrr` is a raw TLS 1.3 server that
 * answers HelloRetryRequest and logs each ClientHello's SNI (E13). The `dns`
 * role is the authoritative server for `*.test` (UDP and TCP); `evil` also answers DNS on :53
 * (an "alternate resolver"). Every connection, request, datagram and query is printed as one JSON
 * line on stdout (the hit log); `READY` once everything listens.
 */
import { createSocket } from 'node:dgram';
import { readFileSync } from 'node:fs';
import { createServer as createHttp, type IncomingMessage, type ServerResponse } from 'node:http';
import { createServer as createHttps } from 'node:https';
import { createServer as createTcp, type Socket } from 'node:net';
import type { TLSSocket } from 'node:tls';
import { gzipSync } from 'node:zlib';
import dnsPacket from 'dns-packet';
import { gzipNamed } from '../runtime/gateway/test-gzip.ts';

/** Config passed as argv[2]. */
export interface WorldConfig {
  /** role → address its listeners bind (good, evil, internal, meta, cred). */
  roles: Record<string, string>;
  dnsAddress: string;
  certFile: string;
  keyFile: string;
  /**
   * A records of the authoritative server (name → IPv4); `*.x` entries match any name below x; a
   * value `cname:<target>` makes the name a CNAME of target (E8).
   */
  records: Record<string, string>;
  /** The value the credential upstream expects after `Bearer `. */
  credValue: string;
}

const TCP_CATCH = [22, 853, 7000, 8080];
const UDP_CATCH = [53, 123, 443, 9999];

function hit(entry: Record<string, unknown>): void {
  process.stdout.write(`${JSON.stringify({ t: Date.now(), ...entry })}\n`);
}

function lookup(records: Record<string, string>, name: string): string | undefined {
  if (records[name]) return records[name];
  for (const [k, v] of Object.entries(records)) {
    if (k.startsWith('*.') && name.endsWith(k.slice(1))) return v;
  }
  return undefined;
}

/** Answers one DNS query (A and TXT from `records`; anything else: NXDOMAIN/empty). */
function answer(records: Record<string, string>, msg: Buffer, role: string, via: string): Buffer | null {
  let q: dnsPacket.DecodedPacket;
  try {
    q = dnsPacket.decode(msg);
  } catch {
    hit({ role, kind: 'dns', via, name: null, type: 'malformed' });
    return null;
  }
  const question = q.questions?.[0];
  if (!question) return null;
  const name = question.name.toLowerCase();
  hit({ role, kind: 'dns', via, name, type: question.type });
  const answers: dnsPacket.Answer[] = [];
  let address = role === 'dns' ? lookup(records, name) : '10.198.0.66';
  if (address?.startsWith('cname:')) {
    const target = address.slice('cname:'.length);
    answers.push({ type: 'CNAME', name: question.name, ttl: 60, data: target });
    address = question.type === 'A' ? lookup(records, target) : undefined;
    if (address) answers.push({ type: 'A', name: target, ttl: 60, data: address });
    address ??= target;
  } else if (address && question.type === 'A')
    answers.push({ type: 'A', name: question.name, ttl: 60, data: address });
  if (address && question.type === 'TXT')
    answers.push({ type: 'TXT', name: question.name, ttl: 60, data: `txt-${role}` });
  return dnsPacket.encode({
    type: 'response',
    id: q.id,
    flags: dnsPacket.AUTHORITATIVE_ANSWER | (address ? 0 : 3),
    questions: [question],
    answers,
  });
}

function dnsServers(records: Record<string, string>, role: string, address: string): Promise<void>[] {
  const udp = createSocket('udp4');
  udp.on('message', (msg, rinfo) => {
    const out = answer(records, msg, role, 'udp');
    if (out) udp.send(out, rinfo.port, rinfo.address);
  });
  const tcp = createTcp((s) => {
    let buf = Buffer.alloc(0);
    s.on('error', () => {});
    s.on('data', (d: Buffer) => {
      buf = Buffer.concat([buf, d]);
      while (buf.length >= 2 && buf.length >= 2 + buf.readUInt16BE(0)) {
        const len = buf.readUInt16BE(0);
        const out = answer(records, buf.subarray(2, 2 + len), role, 'tcp');
        buf = buf.subarray(2 + len);
        if (out) s.write(Buffer.concat([Buffer.from([out.length >> 8, out.length & 255]), out]));
      }
    });
  });
  return [
    new Promise((resolve) => udp.bind(53, address, () => resolve())),
    new Promise((resolve) => tcp.listen(53, address, () => resolve())),
  ];
}

// ---------- third round (E13, E16, E17) ----------

let bomb: Buffer | null = null;

/**
 * E16/E17 bodies of the credential host, unlabelled gzip with the received value somewhere a
 * first-member unpacker does not look (E16), or a small body that unpacks to 96 MiB (E17); null
 * for any other URL.
 */
function round3CredBody(url: string, value: string): Buffer | null {
  const z = (t: string | Buffer) => gzipSync(t);
  switch (url) {
    case '/echo-e16-nul':
      return Buffer.concat([z('x'), Buffer.from(`\0Bearer ${value}`)]);
    case '/echo-e16-hex':
      return Buffer.concat([z('x'), Buffer.from(`\0${Buffer.from(value).toString('hex')}`)]);
    case '/echo-e16-b64':
      return Buffer.concat([z('x'), Buffer.from(`\0${Buffer.from(value).toString('base64')}`)]);
    case '/echo-e16-member':
      return Buffer.concat([z('x'), Buffer.from([0]), z(`Bearer ${value}`)]);
    case '/echo-e16-nested':
      return z(z(`Bearer ${value}`));
    case '/echo-e16-fname':
      return gzipNamed(value, 'plain text');
    case '/echo-e17-bomb':
      bomb ??= gzipSync(Buffer.alloc(96 * 1024 * 1024), { level: 9 });
      return bomb;
    default:
      return null;
  }
}

/** SHA-256 of "HelloRetryRequest": the ServerHello.random of a HelloRetryRequest (RFC 8446 §4.1.3). */
const HRR_RANDOM = Buffer.from('cf21ad74e59a6111be1d8c021e65b891c2a211167abb8c5e079e09e2c8a8339c', 'hex');

/** A TLS record holding a ServerHello (`retry`: a HelloRetryRequest asking for secp256r1). */
function serverHelloRecord(retry: boolean): Buffer {
  const ext = retry
    ? Buffer.from([0x00, 0x2b, 0, 2, 3, 4, 0x00, 0x33, 0, 2, 0x00, 0x17])
    : Buffer.from([0x00, 0x2b, 0, 2, 3, 4]);
  const body = Buffer.concat([
    Buffer.from([3, 3]),
    retry ? HRR_RANDOM : Buffer.alloc(32, 0x5a),
    Buffer.from([0, 0x13, 0x01, 0, ext.length >> 8, ext.length & 255]),
    ext,
  ]);
  const msg = Buffer.concat([Buffer.from([2, 0, body.length >> 8, body.length & 255]), body]);
  return Buffer.concat([Buffer.from([0x16, 3, 3, msg.length >> 8, msg.length & 255]), msg]);
}

/** The SNI host_name of a ClientHello message body, or null (a small reader: the far side only logs). */
function helloSni(body: Buffer): string | null {
  let p = 2 + 32;
  p += 1 + body[p]!;
  p += 2 + body.readUInt16BE(p);
  p += 1 + body[p]!;
  const end = p + 2 + body.readUInt16BE(p);
  p += 2;
  while (p + 4 <= end) {
    const type = body.readUInt16BE(p);
    const len = body.readUInt16BE(p + 2);
    if (type === 0) return body.subarray(p + 9, p + 4 + len).toString('latin1');
    p += 4 + len;
  }
  return null;
}

/**
 * E13: a TLS 1.3 server in the clear part of its handshake that picks its virtual host by SNI. It
 * answers the first ClientHello with a HelloRetryRequest and logs every ClientHello it reads (hit
 * `hello` with its SNI: the name it would serve), answering the second with a ServerHello and the
 * name it serves. Handshake messages are reassembled across records.
 */
function helloRetryServer() {
  return createTcp((s) => {
    s.on('error', () => {});
    hit({ role: 'hrr', kind: 'tcp', port: 443, from: s.remoteAddress });
    let records = Buffer.alloc(0);
    let handshake = Buffer.alloc(0);
    let hellos = 0;
    s.on('data', (d: Buffer) => {
      records = Buffer.concat([records, d]);
      while (records.length >= 5 && records.length >= 5 + records.readUInt16BE(3)) {
        const type = records[0];
        const payload = records.subarray(5, 5 + records.readUInt16BE(3));
        records = records.subarray(5 + payload.length);
        if (type !== 0x16) continue;
        handshake = Buffer.concat([handshake, payload]);
        while (handshake.length >= 4 && handshake.length >= 4 + handshake.readUIntBE(1, 3)) {
          const len = handshake.readUIntBE(1, 3);
          const msg = handshake.subarray(0, 4 + len);
          handshake = handshake.subarray(4 + len);
          if (msg[0] !== 1) continue;
          let sni: string | null = null;
          try {
            sni = helloSni(msg.subarray(4));
          } catch {}
          hellos++;
          hit({ role: 'hrr', kind: 'hello', port: 443, sni, n: hellos });
          if (hellos === 1) s.write(serverHelloRecord(true));
          else
            s.end(Buffer.concat([serverHelloRecord(false), Buffer.from(`hrr served ${sni ?? '(default)'}`)]));
        }
      }
    });
  });
}

async function main(): Promise<void> {
  const cfg = JSON.parse(process.argv[2] ?? '{}') as WorldConfig;
  const cert = readFileSync(cfg.certFile);
  const key = readFileSync(cfg.keyFile);
  const listening: Promise<void>[] = [];
  const listen = (
    server: { listen: (p: number, a: string, cb: () => void) => unknown },
    port: number,
    a: string,
  ) => listening.push(new Promise((resolve) => server.listen(port, a, () => resolve())));

  for (const [role, address] of Object.entries(cfg.roles)) {
    if (role === 'hrr') {
      listen(helloRetryServer(), 443, address);
      continue;
    }
    const handler = (kind: string, port: number) => (req: IncomingMessage, res: ServerResponse) => {
      const sni = (req.socket as TLSSocket).servername ?? null;
      const auths: string[] = [];
      const hosts: string[] = [];
      for (let i = 0; i + 1 < req.rawHeaders.length; i += 2) {
        const n = req.rawHeaders[i]!.toLowerCase();
        if (n === 'authorization') auths.push(req.rawHeaders[i + 1]!);
        if (n === 'host') hosts.push(req.rawHeaders[i + 1]!);
      }
      hit({
        role,
        kind,
        port,
        host: req.headers.host ?? null,
        hosts,
        sni,
        url: req.url,
        method: req.method,
        auths,
        from: req.socket.remoteAddress,
      });
      let body = 0;
      req.on('data', (d: Buffer) => {
        body += d.length;
      });
      req.on('end', () => {
        if (req.url?.includes('e11-bad')) {
          // E11: a malformed response head (node:http refuses to write these, so raw bytes)
          req.socket.end(
            req.url.endsWith('e11-badheader')
              ? 'HTTP/1.1 200 OK\r\nX-A\x01: b\r\ncontent-length: 2\r\n\r\nhi'
              : 'HTTP/1.1 200 O\x01K\r\ncontent-length: 2\r\n\r\nhi',
          );
          return;
        }
        if (role === 'cred') {
          const round3 = round3CredBody(req.url ?? '', (auths[0] ?? '').replace(/^Bearer /, ''));
          if (round3) {
            res.end(round3);
            return;
          }
          const ok = auths.length === 1 && auths[0] === `Bearer ${cfg.credValue}`;
          const value = (auths[0] ?? '').replace(/^Bearer /, '');
          // E10: endpoints that hand the received value back in other forms
          if (req.url === '/echo-name') {
            res.writeHead(200, { [`x-${value}`]: '1' }).end('named');
            return;
          }
          if (req.url === '/echo-b64') {
            res.end(
              `b64=${Buffer.from(value).toString('base64')} b64url1=${Buffer.from(`a${value}`).toString('base64url')} b64x2=${Buffer.from(`ab${value}`).toString('base64')}`,
            );
            return;
          }
          if (req.url === '/echo-hex') {
            res.end(
              `hex=${Buffer.from(value).toString('hex')} HEX=${Buffer.from(value).toString('hex').toUpperCase()} UP=${value.toUpperCase()}`,
            );
            return;
          }
          if (req.url === '/echo-gz') {
            res.end(gzipSync(`gz ${value}`)); // gzip without a Content-Encoding label
            return;
          }
          if (req.url?.startsWith('/echo')) {
            res.writeHead(200, { 'content-type': 'text/plain' });
            res.end(`cred echo auths=${JSON.stringify(auths)} headers=${JSON.stringify(req.rawHeaders)}`);
            return;
          }
          res.writeHead(ok ? 200 : 401, { 'content-type': 'text/plain' });
          res.end(ok ? `cred ok ${req.url}` : `cred unauthorized ${req.url}`);
          return;
        }
        res.writeHead(200, { 'content-type': 'text/plain' });
        res.end(
          `${role} ${kind} host=${req.headers.host ?? ''} sni=${sni ?? ''} url=${req.url} body=${body}`,
        );
      });
    };
    const http = createHttp(handler('http', 80));
    http.on('connection', (s) => hit({ role, kind: 'tcp', port: 80, from: s.remoteAddress }));
    listen(http, 80, address);
    for (const port of [443, 8443]) {
      const https = createHttps({ cert, key }, handler('https', port));
      https.on('connection', (s: Socket) => hit({ role, kind: 'tcp', port, from: s.remoteAddress }));
      https.on('tlsClientError', () => {});
      listen(https, port, address);
    }
    if (role === 'cred') continue;
    for (const port of TCP_CATCH) {
      const server = createTcp((s) => {
        hit({ role, kind: 'tcp', port, from: s.remoteAddress });
        s.on('error', () => {});
        s.on('data', (d: Buffer) => hit({ role, kind: 'tcp-data', port, bytes: d.length }));
        s.end(`${role} tcp ${port}\n`);
      });
      listen(server, port, address);
    }
    for (const port of UDP_CATCH) {
      if (port === 53 && role === 'evil') continue; // evil answers DNS (below)
      const udp = createSocket('udp4');
      udp.on('message', (msg, rinfo) => {
        hit({ role, kind: 'udp', port, bytes: msg.length, from: rinfo.address });
        udp.send(`${role} udp ${port}`, rinfo.port, rinfo.address);
      });
      listening.push(new Promise((resolve) => udp.bind(port, address, () => resolve())));
    }
    if (role === 'evil') listening.push(...dnsServers(cfg.records, 'evil', address));
  }
  listening.push(...dnsServers(cfg.records, 'dns', cfg.dnsAddress));
  await Promise.all(listening);
  process.stdout.write('READY\n');
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
