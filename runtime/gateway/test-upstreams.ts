/**
 * Test-only upstreams for `gateway.int.test.ts`, run inside a test network namespace:
 * `ip netns exec gwt-… node runtime/gateway/test-upstreams.ts '<json config>'`.
 * Per role (good, evil, deny…) an HTTP server on :80 and an HTTPS server on :443 at the role's
 * address, plus an authoritative DNS server (UDP :53). Every TCP connection, request and DNS
 * query is printed as one JSON line on stdout (the far-side hit log); `READY` once listening.
 */
import { createSocket } from 'node:dgram';
import { readFileSync } from 'node:fs';
import { createServer as createHttp, type IncomingMessage, type ServerResponse } from 'node:http';
import { createServer as createHttps } from 'node:https';
import type { TLSSocket } from 'node:tls';
import dnsPacket from 'dns-packet';

/** Config passed as argv[2]. */
export interface UpstreamsConfig {
  /** role → address the role's servers bind. */
  roles: Record<string, string>;
  dnsAddress: string;
  certFile: string;
  keyFile: string;
  /** A records the DNS server answers (name → IPv4). */
  records: Record<string, string>;
}

function hit(entry: Record<string, unknown>): void {
  process.stdout.write(`${JSON.stringify(entry)}\n`);
}

async function main(): Promise<void> {
  const cfg = JSON.parse(process.argv[2] ?? '{}') as UpstreamsConfig;
  const cert = readFileSync(cfg.certFile);
  const key = readFileSync(cfg.keyFile);
  const listening: Promise<void>[] = [];
  for (const [role, address] of Object.entries(cfg.roles)) {
    const answer = (kind: string) => (req: IncomingMessage, res: ServerResponse) => {
      const sni = (req.socket as TLSSocket).servername ?? null;
      hit({
        role,
        kind,
        host: req.headers.host ?? null,
        sni,
        url: req.url,
        method: req.method,
        auth: req.headers.authorization ?? null,
      });
      req.resume();
      req.on('end', () => res.end(`${role} ${kind} ${req.headers.host ?? ''} ${req.url}`));
    };
    const http = createHttp(answer('http'));
    const https = createHttps({ cert, key }, answer('https'));
    http.on('connection', () => hit({ role, kind: 'tcp80' }));
    https.on('connection', () => hit({ role, kind: 'tcp443' }));
    https.on('tlsClientError', () => {});
    for (const [server, port] of [
      [http, 80],
      [https, 443],
    ] as const) {
      listening.push(new Promise((resolve) => server.listen(port, address, () => resolve())));
    }
  }
  const dns = createSocket('udp4');
  dns.on('message', (msg, rinfo) => {
    let q: dnsPacket.DecodedPacket;
    try {
      q = dnsPacket.decode(msg);
    } catch {
      hit({ role: 'dns', kind: 'malformed' });
      return;
    }
    const question = q.questions?.[0];
    if (!question) return;
    const name = question.name.toLowerCase();
    hit({ role: 'dns', kind: 'query', name, type: question.type });
    const address = cfg.records[name];
    const answers: dnsPacket.Answer[] =
      address && question.type === 'A' ? [{ type: 'A', name: question.name, ttl: 60, data: address }] : [];
    const rcode = address ? 0 : 3; // NXDOMAIN for unknown names
    dns.send(
      dnsPacket.encode({
        type: 'response',
        id: q.id,
        flags: dnsPacket.AUTHORITATIVE_ANSWER | rcode,
        questions: [question],
        answers,
      }),
      rinfo.port,
      rinfo.address,
    );
  });
  listening.push(new Promise((resolve) => dns.bind(53, cfg.dnsAddress, () => resolve())));
  await Promise.all(listening);
  process.stdout.write('READY\n');
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
