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
 * Source of every external fact: the E2B SDK (https://github.com/e2b-dev/e2b, packages/js-sdk;
 * npm `e2b` 2.51.0), its envd client and its routing of envd calls; what SPACE supports of it is
 * docs/e2b.md.
 * The services live in `process.ts` and `filesystem.ts`; their calls on the agent in `upstream.ts`.
 * Nothing about a sandbox is kept in this process: any number of router replicas serve it.
 * Signed `/files` URLs (`uploadUrl()`/`downloadUrl()`) are checked against the sandbox's envd
 * access token, which the API keeps in Redis (`keys.e2bEnvdToken`) for exactly that.
 * ListDir walks any depth, one agent call per directory, at most `MAX_LIST_ENTRIES` entries.
 */
import type { IncomingMessage } from 'node:http';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { createGunzip } from 'node:zlib';
import { ConnectError, type ConnectRouter, createContextValues } from '@connectrpc/connect';
import { connectNodeAdapter } from '@connectrpc/connect-node';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { SpaceError } from '../../core/errors.ts';
import { FILE_METADATA_HEADER, type FileStat, fileMetadataProblem } from '../../core/guest-protocol.ts';
import { ID_PATTERN } from '../../core/ids.ts';
import { keys } from '../../core/redis-keys.ts';
import { DEFAULT_TEAM } from '../../core/tenancy.ts';
import { type SessionScope, verifySessionToken } from '../../core/tokens.ts';
import { inSpan, traceContextFrom } from '../../core/tracing.ts';
import type { RouterDeps } from '../app.ts';
import { filesystemService } from './filesystem.ts';
import { ENVD_USERS, type EnvdUser, envdPath, envdSandboxOf } from './paths.ts';
import { processService } from './process.ts';
import { checkEnvdSignature, type EnvdFileOperation } from './signature.ts';
import { createUpstream, kTarget, sandboxPath, type Target } from './upstream.ts';

const SANDBOX_ID = new RegExp(ID_PATTERN);

