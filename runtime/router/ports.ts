/**
 * Servers in sandboxes, through the router: a request for `<port>-<sandboxId>.<domain>` (or, on the
 * router's own address, with `E2b-Sandbox-Id` + `E2b-Sandbox-Port`; core/ports.ts) reaches that
 * port inside the sandbox. Port 49983 stays envd's (envd/service.ts).
 *
 * Path: the router finds the sandbox's agent as for every data-plane request (`SandboxLocator`:
 * a paused sandbox is resumed by the request, its resume metered as any traffic resume), opens a
 * tunnel to it (an HTTP/1.1 upgrade, agent/routes/ports.ts, authorised by the sandbox's port token
 * from its record) and sends the client's request through the tunnel with Node's HTTP client; the
 * answer is streamed back with `pipeline`. Nothing is buffered: a client (or server) that stops
 * reading stops the other side's reads, hop by hop, through the tunnel's TCP windows. One tunnel
 * per request (`Connection: close` inside it). A WebSocket (any HTTP/1.1 upgrade) is the same
 * request with its upgrade headers: on `101` the two sockets are spliced. Clients may speak
 * HTTP/2 when the router has TLS (ALPN); the hop to the sandbox is HTTP/1.1 (what its server
 * speaks); WebSockets need HTTP/1.1 from the client (no RFC 8441 extended CONNECT).
 *
 * Access as E2B's edge gates it (docs/e2b.md; https://github.com/e2b-dev/infra, its proxy):
 * public unless the sandbox was created private (E2B `network.allowPublicTraffic: false`, SPACE
 * `ports.public: false`); then every request needs
 * `e2b-traffic-access-token: <its token>` and is refused with 403 before anything else happens
 * (no resume). The edge's answers, status and JSON body, are E2B's: {@link edgeAnswer}.
 */
