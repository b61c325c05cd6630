/**
 * The transparent HTTP path (TCP 80 is redirected here): `node:http` parses every request (also each
 * one on a keep-alive connection, T10); the Host must be a name the policy allows, an absolute-form
 * URI must name the same host (T11/E3), and the request is forwarded with `http.request` to an
 * address the gateway resolved itself for that Host (T01), with hop-by-hop headers stripped both
 * ways and the request body framed by the gateway itself (E12). CONNECT, upgrades and unparsable input are refused.
 */
import {
  Agent,
  createServer,
  request as httpRequest,
  type IncomingMessage,
  type Server,
  type ServerResponse,
} from 'node:http';
import type { Socket } from 'node:net';
import { AUDITED_CLOSES, type Decision, type DenyReason } from './audit.ts';
import { decideClaim, identifySource, resolveForDial } from './decide.ts';
import { framedRequestHeaders, requestHeadProblem, safeResponseHead, stripHopByHop } from './http-headers.ts';
import type { Registration, TrackedConnection } from './registry.ts';
import type { ProxyDeps } from './tls-proxy.ts';

export { stripHopByHop };

/** Result of {@link targetOf}: the claimed host and the origin-form path, or why the request is refused. */
export type RequestTarget = { ok: true; host: string; path: string } | { ok: false; reason: DenyReason };

/**
 * Splits a request's Host header and request-target. The Host may carry port 80 only; an
 * absolute-form `http://` target must have no userinfo and name the same host and port as the Host
 * header (compared after normalisation by the caller's policy check: here textually, lower case,
 * trailing dot ignored). `*`, authority-form and other schemes are refused. Pure.
 */
