/**
 * The guest daemon's HTTP server (node:http, no framework): routing of the protocol in
 * core/guest-protocol.ts onto the process manager and the file API. Builds the server without
 * listening; main.ts listens.
 */

import { timingSafeEqual } from 'node:crypto';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { SpaceError } from '../core/errors.ts';
import { GUEST_PROTOCOL_VERSION, type GuestHealth, type OomKillResult } from '../core/guest-protocol.ts';
import { Files } from './files.ts';
import { isObject, readJson, sendError, sendJson, sendNoContent } from './http.ts';
import { log as defaultLog, type Logger } from './log.ts';
import { oomProtected, ProcessManager } from './processes.ts';
import { parsePtySize } from './pty.ts';
import type { Identity } from './users.ts';
import { serveWatch } from './watch.ts';

/** Protocol version reported by GET /health ({@link GUEST_PROTOCOL_VERSION}). */
export const GUEST_VERSION = String(GUEST_PROTOCOL_VERSION);

export interface GuestConfig {
  /** The unprivileged default user (commands run as it unless `user: 'root'`). */
  user: Identity;
  /** The root account. */
  root: Identity;
  /** Default cwd and base of relative file paths. */
  home: string;
  /** True when the daemon runs as root: it switches uid for processes and chowns new files. */
  privileged: boolean;
  log?: Logger;
  /** How long a process record stays after its exit frame was delivered (default 60 s; tests). */
  recordTtlMs?: number;
  /**
   * Secret the agent sends as `Authorization: Bearer <token>` on every route but /health. Processes
   * inside the sandbox can reach the daemon too; without the token they cannot start processes
   * (as root, or as anyone) or touch other commands. null disables the check (in-process tests).
   */
  token: string | null;
}

export interface GuestApp {
  server: Server;
  processes: ProcessManager;
  /** Stops accepting requests, kills every process group and cuts open streams. */
  close(): Promise<void>;
}

const PROCESS_ROUTE = /^\/processes\/(\d{1,10})(\/output|\/stdin|\/stdin\/close|\/signal|\/resize)?$/;

