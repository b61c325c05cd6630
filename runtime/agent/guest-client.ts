/**
 * The agent's client for one sandbox's guest daemon (protocol: core/guest-protocol.ts), over
 * HTTP/1.1 on TCP. Guest errors come back as the same coded SpaceError; transport failures as
 * GUEST_UNAVAILABLE.
 */
import type { Readable } from 'node:stream';
import { type Dispatcher, Pool } from 'undici';
import { errorFromBody, SpaceError } from '../core/errors.ts';
import {
  FILE_METADATA_HEADER,
  type FileStat,
  type GuestHealth,
  METADATA_PROTOCOL,
  OOM_KILL_PROTOCOL,
  type OomKillResult,
  type ProcessInfo,
  type ProcessStartRequest,
  type WatchEvent,
} from '../core/guest-protocol.ts';
import type { GuestEndpoint } from './drivers/driver.ts';

/** Timeout of a control call to the guest (not of streams), ms. */
export const GUEST_CALL_TIMEOUT_MS = 15_000;

export class GuestClient {
  readonly #pool: Pool;
  readonly endpoint: GuestEndpoint;
  /**
   * Set by {@link holdUntil} (and {@link initInBackground}) until every step it was given is done:
   * every call to the guest waits for it, and fails for good with the step's error when one failed.
   */
  #settling: Promise<void> | null = null;
  /** The guest's protocol version (core/guest-protocol.ts), asked once: it never changes. */
  #protocol: Promise<number> | null = null;