export function targetOf(hostHeader: string | undefined, url: string): RequestTarget {
  if (!hostHeader) return { ok: false, reason: 'missing-host' };
  const hp = splitHostPort(hostHeader);
  if (!hp) return { ok: false, reason: 'invalid-name' };
  if (hp.port !== null && hp.port !== '80') return { ok: false, reason: 'bad-port' };
  if (url.startsWith('/')) return { ok: true, host: hp.host, path: url };
  if (!/^http:\/\//i.test(url)) return { ok: false, reason: 'malformed-http' };
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    return { ok: false, reason: 'malformed-http' };
  }
  // the authority as written, before URL parsing normalises it (userinfo, odd ports)
  const authority = url.slice(7).split(/[/?#]/, 1)[0] ?? '';
  if (authority.includes('@') || parsed.username || parsed.password)
    return { ok: false, reason: 'host-mismatch' };
  const abs = splitHostPort(authority);
  if (!abs || (abs.port !== null && abs.port !== '80')) return { ok: false, reason: 'host-mismatch' };
  const same = (a: string) => a.toLowerCase().replace(/\.$/, '');
  if (same(abs.host) !== same(hp.host)) return { ok: false, reason: 'host-mismatch' };
  return { ok: true, host: hp.host, path: `${parsed.pathname}${parsed.search}` };
}

/** `host[:port]` / `[v6][:port]` → parts; null when malformed. Pure. */
function splitHostPort(value: string): { host: string; port: string | null } | null {
  const m = /^(\[[^\]]*\]|[^:[\]]+)(?::(\d{1,5}))?$/.exec(value.trim());
  if (!m) return null;
  return { host: m[1]!, port: m[2] ?? null };
}

interface SocketState {
  reg: Registration;
  conn: TrackedConnection;
  decision: Decision;
  account(bytes: number): void;
}

/** Builds the HTTP proxy server (not listening). `close()` on it also drops idle upstream sockets. */
export function createHttpProxy(deps: ProxyDeps): Server {
  const { registry, audit, limits } = deps;
  const agent = new Agent({
    keepAlive: true,
    maxSockets: 1024,
    maxFreeSockets: 64,
    timeout: limits.idleTimeoutMs,
  });
  const states = new WeakMap<Socket, SocketState>();
  const server = createServer({
    maxHeaderSize: limits.maxHeaderBytes,
    headersTimeout: limits.handshakeTimeoutMs,
    requestTimeout: 0,
    keepAliveTimeout: 5000,
    connectionsCheckingInterval: Math.min(1000, limits.handshakeTimeoutMs),
    insecureHTTPParser: false,
    requireHostHeader: false, // refused by us, with an audit line
  });
  server.setTimeout(limits.idleTimeoutMs, (socket) => states.get(socket)?.conn.close('idle-timeout'));
  server.on('close', () => agent.destroy());

  server.on('connection', (socket: Socket) => {
    socket.on('error', () => {});
    const caller = identifySource(deps, socket, 'http');
    if (!caller) return;
    const { reg, decision } = caller;
    let closed = false;
    const conn: TrackedConnection = {
      protocol: 'http',
      name: null,
      intercepted: false,
      close(reason) {
        if (closed) return;
        closed = true;
        if (AUDITED_CLOSES.has(reason)) {
          audit.closed({ ...decision, name: conn.name, reason });
        }
        socket.destroy();
      },
    };
    const admitted = registry.admit(reg, conn);
    if (admitted !== true) {
      audit.deny({ ...decision, reason: admitted });
      socket.destroy();
      return;
    }
    audit.metrics.connections.inc({ protocol: 'http' });
    // the first request head must arrive within the handshake deadline (headersTimeout covers later ones)
    const firstRequest = setTimeout(() => {
      audit.deny({ ...decision, reason: 'handshake-timeout' });
      conn.close('handshake-timeout');
    }, limits.handshakeTimeoutMs);
    // bytes both ways (request bytes as read, response bodies as forwarded) against the cap
    let bytes = 0;
    const account = (n: number) => {
      bytes += n;
      if (bytes > limits.maxConnectionBytes) conn.close('byte-limit');
    };
    states.set(socket, { reg, conn, decision, account });
    socket.once('data', () => clearTimeout(firstRequest));
    socket.once('close', () => {
      closed = true;
      clearTimeout(firstRequest);
      registry.release(reg, conn);
      audit.metrics.connections.dec({ protocol: 'http' });
    });
    socket.on('data', (chunk: Buffer) => account(chunk.length));
  });

  server.on('clientError', (err: NodeJS.ErrnoException, socket: Socket) => {
    const state = states.get(socket);
    const timeout = err.code === 'ERR_HTTP_REQUEST_TIMEOUT' || err.code === 'ERR_HTTP_HEADERS_TIMEOUT';
    if (state) audit.deny({ ...state.decision, reason: timeout ? 'handshake-timeout' : 'malformed-http' });
    if (socket.writable && !timeout) {
      const status =
        err.code === 'HPE_HEADER_OVERFLOW' ? '431 Request Header Fields Too Large' : '400 Bad Request';
      socket.end(`HTTP/1.1 ${status}\r\nConnection: close\r\nContent-Length: 0\r\n\r\n`);
    }
    socket.destroy();
  });
  server.on('connect', (_req: IncomingMessage, socket: Socket) => {
    const state = states.get(socket);
    if (state) audit.deny({ ...state.decision, reason: 'method-not-allowed' });
    socket.end('HTTP/1.1 405 Method Not Allowed\r\nConnection: close\r\nContent-Length: 0\r\n\r\n');
    socket.destroy();
  });
  server.on('upgrade', (_req: IncomingMessage, socket: Socket) => {
    const state = states.get(socket);
    if (state) audit.deny({ ...state.decision, reason: 'upgrade-unsupported' });
    socket.end('HTTP/1.1 403 Forbidden\r\nConnection: close\r\nContent-Length: 0\r\n\r\n');
    socket.destroy();
  });

  server.on('request', (req: IncomingMessage, res: ServerResponse) => {
    const state = states.get(req.socket);
    if (!state) {
      req.socket.destroy();
      return;
    }
    void forward(state, req, res);
  });

  function refuse(
    state: SocketState,
    res: ServerResponse,
    d: Decision,
    reason: DenyReason,
    status = 403,
  ): void {
    audit.deny({ ...d, reason });
    if (res.headersSent) {
      res.destroy();
      return;
    }
    res.shouldKeepAlive = false;
    res.writeHead(status, { 'content-type': 'text/plain; charset=utf-8', connection: 'close' });
    res.end(`egress denied: ${reason}\n`);
    state.conn.name = null;
  }

  async function forward(state: SocketState, req: IncomingMessage, res: ServerResponse): Promise<void> {
    // the registration object is replaced in place; a deleted one has closed this socket already
    const { reg } = state;
    const d: Decision = { ...state.decision };
    // two Host headers (E6) or ambiguous framing: refused before anything is decided on either
    const problem = requestHeadProblem(req.rawHeaders);
    if (problem) return refuse(state, res, d, problem, 400);
    const t = targetOf(req.headers.host, req.url ?? '');
    if (!t.ok) return refuse(state, res, d, t.reason);
    const claim = decideClaim(reg.policy, t.host);
    d.name = claim.name;
    d.rule = claim.rule;
    if (!claim.allowed) return refuse(state, res, d, claim.reason);
    state.conn.name = claim.name;
    const target = await resolveForDial(deps.resolver, reg.policy, claim.name);
    d.address = target.address;
    if (!target.ok)
      return refuse(state, res, d, target.reason, target.reason === 'resolution-failed' ? 502 : 403);
    if (req.socket.destroyed) return;
    audit.allow(d);
    const up = httpRequest({
      host: target.address,
      port: deps.upstreamPort,
      method: req.method,
      path: t.path,
      // framed by the gateway (E12): a body always travels with its length or chunked
      headers: framedRequestHeaders(req.rawHeaders),
      setHost: false,
      agent,
      timeout: limits.dialTimeoutMs,
    });
    up.on('timeout', () => up.destroy(new Error('upstream timeout')));
    up.on('error', () => {
      if (!res.headersSent) {
        res.shouldKeepAlive = false;
        res.writeHead(502, { 'content-type': 'text/plain; charset=utf-8', connection: 'close' });
        res.end('upstream unreachable\n');
      } else res.destroy();
    });
    up.on('response', (upRes) => {
      up.setTimeout(0);
      upRes.on('error', () => res.destroy());
      // a head writeHead would throw on (E11: `200 O\x01K`) ends this exchange, never the process
      const head = safeResponseHead(upRes.statusCode, upRes.statusMessage, stripHopByHop(upRes.rawHeaders));
      if (!head) {
        upRes.destroy();
        up.destroy();
        return refuse(state, res, d, 'malformed-response', 502);
      }
      upRes.on('data', (chunk: Buffer) => state.account(chunk.length));
      res.writeHead(upRes.statusCode!, head.statusMessage, head.headers);
      upRes.pipe(res);
    });
    res.on('close', () => {
      if (!res.writableFinished) up.destroy();
    });
    req.pipe(up);
  }

  return server;
}