import { timingSafeEqual } from 'node:crypto';
import { type ClientRequest, type IncomingHttpHeaders, type IncomingMessage, request } from 'node:http';
import { request as httpsRequest } from 'node:https';
import type { Socket } from 'node:net';
import type { Duplex, Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import type { FastifyInstance } from 'fastify';
import type { Logger } from 'pino';
import { errorFromBody, SpaceError } from '../core/errors.ts';
import { ID_PATTERN } from '../core/ids.ts';
import {
  ENVD_PORT,
  PORT_TUNNEL_PROTOCOL,
  type PortTarget,
  portTargetOf,
  portTunnelPath,
  TRAFFIC_TOKEN_HEADER,
} from '../core/ports.ts';
import { keys } from '../core/redis-keys.ts';
import { DEFAULT_TEAM } from '../core/tenancy.ts';
import type { RouterDeps } from './app.ts';
import { downstreamHeaders, upstreamHeaders } from './headers.ts';
import { requestHasBody } from './proxy.ts';

/** Where {@link portRewrite} sends a port request among the router's routes. */
export const PORT_ROUTE_PREFIX = '/_port';

const SANDBOX_ID = new RegExp(ID_PATTERN);

/** What E2B's edge answers for a request it does not pass on (its proxy's error pages, https://github.com/e2b-dev/infra; docs/e2b.md). */
export type EdgeRefusal =
  | 'not-found'
  | 'port-closed'
  | 'token-missing'
  | 'token-invalid'
  | 'transitioning'
  | 'invalid-id'
  | 'invalid-port';

/** An edge refusal on its way to the client. */
export class EdgeError extends Error {
  readonly kind: EdgeRefusal;
  readonly sandboxId: string;
  readonly port: number | undefined;
  constructor(kind: EdgeRefusal, sandboxId: string, port?: number) {
    super(kind);
    this.kind = kind;
    this.sandboxId = sandboxId;
    this.port = port;
  }
}

/**
 * Status, content type and body E2B's edge answers for `kind` (its JSON bodies; the malformed
 * host cases are plain text). Pure.
 */
export function edgeAnswer(
  kind: EdgeRefusal,
  sandboxId: string,
  port?: number,
): { status: number; type: string; body: string } {
  const json = (status: number, o: Record<string, unknown>) => ({
    status,
    type: 'application/json; charset=utf-8',
    body: JSON.stringify({ sandboxId, ...o, code: status }),
  });
  const text = (body: string) => ({ status: 400, type: 'text/plain; charset=utf-8', body });
  switch (kind) {
    case 'not-found':
      return json(502, { message: 'The sandbox was not found' });
    case 'port-closed':
      return json(502, { message: 'The sandbox is running but port is not open', port });
    case 'token-missing':
      return json(403, {
        message: `Sandbox is secured with traffic access token. Token header '${TRAFFIC_TOKEN_HEADER}' is missing`,
      });
    case 'token-invalid':
      return json(403, {
        message: `Sandbox is secured with traffic access token. Provided token in header '${TRAFFIC_TOKEN_HEADER}' is invalid`,
      });
    case 'transitioning':
      return json(409, { message: 'The sandbox is still transitioning. Try again in a moment.' });
    case 'invalid-id':
      return text('Invalid sandbox ID');
    case 'invalid-port':
      return text('Invalid sandbox port');
  }
}

/** A port request's target, when it is one the tunnel serves (not envd's port). */
function tunnelTarget(headers: IncomingHttpHeaders): PortTarget | undefined {
  const t = portTargetOf(headers);
  if (!t || ('port' in t && t.port === ENVD_PORT)) return undefined;
  return t;
}

/**
 * Fastify's `rewriteUrl`: a port request (not envd's) goes to `/_port/<id>/<port><url>`, where
 * {@link installPorts}'s route takes it whatever its path (a malformed one to port 0). Pure.
 */
export function portRewrite(req: { url?: string; headers: IncomingHttpHeaders }): string {
  const url = req.url ?? '/';
  const t = tunnelTarget(req.headers);
  if (!t) return url;
  const id = encodeURIComponent(t.sandboxId ?? '_');
  return `${PORT_ROUTE_PREFIX}/${id}/${'port' in t ? t.port : 0}${url.startsWith('/') ? url : `/${url}`}`;
}

/** True when `given` is the traffic token `expected` (constant time). */
function sameToken(given: string, expected: string): boolean {
  const a = Buffer.from(given);
  const b = Buffer.from(expected);
  return a.length === b.length && timingSafeEqual(a, b);
}

/**
 * Checks access to `port` of `sandboxId` and opens a tunnel to it through its agent, resuming a
 * paused sandbox first. Resolves to the tunnel's socket.
 * @throws EdgeError for E2B's refusals; SpaceError NODE_UNAVAILABLE (its node is down) and the
 *   agent's other refusals.
 */
export async function openTunnel(
  deps: RouterDeps,
  sandboxId: string,
  port: number,
  headers: IncomingHttpHeaders,
): Promise<Socket> {
  if (!SANDBOX_ID.test(sandboxId)) throw new EdgeError('invalid-id', sandboxId);
  if (port < 1 || port > 65_535) throw new EdgeError('invalid-port', sandboxId);
  const [state, team, portToken, trafficToken] = await deps.redis.hmget(
    keys.sandbox(sandboxId),
    'state',
    'team',
    'portToken',
    'trafficToken',
  );
  // unknown, ended, or made before port tunnels existed (no port token): not found, as E2B says
  if (!state || state === 'killing' || state === 'killed' || !portToken) {
    throw new EdgeError('not-found', sandboxId);
  }
  // private: refused before anything happens to it (no resume)
  if (trafficToken) {
    const given = headers[TRAFFIC_TOKEN_HEADER];
    if (typeof given !== 'string' || !given) throw new EdgeError('token-missing', sandboxId);
    if (!sameToken(given, trafficToken)) throw new EdgeError('token-invalid', sandboxId);
  }
  let afterPaused = false;
  for (let attempt = 0; attempt < 2; attempt++) {
    let url: string;
    try {
      ({ url } = await deps.proxy.locator.locate(sandboxId, { team: team || DEFAULT_TEAM, afterPaused }));
    } catch (err) {
      throw edgeOf(err, sandboxId);
    }
    const opened = await tunnelTo(deps, url, sandboxId, port, portToken);
    if ('socket' in opened) return opened.socket;
    let body: unknown;
    try {
      body = JSON.parse(opened.text);
    } catch {}
    const err = errorFromBody(opened.status, body, 'NODE_UNAVAILABLE');
    // paused between the lookup and the agent: resume and ask again (nothing was sent yet)
    if (err.code === 'SANDBOX_PAUSED' && attempt === 0) {
      afterPaused = true;
      continue;
    }
    if (err.code === 'PORT_CLOSED') throw new EdgeError('port-closed', sandboxId, port);
    throw edgeOf(err, sandboxId);
  }
  throw new EdgeError('transitioning', sandboxId);
}

/** E2B's refusal for a SPACE error while finding or resuming a sandbox (others are rethrown). */
function edgeOf(err: unknown, sandboxId: string): unknown {
  if (!(err instanceof SpaceError)) return err;
  if (
    err.code === 'SANDBOX_NOT_FOUND' ||
    err.code === 'SANDBOX_NOT_RUNNING' ||
    err.code === 'SANDBOX_CRASHED'
  ) {
    return new EdgeError('not-found', sandboxId);
  }
  if (err.code === 'SANDBOX_PAUSED') {
    // paused and created with autoResume off: E2B's edge answers as for a sandbox it cannot find
    if (err.details?.autoResume === false) return new EdgeError('not-found', sandboxId);
    return new EdgeError('transitioning', sandboxId);
  }
  return err;
}

/** One tunnel request to an agent: its socket on `101`, else its answer's status and (small) body. */
function tunnelTo(
  deps: RouterDeps,
  agentUrl: string,
  sandboxId: string,
  port: number,
  portToken: string,
): Promise<{ socket: Socket } | { status: number; text: string }> {
  const url = new URL(portTunnelPath(sandboxId, port), agentUrl);
  const send = url.protocol === 'https:' ? httpsRequest : request;
  return new Promise((resolve, reject) => {
    const req = send(url, {
      method: 'GET',
      headers: {
        connection: 'Upgrade',
        upgrade: PORT_TUNNEL_PROTOCOL,
        authorization: `Bearer ${portToken}`,
      },
      timeout: deps.config.connectTimeoutMs + deps.config.headersTimeoutMs,
    });
    const fail = (err: unknown) =>
      reject(
        new SpaceError(
          'NODE_UNAVAILABLE',
          `the agent of sandbox ${sandboxId} is not reachable`,
          { sandboxId },
          {
            cause: err,
          },
        ),
      );
    req.once('timeout', () => req.destroy(new Error('no answer in time')));
    req.once('error', fail);
    req.once('upgrade', (_res: IncomingMessage, socket: Socket, head: Buffer) => {
      req.off('error', fail);
      socket.setTimeout(0);
      if (head.length) socket.unshift(head);
      resolve({ socket });
    });
    req.once('response', (res: IncomingMessage) => {
      const parts: Buffer[] = [];
      res.on('data', (c: Buffer) => parts.push(c));
      res.once('end', () =>
        resolve({ status: res.statusCode ?? 502, text: Buffer.concat(parts).toString('utf8') }),
      );
      res.once('error', fail);
    });
    req.end();
  });
}

/** The headers the sandbox's server gets: the client's end-to-end ones, its Host kept, the traffic token dropped. */
function serverHeaders(
  client: IncomingHttpHeaders,
  remoteAddress: string | undefined,
  proto: 'http' | 'https',
): Record<string, string | string[]> {
  const out = upstreamHeaders(client, { remoteAddress, proto });
  delete out[TRAFFIC_TOKEN_HEADER];
  delete out['e2b-sandbox-id'];
  delete out['e2b-sandbox-port'];
  const host = client.host ?? (client[':authority'] as string | undefined);
  if (host) out['host'] = host;
  return out;
}

/** Sends one request over `tunnel` (Connection: close); resolves to the request, events wired by the caller. */
function overTunnel(
  tunnel: Socket,
  method: string,
  path: string,
  headers: Record<string, string | string[]>,
): ClientRequest {
  return request({ createConnection: () => tunnel, method, path, headers, setHost: false });
}

/** Raw `HTTP/1.1` response head for a socket. */
function rawHead(status: number, message: string, rawHeaders: readonly string[]): string {
  let head = `HTTP/1.1 ${status} ${message}\r\n`;
  for (let i = 0; i + 1 < rawHeaders.length; i += 2) head += `${rawHeaders[i]}: ${rawHeaders[i + 1]}\r\n`;
  return `${head}\r\n`;
}

/** Writes an edge refusal (or a SPACE error) on a raw socket and ends it. */
function refuseRaw(socket: Duplex, err: unknown): void {
  const a =
    err instanceof EdgeError
      ? edgeAnswer(err.kind, err.sandboxId, err.port)
      : err instanceof SpaceError
        ? { status: err.status, type: 'application/json; charset=utf-8', body: JSON.stringify(err.toBody()) }
        : { status: 502, type: 'text/plain', body: 'Bad Gateway' };
  socket.end(
    rawHead(a.status, a.status === 502 ? 'Bad Gateway' : 'Refused', [
      'Content-Type',
      a.type,
      'Content-Length',
      String(Buffer.byteLength(a.body)),
      'Connection',
      'close',
    ]) + a.body,
  );
}

/** Splices two sockets (pipe keeps backpressure; an error on one destroys the other). */
function splice(a: Duplex, b: Duplex): void {
  a.on('error', () => b.destroy());
  b.on('error', () => a.destroy());
  a.once('close', () => b.destroy());
  b.once('close', () => a.destroy());
  a.pipe(b);
  b.pipe(a);
}

/**
 * Serves port requests on the router `app` (before it listens): the catch-all route
 * `/_port/:id/:port/*` the {@link portRewrite} sends them to (HTTP/1.1 and HTTP/2), and HTTP/1.1
 * upgrades (WebSocket) on its server. Pass {@link portRewrite} as the app's `rewriteUrl`.
 */
export function installPorts(app: FastifyInstance, deps: RouterDeps): void {
  app.route<{ Params: { id: string; port: string } }>({
    method: ['GET', 'HEAD', 'POST', 'PUT', 'DELETE', 'PATCH', 'OPTIONS'],
    url: `${PORT_ROUTE_PREFIX}/:id/:port/*`,
    handler: async (req, reply) => {
      // only what portRewrite sent here: the path itself is nothing on the router's own address
      if (req.originalUrl === req.url) {
        throw new SpaceError('NOT_FOUND', `no route ${req.method} ${req.url.split('?')[0]}`);
      }
      const sandboxId = decodeURIComponent(req.params.id);
      const port = Number(req.params.port);
      let tunnel: Socket;
      try {
        tunnel = await openTunnel(deps, sandboxId, port, req.headers);
      } catch (err) {
        if (!(err instanceof EdgeError)) throw err;
        const a = edgeAnswer(err.kind, err.sandboxId, err.port);
        deps.metrics.requests.inc({ route: 'port', status: String(a.status) });
        return reply.status(a.status).type(a.type).send(a.body);
      }
      reply.hijack();
      const out = reply.raw;
      const headers = serverHeaders(req.headers, req.socket.remoteAddress, deps.proxy.proto);
      headers['connection'] = 'close';
      const up = overTunnel(tunnel, req.method, req.originalUrl, headers);
      const done = new Promise<void>((resolve) => {
        up.once('response', (res: IncomingMessage) => {
          out.writeHead(res.statusCode ?? 502, res.statusMessage, downstreamHeaders(res.headers));
          // SSE: the client sees the headers now, not with the first event
          (out as { flushHeaders?: () => void }).flushHeaders?.();
          pipeline(res, out).then(resolve, (err: unknown) => {
            req.log.debug({ err }, 'port response ended early');
            tunnel.destroy();
            resolve();
          });
        });
        up.once('error', (err) => {
          req.log.debug({ err }, 'port request failed');
          if (!out.headersSent) {
            const a = edgeAnswer('port-closed', sandboxId, port);
            out.writeHead(a.status, { 'content-type': a.type });
            out.end(a.body);
          } else out.destroy();
          resolve();
        });
      });
      // the client left: the tunnel (and the server's connection) goes too
      out.once('close', () => {
        if (!out.writableFinished) tunnel.destroy();
      });
      if (requestHasBody(req.headers, req.raw)) {
        pipeline(req.raw as unknown as Readable, up).catch(() => tunnel.destroy());
      } else up.end();
      deps.metrics.activeStreams.inc({ route: 'port' });
      try {
        await done;
      } finally {
        deps.metrics.activeStreams.dec({ route: 'port' });
      }
      deps.metrics.requests.inc({ route: 'port', status: String(out.statusCode) });
      return reply;
    },
  });

  // WebSocket and any other HTTP/1.1 upgrade to a port (the router's own upgrades stay requests)
  const server = app.server as typeof app.server & {
    shouldUpgradeCallback?: (req: IncomingMessage) => boolean;
  };
  server.shouldUpgradeCallback = (req) =>
    req.headers.upgrade !== undefined && tunnelTarget(req.headers) !== undefined;
  // spliced sockets are no longer the HTTP server's: closing the app ends them here
  const live = new Set<Duplex>();
  app.addHook('preClose', async () => {
    for (const s of live) s.destroy();
  });
  server.on('upgrade', (req: IncomingMessage, socket: Duplex, head: Buffer) => {
    live.add(socket);
    socket.once('close', () => live.delete(socket));
    socket.once('error', () => socket.destroy());
    void upgrade(deps, req, socket, head, deps.log).catch((err: unknown) => refuseRaw(socket, err));
  });
}

/** One upgrade request for a port: tunnel, the request through it, `101` → spliced. */
async function upgrade(
  deps: RouterDeps,
  req: IncomingMessage,
  socket: Duplex,
  head: Buffer,
  log: Logger,
): Promise<void> {
  const t = tunnelTarget(req.headers);
  if (!t) throw new SpaceError('NOT_FOUND', 'not a port request');
  if (!('port' in t)) throw new EdgeError('invalid-port', t.sandboxId ?? '');
  const tunnel = await openTunnel(deps, t.sandboxId, t.port, req.headers);
  if (socket.destroyed) {
    tunnel.destroy();
    return;
  }
  const headers = serverHeaders(req.headers, req.socket.remoteAddress, 'http');
  headers['connection'] = 'Upgrade';
  headers['upgrade'] = String(req.headers.upgrade);
  const up = overTunnel(tunnel, req.method ?? 'GET', req.url ?? '/', headers);
  up.once('upgrade', (res: IncomingMessage, upSocket: Socket, upHead: Buffer) => {
    socket.write(rawHead(101, res.statusMessage || 'Switching Protocols', res.rawHeaders));
    if (upHead.length) socket.write(upHead);
    if (head.length) upSocket.write(head);
    splice(socket, upSocket);
  });
  up.once('response', (res: IncomingMessage) => {
    // refused by the server: its answer, then the connection closes
    const raw = res.rawHeaders.filter((_, i, all) => {
      const name = (i % 2 === 0 ? all[i] : all[i - 1])!.toLowerCase();
      return name !== 'transfer-encoding' && name !== 'connection' && name !== 'content-length';
    });
    socket.write(rawHead(res.statusCode ?? 502, res.statusMessage ?? '', [...raw, 'Connection', 'close']));
    res.pipe(socket);
  });
  up.once('error', (err) => {
    log.debug({ err }, 'port upgrade failed');
    refuseRaw(socket, new EdgeError('port-closed', t.sandboxId, t.port));
  });
  socket.once('close', () => tunnel.destroy());
  up.end();
}
