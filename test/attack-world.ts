/**
 * The far side of the attack suite (`attacks.int.test.ts`), run inside an `atk-…` network namespace:
 * `ip netns exec atk-… node test/attack-world.ts '<json config>'`.
 *
 * Per role (good, evil, internal, meta) a set of listeners on the role's address: HTTP :80, HTTPS
 * :443 and :8443, plain TCP catch-alls (22, 853, 7000, 8080) and UDP catch-alls (53 except on the
 * DNS role, 123, 443, 9999). The `cred` role is the credential upstream: HTTPS that checks
 * `Authorization: Bearer <real value>` (and `/echo` reflects the headers it received). The `dns`
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
