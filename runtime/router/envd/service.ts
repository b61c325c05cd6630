/**
 * An envd-compatible data plane in the router, so the official `e2b` SDK reaches SPACE sandboxes
 * unchanged: the Connect services `process.Process` and `filesystem.Filesystem` (JSON and binary,
 * unary and server streaming, served by `@connectrpc/connect-node` from `.proto` files written
 * from the documented wire format) and the HTTP endpoints `/health` and `/files`. Each call is
 * translated into calls on the sandbox's agent data plane, authorised by the same session token.
 *
 * Sandbox: the `E2b-Sandbox-Id` header (with E2B_SANDBOX_URL), else the host
 * `49983-<sandboxId>.<domain>`. Token: `X-Access-Token` = the `envdAccessToken` the E2B control
 * plane hands out (a SPACE session token with scopes `commands` and `files`); it is verified
 * before anything else happens, as on the router's own routes.
 *
 * Source of every external fact: shared/reference/e2b-protocol.md §2 (envd) and §3 (routing).
 * Implemented: Process.Start/SendInput/SendSignal, Filesystem.Stat/ListDir/MakeDir/Remove,
 * GET /files, POST /files (multipart), GET /health. The rest answers Connect `unimplemented`.
 * Limits of this increment: pid → command lookups live in this router process's memory (one
 * router replica); signed `/files` URLs are refused (the router cannot check a signature made
 * with a token it does not hold); ListDir depth is 1; users other than `user` are not offered.
 */
import type { IncomingMessage } from 'node:http';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { create } from '@bufbuild/protobuf';
import { timestampFromMs } from '@bufbuild/protobuf/wkt';
import {
  Code,
  ConnectError,
  type ConnectRouter,
  createContextKey,
  createContextValues,
  type HandlerContext,
} from '@connectrpc/connect';
import { connectNodeAdapter } from '@connectrpc/connect-node';
import { createParser } from 'eventsource-parser';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { Dispatcher } from 'undici';
import { SpaceError } from '../../core/errors.ts';
import { ID_PATTERN } from '../../core/ids.ts';
import { keys } from '../../core/redis-keys.ts';
import { DEFAULT_TEAM } from '../../core/tenancy.ts';
import { type SessionScope, verifySessionToken } from '../../core/tokens.ts';
import type { RouterDeps } from '../app.ts';
import { type EntryInfo, EntryInfoSchema, Filesystem, FileType } from './gen/filesystem/filesystem_pb.js';
import { Process, Signal } from './gen/process/process_pb.js';

/** envd's port: the host form is `49983-<sandboxId>.<domain>` (§3). */
const ENVD_PORT = '49983';
const HOME = '/home/user';
const SANDBOX_ID = new RegExp(ID_PATTERN);
const HOST = /^(\d{1,5})-([a-z0-9_]{8,64})\./;

/** Who a checked envd request is for. */
interface Target {
  sandboxId: string;
  token: string;
  /** The token's team (the default team for tokens minted before teams). */
  team: string;
}
const kTarget = createContextKey<Target | null>(null);

/** The sandbox an envd request names (header first, then host), or undefined. Pure. */
export function envdSandboxOf(headers: IncomingMessage['headers']): string | undefined {
  const header = headers['e2b-sandbox-id'];
  if (typeof header === 'string' && header) return header;
  const host = String(headers.host ?? headers[':authority'] ?? '');
  const m = HOST.exec(host);
  return m && m[1] === ENVD_PORT ? m[2] : undefined;
}

/** Absolute path for an envd path (relative ones are under the user's home, §2.5). Pure. */
export function envdPath(p: string): string {
  if (!p) return HOME;
  return p.startsWith('/') ? p : `${HOME}/${p}`;
}

/** A Connect error for a SPACE error (or an agent's error body). */
function connectErrorOf(status: number, code: string, message: string): ConnectError {
  if (code === 'SANDBOX_NOT_FOUND' || code === 'SANDBOX_NOT_RUNNING' || code === 'NODE_UNAVAILABLE') {
    return new ConnectError(message, Code.Unavailable);
  }
  if (status === 404) return new ConnectError(message, Code.NotFound);
  if (status === 400 || status === 422) return new ConnectError(message, Code.InvalidArgument);
  if (status === 401) return new ConnectError(message, Code.Unauthenticated);
  if (status === 403) return new ConnectError(message, Code.PermissionDenied);
  if (status === 409) return new ConnectError(message, Code.FailedPrecondition);
  if (status === 429) return new ConnectError(message, Code.ResourceExhausted);
  return new ConnectError(message, Code.Internal);
}