/** Builds the envd routes on the router `app`. */
export function installEnvd(app: FastifyInstance, deps: RouterDeps): void {
  /** Checked requests → their target (read by the Connect handlers through context values). */
  const targets = new WeakMap<IncomingMessage, Target>();
  const up = createUpstream(deps);
  const base = sandboxPath;

  const connect = connectNodeAdapter({
    routes: (router: ConnectRouter) => {
      processService(up)(router);
      filesystemService(up)(router);
    },
    contextValues: (req) => createContextValues().set(kTarget, targets.get(req as IncomingMessage) ?? null),
  });

  /** envd's HTTP error body (§2.7). */
  const envdError = (reply: FastifyReply, code: number, message: string) =>
    reply.status(code).type('application/json; charset=utf-8').send({ code, message });

  /**
   * Verifies sandbox + token for `scope`; answers 401 itself and returns null when refused.
   * `signed` (only `/files`): a request without `X-Access-Token` may carry a signature instead
   * (§2.7), checked against the sandbox's stored envd access token, which then stands for it.
   */
  async function check(
    req: FastifyRequest,
    reply: FastifyReply,
    scope: SessionScope,
    signed?: { query: FilesQuery; operation: EnvdFileOperation },
  ) {
    const sandboxId = envdSandboxOf(req.headers);
    if (!sandboxId || !SANDBOX_ID.test(sandboxId)) {
      await envdError(reply, 400, 'no sandbox: set the E2b-Sandbox-Id header or use 49983-<id>.<domain>');
      return null;
    }
    let token = req.headers['x-access-token'];
    if ((typeof token !== 'string' || !token) && signed?.query.signature) {
      // no token stored = no live sandbox handed one out: nothing can have signed this URL
      const stored = await deps.redis.get(keys.e2bEnvdToken(sandboxId));
      const q = signed.query;
      const refusal = stored
        ? checkEnvdSignature(
            {
              path: q.path ?? '',
              operation: signed.operation,
              user: q.username ?? '',
              signature: q.signature ?? '',
              expiration: q.signature_expiration,
            },
            stored,
          )
        : 'invalid signature';
      if (refusal) {
        await envdError(reply, 401, refusal);
        return null;
      }
      token = stored ?? '';
    }
    if (typeof token !== 'string' || !token) {
      await envdError(
        reply,
        401,
        'unauthorized access, please provide a valid access token or method signing if supported',
      );
      return null;
    }
    // the same spans as the router's own routes: the check here, each agent call in `up.request`
    const trace = traceContextFrom(req.headers);
    const route = signed ? `files.${signed.operation}` : req.url.split('?')[0]!.slice(1);
    let team: string;
    try {
      const claims = await inSpan(
        'router.token.verify',
        { 'space.route': route, 'space.sandbox.id': sandboxId },
        () => verifySessionToken(deps.verifyKey, token, { sandboxId, scope }),
        trace,
      );
      team = claims.team ?? DEFAULT_TEAM;
    } catch (err) {
      await envdError(reply, 401, err instanceof Error ? err.message : 'unauthorized');
      return null;
    }
    return { sandboxId, token, team, route, trace };
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
    // 502 = not running (gone, or paused: E2B's edge answers a paused sandbox's probe so, and a
    // probe never resumes one): the SDK's isRunning() answers false (§2.7; docs/e2b.md)
    if (state !== 'running' && state !== 'creating') {
      return reply.status(502).send({ message: 'The sandbox was not found', sandboxId, code: 502 });
    }
    return reply.status(204).send();
  });

  app.get<{ Querystring: FilesQuery }>('/files', async (req, reply) => {
    const t = await check(req, reply, 'files', { query: req.query, operation: 'read' });
    if (!t) return reply;
    const home = homeOf(req.query.username);
    if (!home) return envdError(reply, 401, `unknown user "${req.query.username}"`);
    const path = envdPath(req.query.path ?? '', home);
    const res = await up.request(t, 'GET', `${base(t)}/files?path=${encodeURIComponent(path)}`).catch((e) => {
      throw e instanceof ConnectError ? new SpaceError('SANDBOX_NOT_FOUND', e.rawMessage) : e;
    });
    if (res.statusCode >= 400) {
      const text = await res.body.text();
      const status = res.statusCode === 404 ? 404 : res.statusCode;
      return envdError(reply, status, status === 404 ? `path '${path}' does not exist` : messageOf(text));
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

  app.post<{ Querystring: FilesQuery }>('/files', async (req, reply) => {
    const t = await check(req, reply, 'files', { query: req.query, operation: 'write' });
    if (!t) return reply;
    const home = homeOf(req.query.username);
    if (!home) return envdError(reply, 401, `unknown user "${req.query.username}"`);
    const type = String(req.headers['content-type'] ?? '');
    // envd ≥ 0.6.2: `X-Metadata-*` headers = every uploaded file's metadata, checked first (§2.7)
    const metadata = metadataOfHeaders(req.raw.rawHeaders);
    const problem = fileMetadataProblem(metadata);
    if (problem) return envdError(reply, 400, problem);
    const headers = Object.keys(metadata).length
      ? { [FILE_METADATA_HEADER]: JSON.stringify(metadata) }
      : undefined;
    const out: { name: string; type: 'file'; path: string; metadata?: Record<string, string> }[] = [];
    /** Streams one file to the agent; answers the envd error itself and returns false when refused. */
    const put = async (path: string, body: Readable | Buffer): Promise<boolean> => {
      const res = await up.request(t, 'PUT', `${base(t)}/files?path=${encodeURIComponent(path)}`, {
        raw: body,
        ...(headers ? { headers } : {}),
      });
      const text = await res.body.text();
      if (res.statusCode >= 400) {
        await envdError(reply, res.statusCode === 413 ? 507 : res.statusCode, messageOf(text));
        return false;
      }
      // exactly name, type, path, and metadata only when the file has some (§2.7)
      const written = JSON.parse(text) as FileStat;
      out.push({
        name: path.split('/').pop() ?? path,
        type: 'file',
        path,
        ...(written.metadata ? { metadata: written.metadata } : {}),
      });
      return true;
    };
    if (type.startsWith('application/octet-stream')) {
      // envd ≥ 0.5.7: the raw body, one file, `path` required, optionally gzip-encoded (§2.7)
      if (!req.query.path) return envdError(reply, 400, 'path is required for an octet-stream upload');
      const encoding = String(req.headers['content-encoding'] ?? 'identity').toLowerCase();
      if (encoding !== 'identity' && encoding !== 'gzip') {
        return envdError(reply, 400, `unsupported Content-Encoding "${encoding}"`);
      }
      const body = encoding === 'gzip' ? req.raw.pipe(createGunzip()) : req.raw;
      if (!(await put(envdPath(req.query.path, home), body))) return reply;
      return reply.status(200).send(out);
    }
    if (!type.startsWith('multipart/form-data')) {
      return envdError(reply, 400, 'upload with multipart/form-data or application/octet-stream');
    }
    // the Fetch API's multipart parser (buffers each part; bounded by the client's file sizes)
    const form = await new Request('http://envd/files', {
      method: 'POST',
      headers: { 'content-type': type },
      body: Readable.toWeb(req.raw) as ReadableStream,
      duplex: 'half',
    } as RequestInit).formData();
    for (const [field, value] of form.entries()) {
      if (field !== 'file' || typeof value === 'string') continue;
      const path = envdPath(req.query.path ?? value.name, home);
      if (!(await put(path, Buffer.from(await value.arrayBuffer())))) return reply;
    }
    if (!out.length) return envdError(reply, 400, 'no file part in the upload');
    return reply.status(200).send(out);
  });
}

/** Prefix of the upload headers that carry file metadata (§2.7), as Node spells header names. */
const METADATA_HEADER_PREFIX = 'x-metadata-';

/**
 * The file metadata of an upload's headers, as envd reads them (§2.7): `X-Metadata-<key>: <value>`
 * → `<key>` lowercased, the first value of a repeated header, an empty key dropped. `raw` = Node's
 * `rawHeaders` (name, value, name, value…), the same on HTTP/1.1 and HTTP/2. Pure.
 */
export function metadataOfHeaders(raw: readonly string[]): Record<string, string> {
  const out = new Map<string, string>();
  for (let i = 0; i + 1 < raw.length; i += 2) {
    const name = raw[i]!.toLowerCase();
    if (!name.startsWith(METADATA_HEADER_PREFIX)) continue;
    const key = name.slice(METADATA_HEADER_PREFIX.length);
    if (key && !out.has(key)) out.set(key, raw[i + 1]!);
  }
  // an own property for every key, `__proto__` included
  return Object.fromEntries(out);
}

/** Query of `/files` (§2.7). */
interface FilesQuery {
  path?: string;
  username?: string;
  signature?: string;
  signature_expiration?: string;
}

/** Home of the `username` of a `/files` request (default user when absent), or undefined. */
function homeOf(username: string | undefined): string | undefined {
  if (!username) return ENVD_USERS.user;
  return Object.hasOwn(ENVD_USERS, username) ? ENVD_USERS[username as EnvdUser] : undefined;
}

/** The message of an agent's `{ error: { message } }` body (or the text itself). */
function messageOf(text: string): string {
  try {
    return (JSON.parse(text) as { error: { message: string } }).error.message;
  } catch {
    return text;
  }
}
