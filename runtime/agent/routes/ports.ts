/**
 * Port tunnels: the router reaches a server listening in a sandbox through the sandbox's agent.
 * The router asks `GET /v1/sandboxes/<id>/ports/<port>` with `Upgrade: space-port` and the
 * sandbox's port token (a session token with scope `ports`, from the sandbox's record); the agent
 * checks it as the data plane's token hook does (sandbox, scope, session, paused or not), dials the
 * port on the sandbox's address (the address its guest daemon is reached on, from the host, as
 * every agent → guest call goes) and answers `101` once connected; from then on bytes are spliced
 * both ways with `pipe` (backpressure: a side that stops reading stops the other's reads). The
 * HTTP (or WebSocket, SSE, …) inside is the router's business. The connection counts as activity
 * while open; the guest is held only while dialling (a pause then waits for the dial, not for a
 * connection that may last hours; the connection stalls while the sandbox is frozen).
 * Refusals are answered as the data plane's (`{ error: { code, message } }`): SANDBOX_PAUSED (the
 * router resumes the sandbox and asks again), SANDBOX_NOT_FOUND, PORT_CLOSED (nothing listens
 * after {@link DIAL_ATTEMPTS} tries, as E2B's edge retries its dials), token errors, BAD_REQUEST
 * for the guest daemon's own port.
 * What the sandbox's server dials out goes through its egress policy like any of its traffic: a
 * tunnel carries only connections the host opens to the sandbox.
 */
import type { IncomingMessage, Server } from 'node:http';
import { connect, type Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import { setTimeout as sleep } from 'node:timers/promises';
import { SpaceError } from '../../core/errors.ts';
import { PORT_TUNNEL_PROTOCOL, parseTunnelPath } from '../../core/ports.ts';
import { verifySessionToken } from '../../core/tokens.ts';
import type { AgentDeps } from '../app.ts';

/** Dials of a port before it counts as closed, and the pause between two, ms. */
export const DIAL_ATTEMPTS = 5;
const DIAL_PAUSE_MS = 100;
/** Timeout of one dial, ms. */
const DIAL_TIMEOUT_MS = 5000;

/** Writes a data-plane error answer on a raw socket and closes it. */
function refuse(socket: Duplex, err: unknown): void {
  const e = err instanceof SpaceError ? err : new SpaceError('INTERNAL', 'port tunnel failed');
  const body = JSON.stringify(e.toBody());
  socket.end(
    `HTTP/1.1 ${e.status} ${e.code}\r\nContent-Type: application/json; charset=utf-8\r\n` +
      `Content-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`,
  );
}

/** Connects to `host:port`, up to {@link DIAL_ATTEMPTS} times. @throws SpaceError PORT_CLOSED. */
async function dial(host: string, port: number, sandboxId: string): Promise<Socket> {
  let last: unknown;
  for (let i = 0; i < DIAL_ATTEMPTS; i++) {
    if (i > 0) await sleep(DIAL_PAUSE_MS);
    try {
      return await new Promise<Socket>((resolve, reject) => {
        const s = connect({ host, port, timeout: DIAL_TIMEOUT_MS });
        s.once('connect', () => {
          s.setTimeout(0);
          s.off('error', reject);
          resolve(s);
        });
        s.once('timeout', () => s.destroy(new Error('connect timed out')));
        s.once('error', reject);
      });
    } catch (err) {
      last = err;
    }
  }
  throw new SpaceError(
    'PORT_CLOSED',
    `nothing listens on port ${port} of sandbox ${sandboxId}`,
    { sandboxId, port },
    { cause: last },
  );
}

/**
 * Opens the tunnel `req` asks for. Resolves to the connected socket and what ends its hold.
 * @throws SpaceError as the module doc lists.
 */
async function open(deps: AgentDeps, req: IncomingMessage): Promise<{ up: Socket; end: () => void }> {
  const target = parseTunnelPath(req.url ?? '');
  if (!target) throw new SpaceError('BAD_REQUEST', 'not a port tunnel path');
  const { sandboxId, port } = target;
  const token = /^Bearer\s+(\S+)$/i.exec(req.headers.authorization ?? '')?.[1];
  if (!token) throw new SpaceError('UNAUTHENTICATED', 'session token required (Authorization: Bearer)');
  const claims = await verifySessionToken(deps.verifyKey, token, { sandboxId, scope: 'ports' });
  if (!deps.sandboxes.find(sandboxId) && (await deps.sandboxes.hibernated(sandboxId))) {
    throw new SpaceError('SANDBOX_PAUSED', `sandbox ${sandboxId} is hibernated; resume it first`, {
      sandboxId,
    });
  }
  const sb = deps.sandboxes.get(sandboxId);
  if (claims.sessionId !== sb.sessionId) throw new SpaceError('TOKEN_SCOPE', 'token is for another session');
  // the guest daemon's own port is the platform's, never a tunnel's (the router sends envd's
  // port, the same number, to its envd layer; this is the agent's own refusal)
  if (port === sb.guest.endpoint.port) {
    throw new SpaceError('BAD_REQUEST', `port ${port} is the platform's guest daemon: not reachable`, {
      sandboxId,
      port,
    });
  }
  const { release } = deps.sandboxes.holdGuest(sandboxId);
  let up: Socket;
  try {
    up = await dial(sb.guest.endpoint.host, port, sandboxId);
  } finally {
    release();
  }
  return { up, end: deps.sandboxes.beginActivity(sandboxId) };
}

/**
 * Serves port tunnels on the agent's HTTP `server`: only requests upgrading to
 * {@link PORT_TUNNEL_PROTOCOL} are taken as upgrades; any other request is served as before.
 */
export function installPortTunnels(server: Server, deps: AgentDeps): { closeAll(): void } {
  // tunnels are no longer the HTTP server's connections: closing the agent ends them here
  const live = new Set<Duplex>();
  // Node ≥ 24.9: which upgrade requests go to 'upgrade' (the rest reach the app as requests)
  (server as Server & { shouldUpgradeCallback: (req: IncomingMessage) => boolean }).shouldUpgradeCallback = (
    req,
  ) => String(req.headers.upgrade ?? '').toLowerCase() === PORT_TUNNEL_PROTOCOL;
  server.on('upgrade', (req: IncomingMessage, socket: Duplex, head: Buffer) => {
    live.add(socket);
    socket.once('close', () => live.delete(socket));
    socket.once('error', () => socket.destroy());
    open(deps, req).then(
      ({ up, end }) => {
        if (socket.destroyed) {
          up.destroy();
          end();
          return;
        }
        socket.write(
          `HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: ${PORT_TUNNEL_PROTOCOL}\r\n\r\n`,
        );
        if (head.length) up.write(head);
        // an end is passed on by pipe (half-closes kept); a broken side breaks the other
        up.on('error', () => socket.destroy());
        socket.on('error', () => up.destroy());
        let sides = 2;
        const closed = () => {
          sides -= 1;
          if (sides === 0) end();
        };
        up.once('close', () => {
          closed();
          if (!socket.writableEnded) socket.end();
        });
        socket.once('close', () => {
          closed();
          // the router is gone: what it sent is flushed, then nothing more can be read
          up.end(() => up.destroy());
        });
        up.pipe(socket);
        socket.pipe(up);
      },
      (err: unknown) => {
        if (!(err instanceof SpaceError)) deps.log.warn({ err }, 'port tunnel failed');
        refuse(socket, err);
      },
    );
  });
  return {
    closeAll: () => {
      for (const s of live) s.destroy();
    },
  };
}
