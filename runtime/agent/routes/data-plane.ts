/**
 * The data plane clients use directly, authorised by session tokens verified offline:
 * command events (SSE), stdin, signals, command status, and files (download, upload, stat, list,
 * mkdir, remove). Each route is registered from its row of `DATA_PLANE_ROUTES` (core/data-plane.ts)
 * and admitted by the one token hook (auth.ts) as that row's scope and auth kind say, before its
 * handler runs; handlers read the admitted sandbox (or hibernation) from the hook.
 */
import { PassThrough, type Readable, Transform } from 'node:stream';
import { finished, pipeline } from 'node:stream/promises';
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox';
import { Type } from '@sinclair/typebox';
import type { FastifyRequest } from 'fastify';
import {
  AgentCommandRequestSchema,
  type AgentCommandResponse,
  PtySizeSchema,
} from '../../core/agent-protocol.ts';
import type { CommandSummary } from '../../core/data-plane.ts';
import { SpaceError } from '../../core/errors.ts';
import {
  FILE_METADATA_HEADER,
  METADATA_PROTOCOL,
  parseFileMetadataHeader,
} from '../../core/guest-protocol.ts';
import { ID_PATTERN, newId } from '../../core/ids.ts';
import { DEFAULT_TEAM } from '../../core/tenancy.ts';
import { inSpan, traceContextFrom } from '../../core/tracing.ts';
import type { AgentDeps } from '../app.ts';
import { startOptions } from '../commands/commands.ts';
import { Spool } from '../commands/spool.ts';
import { streamSpool } from '../commands/sse.ts';
import type { HibernatedCommand, HibernatedView } from '../sandboxes/hibernated-view.ts';
import type { LocalSandbox } from '../sandboxes/manager.ts';
import { dataPlaneGate, declared } from './auth.ts';

const Sid = Type.String({ pattern: ID_PATTERN });
const SandboxParams = Type.Object({ id: Sid });
const CommandParams = Type.Object({ id: Sid, cmd: Sid });
const TokenQuery = { token: Type.Optional(Type.String({ maxLength: 4096 })) };
const PathQuery = Type.Object({ path: Type.String({ minLength: 1, maxLength: 4096 }), ...TokenQuery });

/** `?path=…&recursive=…` (plus the token) of the remove route. */
const PathRecursiveQuery = Type.Object({
  path: Type.String({ minLength: 1, maxLength: 4096 }),
  recursive: Type.Optional(Type.Boolean()),
  ...TokenQuery,
});

/** The watch's query: `entries` = events carry the entry; `networkMounts` = NFS/SMB/FUSE allowed. */
const WatchQuery = Type.Object({
  ...PathRecursiveQuery.properties,
  entries: Type.Optional(Type.Boolean()),
  networkMounts: Type.Optional(Type.Boolean()),
});

/**
 * The byte offset a command's event stream starts at: `Last-Event-ID` (header first, then
 * `?lastEventId=`), 0 without one.
 * @throws SpaceError BAD_REQUEST when it is not an event id (1–15 digits).
 */
function eventOffset(header: string | undefined, query: string | undefined): number {
  const raw = header ?? query ?? '0';
  if (!/^[0-9]{1,15}$/.test(raw)) throw new SpaceError('BAD_REQUEST', 'Last-Event-ID must be an event id');
  return Number(raw);
}

