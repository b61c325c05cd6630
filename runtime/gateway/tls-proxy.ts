/**
 * The transparent TLS path (TCP 443 is redirected here): read the ClientHello under a deadline and a
 * size cap, decide on its SNI, then either splice to an address the gateway resolved itself (the
 * hello is replayed, nothing is decrypted) or hand the connection to the credential interceptor.
 * No SNI, an IP literal, a malformed hello, a non-TLS first byte or a name the policy refuses →
 * the connection is closed and audited `deny`.
 */
import { connect, createServer, type Server, type Socket } from 'node:net';
import { Transform } from 'node:stream';
import type { Logger } from 'pino';
import { AUDITED_CLOSES, type Audit, type DenyReason } from './audit.ts';
import type { DeploymentCa } from './ca.ts';
import { parseClientHello } from './client-hello.ts';
import type { CredentialSource } from './credential-source.ts';
import { grantsCovering } from './credentials.ts';
import { decideClaim, identifySource, resolveForDial } from './decide.ts';
import { interceptTls } from './intercept.ts';
import { type ConnectionLimits, guardSockets } from './limits.ts';
import { decideName } from './policy.ts';
import type { Registry, TrackedConnection } from './registry.ts';
import type { UpstreamResolver } from './resolver.ts';
import { HandshakeWatch, type WatchProblem } from './splice-watch.ts';
import type { UnpackPool } from './unpack-pool.ts';

/** What the TLS and HTTP proxies need. */
export interface ProxyDeps {
  registry: Registry;
  resolver: UpstreamResolver;
  audit: Audit;
  log: Logger;
  limits: ConnectionLimits;
  /** Port dialled upstream (443 for TLS, 80 for HTTP unless configured). */
  upstreamPort: number;
}

/** What the TLS proxy needs on top of {@link ProxyDeps} to intercept credential hosts. */
export interface TlsProxyDeps extends ProxyDeps {
  /** Absent: credential hosts are refused (`credential-interception-unavailable`), never spliced. */
  intercept?: {
    ca: DeploymentCa;
    upstreamCa: Buffer[];
    credentials: CredentialSource;
    /** Where gzip response bodies are unpacked and masked (worker threads, E17). */
    unpack: UnpackPool;
  };
}

/** Error thrown by the intercept context's `resolve` when a name may not be dialled. */
export class EgressDenied extends Error {
  readonly reason: DenyReason;
  constructor(reason: DenyReason, message: string) {
    super(message);
    this.name = 'EgressDenied';
    this.reason = reason;
  }
}

/** Builds the TLS proxy server (not listening). */
export function createTlsProxy(deps: TlsProxyDeps): Server {
  // half-open aware: a client that finishes sending (FIN) still gets the whole response
  return createServer({ allowHalfOpen: true, noDelay: true }, (client) => handle(deps, client));
}