/** Builds the envd routes on the router `app`. */
export function installEnvd(app: FastifyInstance, deps: RouterDeps): void {
  /** Checked requests → their target (read by the Connect handlers through context values). */
  const targets = new WeakMap<IncomingMessage, Target>();
  /** `<sandboxId>:<pid>` → SPACE command id (this process only). */
  const commands = new Map<string, string>();

  async function agent(
    t: Target,
    method: Dispatcher.HttpMethod,
    path: string,
    body?: { json?: unknown; raw?: Buffer | Readable },
  ): Promise<Dispatcher.ResponseData> {
    let up: Awaited<ReturnType<typeof deps.proxy.locator.locate>>;
    try {
      up = await deps.proxy.locator.locate(t.sandboxId, { team: t.team });
    } catch (err) {
      if (err instanceof SpaceError) throw connectErrorOf(err.status, err.code, err.message);
      throw err;
    }
    const headers: Record<string, string> = { authorization: `Bearer ${t.token}` };
    let payload: string | Buffer | Readable | null = null;
    if (body?.json !== undefined) {
      headers['content-type'] = 'application/json';
      payload = JSON.stringify(body.json);
    } else if (body?.raw !== undefined) {
      headers['content-type'] = 'application/octet-stream';
      payload = body.raw;
    }
    return deps.proxy.dispatcher.request({ origin: up.url, path, method, headers, body: payload });
  }

  /** The agent's JSON answer, or its error as a ConnectError. */
  async function agentJson<T>(t: Target, method: Dispatcher.HttpMethod, path: string, json?: unknown) {
    const res = await agent(t, method, path, json === undefined ? undefined : { json });
    const text = await res.body.text();
    if (res.statusCode >= 400) {
      let err = { code: '', message: text };
      try {
        err = (JSON.parse(text) as { error: typeof err }).error;
      } catch {}
      throw connectErrorOf(res.statusCode, err.code, err.message);
    }
    return (text ? JSON.parse(text) : {}) as T;
  }

  function target(ctx: HandlerContext): Target {
    const t = ctx.values.get(kTarget);
    if (!t) throw new ConnectError('no sandbox for this request', Code.Unauthenticated);
    return t;
  }

  function commandOf(t: Target, pid: number | undefined): string {
    const id = pid === undefined ? undefined : commands.get(`${t.sandboxId}:${pid}`);
    if (!id) throw new ConnectError(`process with pid ${pid} not found`, Code.NotFound);
    return id;
  }

  const base = (t: Target) => `/v1/sandboxes/${t.sandboxId}`;
  const q = (path: string) => `?path=${encodeURIComponent(envdPath(path))}`;

  interface FileStat {
    name: string;
    path: string;
    type: 'file' | 'dir' | 'symlink' | 'other';
    size: number;
    mode: number;
    mtimeMs: number;
    target?: { path: string; type: string } | null;
  }
  const modeText = (type: string, mode: number) =>
    (type === 'dir' ? 'd' : '-') +
    [6, 3, 0].map((s) => ['r', 'w', 'x'].map((c, i) => (mode & ((4 >> i) << s) ? c : '-')).join('')).join('');
  const entry = (f: FileStat): EntryInfo => {
    const kind = f.type === 'symlink' ? (f.target?.type ?? 'other') : f.type;
    return create(EntryInfoSchema, {
      name: f.name,
      type: kind === 'dir' ? FileType.DIRECTORY : kind === 'file' ? FileType.FILE : FileType.UNSPECIFIED,
      path: f.path,
      size: BigInt(f.size),
      mode: f.mode & 0o777,
      permissions: modeText(kind, f.mode),
      owner: 'user',
      group: 'user',
      modifiedTime: timestampFromMs(f.mtimeMs),
      ...(f.type === 'symlink' && f.target ? { symlinkTarget: f.target.path } : {}),
    });
  };

  const routes = (router: ConnectRouter) => {
    router.service(Process, {
      async *start(req, ctx) {
        const t = target(ctx);
        const p = req.process;
        if (!p?.cmd) throw new ConnectError('process.cmd is required', Code.InvalidArgument);
        if (req.pty)
          throw new ConnectError('PTY sessions are not supported by SPACE yet', Code.Unimplemented);
        const timeoutMs = ctx.timeoutMs();
        const started = await agentJson<{ commandId: string; pid: number }>(
          t,
          'POST',
          `${base(t)}/commands`,
          {
            cmd: p.cmd,
            args: p.args,
            shell: false,
            env: p.envs,
            ...(p.cwd ? { cwd: envdPath(p.cwd) } : {}),
            user: 'user',
            stdin: req.stdin === true,
            ...(timeoutMs && timeoutMs > 0 ? { timeoutMs } : {}),
          },
        );
        commands.set(`${t.sandboxId}:${started.pid}`, started.commandId);
        yield { event: { event: { case: 'start', value: { pid: started.pid } } } };
        const res = await agent(t, 'GET', `${base(t)}/commands/${started.commandId}/events`);
        if (res.statusCode !== 200) {
          throw connectErrorOf(res.statusCode, '', await res.body.text());
        }
        const pending: { event: string; data: string }[] = [];
        const parser = createParser({
          onEvent: (e) => pending.push({ event: e.event ?? 'message', data: e.data }),
        });
        const decoder = new TextDecoder();
        try {
          for await (const chunk of res.body) {
            parser.feed(decoder.decode(chunk as Buffer, { stream: true }));
            for (const e of pending.splice(0)) {
              if (e.event === 'stdout' || e.event === 'stderr') {
                const bytes = Buffer.from((JSON.parse(e.data) as { data: string }).data, 'base64');
                yield {
                  event: { event: { case: 'data', value: { output: { case: e.event, value: bytes } } } },
                };
              } else if (e.event === 'exit') {
                const x = JSON.parse(e.data) as {
                  exitCode: number | null;
                  signal: string | null;
                  error?: string;
                };
                const exitCode = x.exitCode ?? -1;
                const status = x.signal
                  ? `signal: ${x.signal.replace(/^SIG/, '').toLowerCase()}`
                  : `exit status ${exitCode}`;
                yield {
                  event: {
                    event: {
                      case: 'end',
                      value: {
                        exitCode,
                        exited: x.exitCode !== null,
                        status,
                        ...(exitCode !== 0 ? { error: x.error ?? status } : {}),
                      },
                    },
                  },
                };
                return;
              }
            }
          }
        } finally {
          res.body.destroy();
          commands.delete(`${t.sandboxId}:${started.pid}`);
        }
        throw new ConnectError('the command stream ended without an exit', Code.Unavailable);
      },
      async sendSignal(req, ctx) {
        const t = target(ctx);
        const pid = req.process?.selector.case === 'pid' ? req.process.selector.value : undefined;
        const cmd = commandOf(t, pid);
        const signal = req.signal === Signal.SIGTERM ? 'SIGTERM' : 'SIGKILL';
        await agentJson(t, 'POST', `${base(t)}/commands/${cmd}/signal`, { signal });
        return {};
      },
      async sendInput(req, ctx) {
        const t = target(ctx);
        const pid = req.process?.selector.case === 'pid' ? req.process.selector.value : undefined;
        const cmd = commandOf(t, pid);
        if (req.input?.input.case !== 'stdin') {
          throw new ConnectError('only stdin input is supported (no PTY)', Code.Unimplemented);
        }
        const res = await agent(t, 'POST', `${base(t)}/commands/${cmd}/stdin`, {
          raw: Buffer.from(req.input.input.value),
        });
        const text = await res.body.text();
        if (res.statusCode >= 400) throw connectErrorOf(res.statusCode, '', text);
        return {};
      },
    });
    router.service(Filesystem, {
      async stat(req, ctx) {
        const t = target(ctx);
        return { entry: entry(await agentJson<FileStat>(t, 'GET', `${base(t)}/fs/stat${q(req.path)}`)) };
      },
      async listDir(req, ctx) {
        const t = target(ctx);
        const out = await agentJson<{ entries: FileStat[] }>(t, 'GET', `${base(t)}/fs/list${q(req.path)}`);
        return { entries: out.entries.filter((f) => f.type !== 'other').map(entry) };
      },
      async makeDir(req, ctx) {
        const t = target(ctx);
        const f = await agentJson<FileStat>(t, 'POST', `${base(t)}/fs/mkdir`, {
          path: envdPath(req.path),
          parents: true,
        });
        return { entry: entry(f) };
      },
      async remove(req, ctx) {
        const t = target(ctx);
        const res = await agent(t, 'DELETE', `${base(t)}/fs${q(req.path)}&recursive=true`);
        const text = await res.body.text();
        if (res.statusCode >= 400 && res.statusCode !== 404) throw connectErrorOf(res.statusCode, '', text);
        return {};
      },
    });
  };
  const connect = connectNodeAdapter({
    routes,
    contextValues: (req) => createContextValues().set(kTarget, targets.get(req as IncomingMessage) ?? null),
  });

  /** envd's HTTP error body (§2.7). */
  const envdError = (reply: FastifyReply, code: number, message: string) =>
    reply.status(code).type('application/json; charset=utf-8').send({ code, message });

  /** Verifies sandbox + token for `scope`; answers 401 itself and returns null when refused. */
  async function check(req: FastifyRequest, reply: FastifyReply, scope: SessionScope) {
    const sandboxId = envdSandboxOf(req.headers);
    if (!sandboxId || !SANDBOX_ID.test(sandboxId)) {
      await envdError(reply, 400, 'no sandbox: set the E2b-Sandbox-Id header or use 49983-<id>.<domain>');
      return null;
    }
    const token = req.headers['x-access-token'];
    if (typeof token !== 'string' || !token) {
      await envdError(
        reply,
        401,
        'unauthorized access, please provide a valid access token or method signing if supported',
      );
      return null;
    }
    let team: string;
    try {
      team = (await verifySessionToken(deps.verifyKey, token, { sandboxId, scope })).team ?? DEFAULT_TEAM;
    } catch (err) {
      await envdError(reply, 401, err instanceof Error ? err.message : 'unauthorized');
      return null;
    }
    return { sandboxId, token, team };
  }

  for (const [prefix, scope] of [
    ['/process.Process/', 'commands'],
    ['/filesystem.Filesystem/', 'files'],
  ] as const) {
    app.post(`${prefix}:method`, async (req, reply) => {
      const t = await check(req, reply, scope);
      if (!t) return reply;
      targets.set(req.raw, t);
      reply.hijack();
      connect(req.raw, reply.raw);
      return reply;
    });
  }

  app.get('/health', async (req, reply) => {
    const sandboxId = envdSandboxOf(req.headers);
    const state =
      sandboxId && SANDBOX_ID.test(sandboxId)
        ? await deps.redis.hget(keys.sandbox(sandboxId), 'state')
        : null;
    // 502 = the sandbox is gone: the SDK's isRunning() answers false (§2.7)
    if (!state || state === 'killing' || state === 'killed') {
      return reply.status(502).send({ message: 'The sandbox was not found', sandboxId, code: 502 });
    }
    return reply.status(204).send();
  });

  app.get<{ Querystring: { path?: string; signature?: string } }>('/files', async (req, reply) => {
    if (req.query.signature) return envdError(reply, 401, 'signed URLs are not supported by SPACE yet');
    const t = await check(req, reply, 'files');
    if (!t) return reply;
    const path = envdPath(req.query.path ?? '');
    const res = await agent(t, 'GET', `${base(t)}/files?path=${encodeURIComponent(path)}`).catch((e) => {
      throw e instanceof ConnectError ? new SpaceError('SANDBOX_NOT_FOUND', e.rawMessage) : e;
    });
    if (res.statusCode >= 400) {
      const text = await res.body.text();
      const status = res.statusCode === 404 ? 404 : res.statusCode;
      return envdError(reply, status, status === 404 ? `path '${path}' does not exist` : text);
    }
    reply.hijack();
    reply.raw.writeHead(200, {
      'content-type': 'application/octet-stream',
      'content-disposition': 'inline',
      ...(res.headers['content-length'] ? { 'content-length': String(res.headers['content-length']) } : {}),
    });
    await pipeline(res.body, reply.raw).catch(() => reply.raw.destroy());
    return reply;
  });

  app.post<{ Querystring: { path?: string; signature?: string } }>('/files', async (req, reply) => {
    if (req.query.signature) return envdError(reply, 401, 'signed URLs are not supported by SPACE yet');
    const t = await check(req, reply, 'files');
    if (!t) return reply;
    const type = String(req.headers['content-type'] ?? '');
    if (!type.startsWith('multipart/form-data')) {
      return envdError(reply, 400, 'only multipart/form-data uploads are supported (envd < 0.5.7)');
    }
    // the Fetch API's multipart parser (buffers each part; bounded by the client's file sizes)
    const form = await new Request('http://envd/files', {
      method: 'POST',
      headers: { 'content-type': type },
      body: Readable.toWeb(req.raw) as ReadableStream,
      duplex: 'half',
    } as RequestInit).formData();
    const out: { name: string; type: 'file'; path: string }[] = [];
    for (const [field, value] of form.entries()) {
      if (field !== 'file' || typeof value === 'string') continue;
      const path = envdPath(req.query.path ?? value.name);
      const res = await agent(t, 'PUT', `${base(t)}/files?path=${encodeURIComponent(path)}`, {
        raw: Buffer.from(await value.arrayBuffer()),
      });
      const text = await res.body.text();
      if (res.statusCode >= 400) return envdError(reply, res.statusCode, text);
      out.push({ name: path.split('/').pop() ?? path, type: 'file', path });
    }
    if (!out.length) return envdError(reply, 400, 'no file part in the upload');
    return reply.status(200).send(out);
  });
}