export function dataPlaneRoutes(deps: AgentDeps): FastifyPluginAsyncTypebox {
  const gate = dataPlaneGate(deps);

  /** The command `cmdId` of hibernated sandbox `hib`. @throws SpaceError COMMAND_NOT_FOUND. */
  async function hibernatedCommand(hib: HibernatedView, cmdId: string): Promise<HibernatedCommand> {
    const cmd = (await hib.commands()).find((c) => c.id === cmdId);
    if (!cmd) throw new SpaceError('COMMAND_NOT_FOUND', `no command ${cmdId} in sandbox ${hib.sandboxId}`);
    return cmd;
  }

  /** Opens a hibernated command's spool to read; a spool gone meanwhile (a resume took it) is PAUSED. */
  async function hibernatedSpool(hib: HibernatedView, cmd: HibernatedCommand): Promise<Spool> {
    return Spool.openToRead(cmd.spoolPath).catch((err: unknown) => {
      throw new SpaceError('SANDBOX_PAUSED', `sandbox ${hib.sandboxId} is resuming; retry`, undefined, {
        cause: err,
      });
    });
  }

  /**
   * Admits one more open stream (a command's events, a watch) of sandbox `sb`: its own limit
   * (`maxStreams`), then the team's open-streams quota (the limit is the token's, the count the
   * team's in Redis). Returns what closes the team's count again.
   * @throws SpaceError RATE_LIMITED over the sandbox's limit, or the team quota's error.
   */
  async function admitStream(req: FastifyRequest, sb: LocalSandbox): Promise<() => void> {
    if (sb.streams >= deps.config.maxStreams) throw new SpaceError('RATE_LIMITED', 'too many open streams');
    const claims = gate.claims(req);
    return claims?.maxStreams != null && deps.teamStreams
      ? await deps.teamStreams.open(claims.team ?? DEFAULT_TEAM, claims.maxStreams)
      : () => {};
  }

  return async (app) => {
    app.addHook('onRequest', async (req, reply) => {
      // 'close' also fires for hijacked (SSE) responses and for clients that go away
      reply.raw.once('close', () => gate.release(req));
    });
    // the one token hook: each route is admitted as its row of DATA_PLANE_ROUTES declares
    app.addHook('preHandler', gate.hook);

    // raw bodies (stdin, uploads) stream through untouched; limits are enforced while streaming
    app.addContentTypeParser('application/octet-stream', (_req, payload, done) => done(null, payload));

    app.route({
      ...declared('command.events'),
      schema: {
        params: CommandParams,
        querystring: Type.Object({
          ...TokenQuery,
          lastEventId: Type.Optional(Type.String({ pattern: '^[0-9]{1,15}$' })),
        }),
      },
      handler: async (req, reply) => {
        const hib = gate.hibernated(req);
        if (hib) {
          // a hibernated sandbox's output is what was spooled: served, then the stream ends (the
          // client reconnects with Last-Event-ID once it resumed)
          const spool = await hibernatedSpool(hib, await hibernatedCommand(hib, req.params.cmd));
          try {
            const from = eventOffset(
              req.headers['last-event-id'] as string | undefined,
              req.query.lastEventId,
            );
            if (from > spool.size)
              throw new SpaceError('BAD_REQUEST', `Last-Event-ID ${from} is beyond the stream`);
            reply.hijack();
            await streamSpool(reply.raw, spool, from, { follow: false }).catch(() => reply.raw.destroy());
          } finally {
            await spool.close();
          }
          return;
        }
        // opening the stream (token, session, quotas) is a span in the caller's trace; the events
        // after it are the command's own time
        const { sb, cmd, from, closeTeamStream } = await inSpan(
          'agent.stream.open',
          { 'space.sandbox.id': req.params.id },
          async () => {
            const sb = gate.sandbox(req);
            const cmd = deps.sandboxes.command(sb.id, req.params.cmd);
            const from = eventOffset(
              req.headers['last-event-id'] as string | undefined,
              req.query.lastEventId,
            );
            if (from > cmd.spool.size)
              throw new SpaceError('BAD_REQUEST', `Last-Event-ID ${from} is beyond the stream`);
            return { sb, cmd, from, closeTeamStream: await admitStream(req, sb) };
          },
          traceContextFrom(req.headers),
        );
        sb.streams += 1;
        reply.hijack();
        try {
          await streamSpool(reply.raw, cmd.spool, from);
        } catch (err) {
          req.log.warn({ err }, 'event stream ended with an error');
          reply.raw.destroy();
        } finally {
          sb.streams -= 1;
          closeTeamStream();
        }
      },
    });

    app.route({
      ...declared('command.start'),
      schema: {
        params: SandboxParams,
        querystring: Type.Object(TokenQuery),
        body: Type.Omit(AgentCommandRequestSchema, ['commandId']),
      },
      handler: async (req, reply) => {
        const sb = gate.sandbox(req);
        // the same span as a start the API dispatches (routes/internal.ts): an envd Process/Start
        const cmd = await inSpan(
          'agent.commands.start',
          { 'space.sandbox.id': sb.id },
          () => deps.sandboxes.startCommand(sb.id, startOptions(newId('cmd'), req.body)),
          traceContextFrom(req.headers),
        );
        return reply.status(201).send({ commandId: cmd.id, pid: cmd.pid } satisfies AgentCommandResponse);
      },
    });

    app.route({
      ...declared('command.list'),
      schema: {
        params: SandboxParams,
        querystring: Type.Object({
          ...TokenQuery,
          pid: Type.Optional(Type.Integer({ minimum: 0 })),
          tag: Type.Optional(Type.String({ maxLength: 256 })),
          all: Type.Optional(Type.Boolean()),
        }),
      },
      handler: async (req) => {
        const { pid, tag, all } = req.query;
        const hib = gate.hibernated(req);
        if (hib) {
          const rows: CommandSummary[] = [];
          for (const c of await hib.commands()) {
            const spool = await hibernatedSpool(hib, c);
            const running = !spool.closed;
            await spool.close();
            if (
              (all === true || running) &&
              (pid === undefined || c.pid === pid) &&
              (tag === undefined || c.config.tag === tag)
            )
              rows.push({ id: c.id, pid: c.pid, running, startedAt: c.startedAt, ...c.config });
          }
          return { commands: rows.sort((a, b) => b.startedAt - a.startedAt) };
        }
        const sb = gate.sandbox(req);
        const commands: CommandSummary[] = [...sb.commands.values()]
          .filter(
            (c) =>
              (all === true || c.exit === null) &&
              (pid === undefined || c.pid === pid) &&
              (tag === undefined || c.config.tag === tag),
          )
          // newest first: a pid the kernel reused names the latest command that had it
          .sort((a, b) => b.startedAt - a.startedAt)
          .map((c) => ({
            id: c.id,
            pid: c.pid,
            running: c.exit === null,
            startedAt: c.startedAt,
            ...c.config,
          }));
        return { commands };
      },
    });

    app.route({
      ...declared('command.get'),
      schema: { params: CommandParams, querystring: Type.Object(TokenQuery) },
      handler: async (req) => {
        const hib = gate.hibernated(req);
        if (hib) {
          const c = await hibernatedCommand(hib, req.params.cmd);
          const spool = await hibernatedSpool(hib, c);
          await spool.close();
          // the exit is read by the resumed sandbox's pump; until then it is not known here
          return { id: c.id, pid: c.pid, running: !spool.closed, exit: null, outputBytes: spool.size };
        }
        const sb = gate.sandbox(req);
        const cmd = deps.sandboxes.command(sb.id, req.params.cmd);
        return {
          id: cmd.id,
          pid: cmd.pid,
          running: cmd.exit === null,
          exit: cmd.exit,
          outputBytes: cmd.spool.size,
        };
      },
    });

    app.route({
      ...declared('command.stdin'),
      schema: { params: CommandParams, querystring: Type.Object(TokenQuery) },
      handler: async (req, reply) => {
        const sb = gate.sandbox(req);
        const cmd = deps.sandboxes.command(sb.id, req.params.cmd);
        if (cmd.exit) throw new SpaceError('PROCESS_EXITED', 'the command has exited');
        const body = req.body as NodeJS.ReadableStream | undefined;
        if (!body || typeof (body as { pipe?: unknown }).pipe !== 'function') {
          throw new SpaceError('BAD_REQUEST', 'send stdin bytes with Content-Type: application/octet-stream');
        }
        // through a pipe: when the guest refuses before the body ended (the process exited),
        // undici drops the pipe, not the request whose socket the refusal goes out on
        const pass = new PassThrough();
        (body as unknown as Readable).pipe(pass);
        await sb.guest.writeStdin(cmd.pid, pass);
        return reply.status(204).send();
      },
    });

    app.route({
      ...declared('command.stdin-close'),
      schema: { params: CommandParams, querystring: Type.Object(TokenQuery) },
      handler: async (req, reply) => {
        const sb = gate.sandbox(req);
        const cmd = deps.sandboxes.command(sb.id, req.params.cmd);
        await sb.guest.closeStdin(cmd.pid);
        return reply.status(204).send();
      },
    });

    app.route({
      ...declared('command.resize'),
      schema: { params: CommandParams, querystring: Type.Object(TokenQuery), body: PtySizeSchema },
      handler: async (req, reply) => {
        const sb = gate.sandbox(req);
        const cmd = deps.sandboxes.command(sb.id, req.params.cmd);
        if (cmd.exit) throw new SpaceError('PROCESS_EXITED', 'the command has exited');
        if (!cmd.config.pty) throw new SpaceError('BAD_REQUEST', 'the command has no terminal to resize');
        await sb.guest.resize(cmd.pid, req.body.cols, req.body.rows);
        return reply.status(204).send();
      },
    });

    app.route({
      ...declared('command.signal'),
      schema: {
        params: CommandParams,
        querystring: Type.Object(TokenQuery),
        body: Type.Object(
          { signal: Type.String({ pattern: '^SIG[A-Z0-9]{2,8}$' }) },
          { additionalProperties: false },
        ),
      },
      handler: async (req, reply) => {
        const sb = gate.sandbox(req);
        const cmd = deps.sandboxes.command(sb.id, req.params.cmd);
        if (cmd.exit) throw new SpaceError('PROCESS_EXITED', 'the command has exited');
        await sb.guest.signal(cmd.pid, req.body.signal);
        return reply.status(204).send();
      },
    });

    app.route({
      ...declared('files.read'),
      schema: { params: SandboxParams, querystring: PathQuery },
      handler: async (req, reply) => {
        const sb = gate.sandbox(req);
        // one guest call: the length comes with the bytes it describes (a separate stat of a
        // symlink or of a file that changes in between would disagree with them — R10)
        const { body, size } = await sb.guest.readFile(req.query.path);
        return reply.type('application/octet-stream').header('content-length', size).send(body);
      },
    });

    app.route({
      ...declared('files.write'),
      schema: { params: SandboxParams, querystring: PathQuery },
      handler: async (req, reply) => {
        const sb = gate.sandbox(req);
        // checked before any byte moves (the guest checks it again), as is the guest's protocol
        const metadata = parseFileMetadataHeader(req.headers[FILE_METADATA_HEADER]);
        if (metadata && Object.keys(metadata).length) {
          await sb.guest.requireProtocol(METADATA_PROTOCOL, 'file metadata');
        }
        const limit = deps.config.maxUploadBytes;
        const declared = Number(req.headers['content-length'] ?? 0);
        if (declared > limit) throw new SpaceError('BODY_TOO_LARGE', `uploads are limited to ${limit} bytes`);
        const src = req.body as NodeJS.ReadableStream | undefined;
        if (!src || typeof (src as { pipe?: unknown }).pipe !== 'function') {
          throw new SpaceError('BAD_REQUEST', 'upload with Content-Type: application/octet-stream');
        }
        let seen = 0;
        /** This hop's own refusal of the body (over the limit), whatever undici makes of it. */
        let tooLarge: SpaceError | undefined;
        const counter = new Transform({
          transform(chunk: Buffer, _enc, cb) {
            seen += chunk.length;
            if (seen > limit) {
              tooLarge = new SpaceError('BODY_TOO_LARGE', `uploads are limited to ${limit} bytes`);
              cb(tooLarge);
            } else cb(null, chunk);
          },
        });
        const abort = new AbortController();
        const upload = sb.guest.writeFile(req.query.path, counter, { signal: abort.signal, metadata });
        upload.catch(() => {});
        // piped, not pipeline(): a refusal must not destroy the request (and the socket its answer
        // goes out on); the error handler reads and drops the rest of the body (answerBeforeBody)
        src.pipe(counter);
        // the guest may refuse before the body ended (a platform path, a directory, a full disk):
        // its answer ends the wait at once, with its own code
        const first = await Promise.race([
          upload.then(
            () => ({ refused: false as const }),
            (err: unknown) => ({ refused: true as const, err }),
          ),
          finished(src as Readable).then(
            () => ({ refused: false as const }),
            () => ({ refused: true as const, err: undefined }),
          ),
        ]);
        if (first.refused) {
          src.unpipe(counter);
          abort.abort(); // the guest drops its temp file; the previous file stays as it was
          await upload.catch(() => {});
          if (tooLarge) throw tooLarge;
          if (first.err instanceof SpaceError) throw first.err;
          throw new SpaceError('BAD_REQUEST', 'upload was interrupted');
        }
        try {
          return reply.status(200).send(await upload);
        } catch (err) {
          throw tooLarge ?? err;
        }
      },
    });

    app.route({
      ...declared('fs.stat'),
      schema: { params: SandboxParams, querystring: PathQuery },
      handler: async (req) => {
        const sb = gate.sandbox(req);
        return sb.guest.stat(req.query.path);
      },
    });

    app.route({
      ...declared('fs.list'),
      schema: { params: SandboxParams, querystring: PathQuery },
      handler: async (req) => {
        const sb = gate.sandbox(req);
        return sb.guest.list(req.query.path);
      },
    });

    app.route({
      ...declared('fs.mkdir'),
      schema: {
        params: SandboxParams,
        querystring: Type.Object(TokenQuery),
        body: Type.Object(
          { path: Type.String({ minLength: 1, maxLength: 4096 }), parents: Type.Optional(Type.Boolean()) },
          { additionalProperties: false },
        ),
      },
      handler: async (req) => {
        const sb = gate.sandbox(req);
        return sb.guest.mkdir(req.body.path, req.body.parents ?? false);
      },
    });

    app.route({
      ...declared('fs.rename'),
      schema: {
        params: SandboxParams,
        querystring: Type.Object(TokenQuery),
        body: Type.Object(
          {
            from: Type.String({ minLength: 1, maxLength: 4096 }),
            to: Type.String({ minLength: 1, maxLength: 4096 }),
          },
          { additionalProperties: false },
        ),
      },
      handler: async (req) => {
        const sb = gate.sandbox(req);
        return sb.guest.rename(req.body.from, req.body.to);
      },
    });

    app.route({
      ...declared('fs.watch'),
      schema: {
        params: SandboxParams,
        querystring: WatchQuery,
      },
      handler: async (req, reply) => {
        // a watch lasts as long as its client: it must not hold the guest against a pause
        const sb = gate.sandbox(req);
        // a watch is an open stream like a command's: it counts against the same limits
        const closeTeamStream = await admitStream(req, sb);
        const abort = new AbortController();
        reply.raw.once('close', () => abort.abort());
        // a delete or hibernation cuts it (the guest connection waits for nothing)
        sb.guestStreams.add(abort);
        abort.signal.addEventListener('abort', () => sb.guestStreams.delete(abort), { once: true });
        let body: Awaited<ReturnType<typeof sb.guest.watch>>;
        try {
          body = await sb.guest.watch(
            req.query.path,
            {
              recursive: req.query.recursive ?? false,
              entries: req.query.entries ?? false,
              networkMounts: req.query.networkMounts ?? false,
            },
            abort.signal,
          );
        } catch (err) {
          closeTeamStream();
          throw err;
        }
        sb.streams += 1;
        reply.hijack();
        reply.raw.writeHead(200, { 'content-type': 'application/x-ndjson', 'cache-control': 'no-store' });
        reply.raw.flushHeaders();
        try {
          await pipeline(body, reply.raw);
        } catch {
          reply.raw.destroy();
        } finally {
          sb.streams -= 1;
          closeTeamStream();
        }
      },
    });

    app.route({
      ...declared('fs.remove'),
      schema: {
        params: SandboxParams,
        querystring: PathRecursiveQuery,
      },
      handler: async (req, reply) => {
        const sb = gate.sandbox(req);
        await sb.guest.remove(req.query.path, req.query.recursive ?? false);
        return reply.status(204).send();
      },
    });
  };
}