function handle(deps: TlsProxyDeps, client: Socket): void {
  const { registry, audit, limits } = deps;
  client.on('error', () => {});
  const caller = identifySource(deps, client, 'tls');
  if (!caller) return;
  const { reg, decision } = caller;
  let upstream: Socket | null = null;
  let closed = false;
  const conn: TrackedConnection = {
    protocol: 'tls',
    name: null,
    intercepted: false,
    close(reason) {
      if (closed) return;
      closed = true;
      if (AUDITED_CLOSES.has(reason)) {
        audit.closed({ ...decision, reason });
      }
      client.destroy();
      upstream?.destroy();
    },
  };
  const admitted = registry.admit(reg, conn);
  if (admitted !== true) {
    audit.deny({ ...decision, reason: admitted });
    client.destroy();
    return;
  }
  // a handshake slot until the hello is read and decided: one sandbox trickling or flooding hellos
  // holds at most `maxHandshakes` of them, its own
  if (!registry.beginHandshake(reg)) {
    registry.release(reg, conn);
    audit.deny({ ...decision, reason: 'handshake-limit' });
    client.destroy();
    return;
  }
  let handshaking = true;
  const handshakeDone = () => {
    if (!handshaking) return;
    handshaking = false;
    registry.endHandshake(reg);
  };
  audit.metrics.connections.inc({ protocol: 'tls' });
  client.once('close', () => {
    closed = true;
    handshakeDone();
    registry.release(reg, conn);
    audit.metrics.connections.dec({ protocol: 'tls' });
    upstream?.destroy();
  });
  const deny = (reason: DenyReason) => {
    if (closed) return;
    audit.deny({ ...decision, reason });
    closed = true;
    client.destroy();
  };

  // read the hello: chunks are only concatenated once the parser's `need` is reached, so a
  // byte-by-byte trickle costs O(n), and the deadline bounds how long the slot is held
  const deadline = setTimeout(() => deny('handshake-timeout'), limits.handshakeTimeoutMs);
  const chunks: Buffer[] = [];
  let size = 0;
  let need = 1;
  const onData = (chunk: Buffer) => {
    chunks.push(chunk);
    size += chunk.length;
    if (size < need) return;
    const buf = chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks);
    chunks.length = 0;
    chunks.push(buf);
    const r = parseClientHello(buf, limits.maxHelloBytes);
    if (r.status === 'incomplete') {
      need = r.need;
      return;
    }
    clearTimeout(deadline);
    handshakeDone();
    client.off('data', onData);
    client.pause();
    if (r.status === 'error') return deny(r.reason);
    if (r.sni === null) return deny('no-sni');
    void proceed(buf, r.sni, r.length);
  };
  client.on('data', onData);
  client.once('end', () => {
    if (!conn.name) deny('malformed-hello'); // FIN before a whole hello
  });
  client.once('close', () => clearTimeout(deadline));

  async function proceed(hello: Buffer, sni: string, helloLength: number): Promise<void> {
    const claim = decideClaim(reg!.policy, sni);
    decision.name = claim.name;
    decision.rule = claim.rule;
    if (!claim.allowed) return deny(claim.reason);
    conn.name = claim.name;
    const grants = grantsCovering(claim.name, reg!.credentials);
    if (grants.length > 0) {
      conn.intercepted = true;
      if (!deps.intercept) return deny('credential-interception-unavailable');
      const { unpack } = deps.intercept;
      // the interceptor audits each request itself (`egress allow|deny|close`, rule `credential`)
      void interceptTls(client, hello, {
        sandboxId: reg!.sandboxId,
        sni: claim.name,
        grants: reg!.credentials, // all of them: a foreign or misplaced placeholder must be recognised
        log: deps.log.child({ component: 'intercept', source: decision.source }),
        limits: {
          handshakeTimeoutMs: limits.handshakeTimeoutMs,
          idleTimeoutMs: limits.idleTimeoutMs,
          maxHeaderBytes: limits.maxHeaderBytes,
          maxBodyBytes: limits.maxBodyBytes,
        },
        upstreamPort: deps.upstreamPort,
        upstreamCa: deps.intercept.upstreamCa,
        ca: deps.intercept.ca,
        credentials: deps.intercept.credentials,
        unpack: (body, needles) => unpack.mask(reg!.sandboxId, body, needles),
        resolve: async (name) => {
          const d = decideName(reg!.policy, name);
          if (!d.allowed) throw new EgressDenied(d.reason, `${name} is not allowed`);
          const t = await resolveForDial(deps.resolver, reg!.policy, name);
          if (!t.ok) throw new EgressDenied(t.reason, `${name} cannot be dialled`);
          return t.address;
        },
      });
      return;
    }
    const target = await resolveForDial(deps.resolver, reg!.policy, claim.name);
    if (closed) return;
    decision.address = target.address;
    if (!target.ok) return deny(target.reason);
    dial(hello, helloLength, claim.name, target.address);
  }

  /**
   * Dials `address`, replays what the client sent (`hello`: its first ClientHello, `helloLength`
   * bytes, and anything after it) and splices, with every clear-text handshake message checked
   * both ways until the server's real ServerHello (E13, `splice-watch.ts`).
   */
  function dial(hello: Buffer, helloLength: number, name: string, address: string): void {
    const watch = new HandshakeWatch(name, limits.maxHelloBytes);
    const cut = (reason: WatchProblem) => conn.close(reason);
    const early = watch.fromClient(hello.subarray(helloLength));
    if (early) {
      deny(early);
      return;
    }
    // a pass-through that checks each chunk before it is forwarded, until the watch is done
    const checked = (check: (chunk: Buffer) => WatchProblem | null) =>
      new Transform({
        transform(chunk: Buffer, _enc, cb) {
          if (!watch.done) {
            const problem = check(chunk);
            if (problem) {
              cut(problem);
              cb();
              return;
            }
          }
          cb(null, chunk);
        },
      });
    const up = connect({ host: address, port: deps.upstreamPort, noDelay: true, allowHalfOpen: true });
    upstream = up;
    up.on('error', () => {
      if (!connected) deny('upstream-unreachable');
      else conn.close('upstream-unreachable');
    });
    let connected = false;
    const dialTimer = setTimeout(() => {
      if (!connected) deny('upstream-unreachable');
    }, limits.dialTimeoutMs);
    up.once('connect', () => {
      connected = true;
      clearTimeout(dialTimer);
      if (closed) return up.destroy();
      audit.allow(decision);
      const guard = guardSockets(limits, (reason) => conn.close(reason));
      guard.add(client);
      guard.add(up);
      up.write(hello);
      client.pipe(checked((c) => watch.fromClient(c))).pipe(up);
      up.pipe(checked((c) => watch.fromServer(c))).pipe(client);
      up.once('close', (hadError) => {
        if (hadError) client.destroy();
      });
    });
    up.once('close', () => clearTimeout(dialTimer));
  }
}