/** Builds the guest's HTTP server (not listening). */
export function createGuestApp(config: GuestConfig): GuestApp {
  const log = config.log ?? defaultLog;
  const startedAt = performance.now();
  const switchable = config.privileged && config.user.uid !== process.getuid?.();
  const processes = new ProcessManager({
    user: config.user,
    root: config.root,
    home: config.home,
    canSwitchUser: config.privileged,
    log,
    resetOomScore: oomProtected(),
    ...(config.recordTtlMs !== undefined ? { deliveredTtlMs: config.recordTtlMs } : {}),
  });
  const files = new Files({
    home: config.home,
    owner: switchable ? { uid: config.user.uid, gid: config.user.gid } : null,
    log,
  });

  let expected = config.token === null ? null : Buffer.from(`Bearer ${config.token}`);
  /** Constant-time check of the agent's token. */
  function authorised(req: IncomingMessage): boolean {
    if (expected === null) return true;
    const got = Buffer.from(req.headers.authorization ?? '');
    return got.length === expected.length && timingSafeEqual(got, expected);
  }

  async function route(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const url = new URL(req.url ?? '/', 'http://guest');
    const method = req.method ?? 'GET';
    const path = url.pathname;
    const query = url.searchParams;

    if (!(path === '/health' && method === 'GET') && !authorised(req)) {
      throw new SpaceError('UNAUTHENTICATED', 'the guest daemon only serves its node agent');
    }

    if (path === '/health' && method === 'GET') {
      const health: GuestHealth = {
        ok: true,
        version: GUEST_VERSION,
        uptimeMs: Math.round(performance.now() - startedAt),
      };
      return sendJson(res, 200, health);
    }
    if (path === '/token' && method === 'POST') {
      // a sandbox restored from a snapshot wakes up holding the snapshot's token: its agent
      // replaces it (authorised by the old one) before anything else talks to the guest
      const body = await readJson(req);
      const next = isObject(body) ? body.token : undefined;
      if (typeof next !== 'string' || !/^[A-Za-z0-9_-]{32,256}$/.test(next)) {
        throw new SpaceError('BAD_REQUEST', 'token must be 32–256 characters of [A-Za-z0-9_-]');
      }
      expected = Buffer.from(`Bearer ${next}`);
      return sendNoContent(res);
    }
    if (path === '/init' && method === 'POST') {
      processes.init(await readJson(req));
      return sendNoContent(res);
    }
    if (path === '/processes') {
      if (method === 'POST') {
        const p = await processes.start(await readJson(req));
        return sendJson(res, 201, p.info());
      }
      if (method === 'GET') return sendJson(res, 200, { processes: processes.list() });
    }
    const m = PROCESS_ROUTE.exec(path);
    if (m) {
      const p = processes.get(Number(m[1]));
      const sub = m[2];
      if (sub === undefined && method === 'GET') return sendJson(res, 200, p.info());
      if (sub === '/output' && method === 'GET') {
        const raw = query.get('offset') ?? '0';
        if (!/^\d{1,15}$/.test(raw))
          throw new SpaceError('BAD_REQUEST', 'offset must be a non-negative integer');
        const refusal = p.output.attach(res, Number(raw));
        if (refusal) {
          const message =
            `offset ${refusal.offset} is outside the replay window ` +
            `[${refusal.windowStart}, ${refusal.windowEnd}] of process ${p.pid}`;
          return sendJson(res, 409, {
            error: { code: 'OUTPUT_GONE', message, details: { ...refusal, pid: p.pid } },
          });
        }
        return;
      }
      if (sub === '/stdin' && method === 'POST') {
        await p.writeStdin(req);
        return sendNoContent(res);
      }
      if (sub === '/stdin/close' && method === 'POST') {
        await p.closeStdin();
        return sendNoContent(res);
      }
      if (sub === '/resize' && method === 'POST') {
        const size = parsePtySize(await readJson(req));
        await p.resize(size.cols, size.rows);
        return sendNoContent(res);
      }
      if (sub === '/signal' && method === 'POST') {
        const body = await readJson(req);
        if (!isObject(body) || typeof body.signal !== 'string') {
          throw new SpaceError('BAD_REQUEST', 'signal must be a signal name such as "SIGTERM"');
        }
        p.signal(body.signal);
        return sendNoContent(res);
      }
    }
    if (path === '/oom-kill' && method === 'POST') {
      const v = await processes.oomKill();
      const result: OomKillResult = {
        killed: v ? { pid: v.pid, comm: v.comm, rssBytes: v.rssBytes } : null,
      };
      return sendJson(res, 200, result);
    }
    if (path === '/files') {
      if (method === 'GET') return files.read(res, query);
      if (method === 'PUT') return files.write(req, res, query);
    }
    if (path === '/fs/stat' && method === 'GET') return sendJson(res, 200, await files.stat(query));
    if (path === '/fs/list' && method === 'GET')
      return sendJson(res, 200, { entries: await files.list(query) });
    if (path === '/fs/mkdir' && method === 'POST')
      return sendJson(res, 200, await files.mkdir(await readJson(req)));
    if (path === '/fs/rename' && method === 'POST')
      return sendJson(res, 200, await files.rename(await readJson(req)));
    if (path === '/fs/watch' && method === 'GET') {
      return serveWatch(res, query, config.home, log, (p, st, real) => files.entry(p, st, real));
    }
    if (path === '/fs' && method === 'DELETE') {
      await files.remove(query);
      return sendNoContent(res);
    }
    throw new SpaceError('NOT_FOUND', `no route ${method} ${path}`);
  }

  const server = createServer((req, res) => {
    route(req, res).catch((err: unknown) => {
      sendError(res, err, log);
      // a refused upload's rest is read and dropped, so its sender can read the refusal (the
      // agent reads it at once and stops sending; the connection then closes)
      if (!req.complete && !req.destroyed) req.resume();
    });
  });
  // Uploads and output streams may last as long as they need: no request or idle timeout.
  server.requestTimeout = 0;
  server.timeout = 0;
  // the agent opens its connection when a warm slot is made and pings it while the slot waits:
  // kept open longer than those pings apart, a claim's first call needs no new connection
  server.keepAliveTimeout = 65_000;

  let closing: Promise<void> | undefined;
  function close(): Promise<void> {
    closing ??= new Promise<void>((resolve) => {
      server.close(() => resolve());
      processes.shutdown();
      server.closeIdleConnections();
      setTimeout(() => server.closeAllConnections(), 500).unref();
    });
    return closing;
  }

  return { server, processes, close };
}