  constructor(endpoint: GuestEndpoint) {
    this.endpoint = endpoint;
    this.#pool = new Pool(`http://${endpoint.host}:${endpoint.port}`, {
      connections: 64,
      keepAliveTimeout: 10_000,
      connectTimeout: 5_000,
    });
  }

  /** Raw request; throws GUEST_UNAVAILABLE on transport errors, the guest's coded error on ≥ 400. */
  async request(
    opts: Omit<Dispatcher.RequestOptions, 'origin'> & { expect?: 'stream' },
  ): Promise<Dispatcher.ResponseData> {
    if (this.#settling) await this.#settling;
    return this.#request(opts);
  }

  async #request(
    opts: Omit<Dispatcher.RequestOptions, 'origin'> & { expect?: 'stream' },
  ): Promise<Dispatcher.ResponseData> {
    let res: Dispatcher.ResponseData;
    const { expect, ...rest } = opts;
    try {
      res = await this.#pool.request({
        headersTimeout: GUEST_CALL_TIMEOUT_MS,
        bodyTimeout: expect === 'stream' ? 0 : GUEST_CALL_TIMEOUT_MS,
        ...rest,
        headers: {
          ...(opts.headers as Record<string, string> | undefined),
          authorization: `Bearer ${this.endpoint.token}`,
        },
      });
    } catch (err) {
      if (err instanceof SpaceError) throw err;
      throw new SpaceError(
        'GUEST_UNAVAILABLE',
        `guest did not answer: ${(err as Error).message}`,
        undefined,
        {
          cause: err,
        },
      );
    }
    if (res.statusCode >= 400) {
      const text = await res.body.text().catch(() => '');
      let body: unknown;
      try {
        body = JSON.parse(text);
      } catch {
        body = undefined;
      }
      throw errorFromBody(res.statusCode, body, 'GUEST_UNAVAILABLE');
    }
    return res;
  }

  async #json<T>(
    method: Dispatcher.HttpMethod,
    path: string,
    body?: unknown,
    o: { ungated?: boolean } = {},
  ): Promise<T> {
    const res = await (o.ungated ? this.#request.bind(this) : this.request.bind(this))({
      method,
      path,
      headers: body === undefined ? {} : { 'content-type': 'application/json' },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await res.body.text();
    return (text ? JSON.parse(text) : undefined) as T;
  }

  health(): Promise<GuestHealth> {
    return this.#json('GET', '/health');
  }

  /**
   * Checks that the guest speaks at least protocol `version` before asking it for `what`.
   * @throws SpaceError BAD_REQUEST when it is older (a sandbox made before an upgrade), instead of
   *   letting the older daemon ignore what it does not know.
   */
  async requireProtocol(version: number, what: string): Promise<void> {
    this.#protocol ??= this.health().then((h) => Number.parseInt(h.version, 10) || 0);
    const had = await this.#protocol.catch((err: unknown) => {
      this.#protocol = null;
      throw err;
    });
    if (had < version) {
      throw new SpaceError(
        'BAD_REQUEST',
        `this sandbox's guest daemon speaks protocol ${had}; ${what} needs ${version}: ` +
          'sandboxes created since the upgrade have it',
      );
    }
  }
  /**
   * Asks the guest to kill the process holding the most memory (agent/sandboxes/memory-guard.ts).
   * @returns what it killed (null: nothing but its daemon was left).
   * @throws SpaceError BAD_REQUEST from a guest older than protocol {@link OOM_KILL_PROTOCOL}.
   */
  async oomKill(): Promise<OomKillResult> {
    await this.requireProtocol(OOM_KILL_PROTOCOL, 'an out-of-memory kill');
    return this.#json('POST', '/oom-kill');
  }

  /**
   * Replaces the guest's secret with `token` (authorised by the current one); later calls through
   * this client fail until a new client is made with the new token.
   */
  rotateToken(token: string): Promise<void> {
    return this.#json('POST', '/token', { token });
  }

  /** Gives the guest the sandbox-wide env (POST /init) and waits for its answer. */
  init(env: Record<string, string>): Promise<void> {
    return this.#json('POST', '/init', { env });
  }

  /**
   * Gives the guest the sandbox-wide env (POST /init) without holding the caller up: every later
   * call through this client waits until the guest answered, so no command ever starts without its
   * env. When the guest refuses or does not answer, those calls fail with GUEST_UNAVAILABLE naming
   * why, and so do all later ones (the caller ends the sandbox: see the returned promise).
   * @returns the init's own outcome (rejects with the guest's error).
   */
  initInBackground(env: Record<string, string>): Promise<void> {
    const sent = this.#json<void>('POST', '/init', { env }, { ungated: true });
    this.holdUntil(
      sent,
      (err) =>
        new SpaceError(
          'GUEST_UNAVAILABLE',
          `the guest did not take the sandbox's settings: ${(err as Error).message}`,
          undefined,
          { cause: err },
        ),
    );
    return sent;
  }

  /**
   * Holds every call through this client (but not `step` itself) until `step` is done: a host-side
   * step of a claim that must be in force before anything runs in the sandbox (its env, its egress
   * policy) but that the create does not wait for. Steps held at once are all waited for. When a
   * step fails, every held and later call fails with `failure(err)`, for good: the caller ends the
   * sandbox.
   */
  holdUntil(step: Promise<unknown>, failure: (err: unknown) => SpaceError): void {
    const before = this.#settling;
    const settling: Promise<void> = Promise.all([
      before,
      step.then(
        () => {},
        (err: unknown) => {
          throw failure(err);
        },
      ),
    ]).then(() => {
      if (this.#settling === settling) this.#settling = null;
    });
    settling.catch(() => {}); // seen by the calls that wait on it, not unhandled meanwhile
    this.#settling = settling;
  }

  /** Resolves once no step held by {@link holdUntil} is pending (whatever its outcome). */
  async settled(): Promise<void> {
    await this.#settling?.catch(() => {});
  }
  start(req: ProcessStartRequest): Promise<ProcessInfo> {
    return this.#json('POST', '/processes', req);
  }
  process(pid: number): Promise<ProcessInfo> {
    return this.#json('GET', `/processes/${pid}`);
  }
  /** The output frame stream from byte `offset` (no body timeout: commands may run for hours). */
  async output(pid: number, offset: number, signal?: AbortSignal): Promise<Readable> {
    const res = await this.request({
      method: 'GET',
      path: `/processes/${pid}/output?offset=${offset}`,
      expect: 'stream',
      signal,
    });
    return res.body;
  }
  async writeStdin(pid: number, data: Buffer | Readable): Promise<void> {
    const res = await this.request({ method: 'POST', path: `/processes/${pid}/stdin`, body: data });
    await res.body.dump();
  }
  async closeStdin(pid: number): Promise<void> {
    await this.#json('POST', `/processes/${pid}/stdin/close`);
  }
  /** Sets a PTY process's terminal size (characters). */
  async resize(pid: number, cols: number, rows: number): Promise<void> {
    await this.#json('POST', `/processes/${pid}/resize`, { cols, rows });
  }
  async signal(pid: number, signal: string): Promise<void> {
    await this.#json('POST', `/processes/${pid}/signal`, { signal });
  }
  stat(path: string): Promise<FileStat> {
    return this.#json('GET', `/fs/stat?path=${encodeURIComponent(path)}`);
  }
  list(path: string): Promise<{ entries: FileStat[] }> {
    return this.#json('GET', `/fs/list?path=${encodeURIComponent(path)}`);
  }
  mkdir(path: string, parents: boolean): Promise<FileStat> {
    return this.#json('POST', '/fs/mkdir', { path, parents });
  }
  rename(from: string, to: string): Promise<FileStat> {
    return this.#json('POST', '/fs/rename', { from, to });
  }
  /**
   * A directory watch: NDJSON {@link WatchEvent} lines, `start` first (no body timeout).
   * `entries`: events carry the entry; `networkMounts`: a network file system may be watched.
   */
  async watch(
    path: string,
    o: { recursive: boolean; entries?: boolean; networkMounts?: boolean },
    signal?: AbortSignal,
  ): Promise<Readable> {
    if (o.entries) await this.requireProtocol(METADATA_PROTOCOL, 'a watch with entries');
    const flags = (['recursive', 'entries', 'networkMounts'] as const).filter((k) => o[k]);
    const res = await this.request({
      method: 'GET',
      path: `/fs/watch?path=${encodeURIComponent(path)}${flags.map((k) => `&${k}=1`).join('')}`,
      expect: 'stream',
      signal,
    });
    return res.body;
  }
  async remove(path: string, recursive: boolean): Promise<void> {
    await this.#json('DELETE', `/fs?path=${encodeURIComponent(path)}${recursive ? '&recursive=1' : ''}`);
  }
  /**
   * Streams a file out of the sandbox (symlinks followed, within the path policy).
   * @returns the body and its exact length in bytes, as the guest promised it (`Content-Length`).
   */
  async readFile(path: string, signal?: AbortSignal): Promise<{ body: Readable; size: number }> {
    const res = await this.request({
      method: 'GET',
      path: `/files?path=${encodeURIComponent(path)}`,
      expect: 'stream',
      signal,
    });
    const size = Number(res.headers['content-length']);
    if (!Number.isSafeInteger(size) || size < 0) {
      res.body.destroy();
      throw new SpaceError(
        'GUEST_UNAVAILABLE',
        'the guest answered a download without a valid Content-Length',
      );
    }
    return { body: res.body, size };
  }
  /**
   * Streams `data` into a file (atomic on the guest side); an aborted body leaves no partial file.
   * `metadata`: the new file's ({@link FILE_METADATA_HEADER}); without it the file has none.
   * @throws SpaceError BAD_REQUEST for metadata on a guest older than protocol 2, before any byte.
   */
  async writeFile(
    path: string,
    data: Readable,
    o: { signal?: AbortSignal; metadata?: Record<string, string> } = {},
  ): Promise<FileStat> {
    const { signal } = o;
    // none and `{}` are the same to the guest: the file has none
    const metadata = o.metadata && Object.keys(o.metadata).length ? o.metadata : undefined;
    if (metadata) await this.requireProtocol(METADATA_PROTOCOL, 'file metadata');
    return this.request({
      method: 'PUT',
      path: `/files?path=${encodeURIComponent(path)}`,
      body: data,
      signal,
      expect: 'stream',
      headers: {
        'content-type': 'application/octet-stream',
        ...(metadata ? { [FILE_METADATA_HEADER]: JSON.stringify(metadata) } : {}),
      },
    }).then(async (res) => JSON.parse(await res.body.text()) as FileStat);
  }

  async close(): Promise<void> {
    await this.#pool.close().catch(() => {});
  }
}
