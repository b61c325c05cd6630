/**
 * The agent's client for its node's egress gateway (control API on a Unix socket; see
 * runtime/gateway/DESIGN.md). The agent registers each sandbox's source address with its egress
 * policy and credential grants, and forgets it when the sandbox ends.
 *
 * Registrations are sent in batches (`PUT /v1/sandboxes`): one waits at most for the batch in
 * flight, then goes with every other that came meanwhile, so a burst of warm claims costs the agent
 * and the gateway a few control calls, not one each. With one call per registration, a wave of 32
 * warm claims on a 2-vCPU host (`space up --warm 32`, 2026-12-05) cost the gateway 20–30 ms of CPU
 * and the agent ~15 ms of its ~60 ms (against a build that skipped registering), of the machine's
 * ~250 ms per wave.
 */
import { Pool } from 'undici';
import type { CredentialGrant } from '../../core/credentials.ts';
import type { EgressPolicy } from '../../core/egress.ts';
import { errorFromBody, SpaceError } from '../../core/errors.ts';

/** Timeout of one control call, ms. */
const CALL_TIMEOUT_MS = 10_000;

/**
 * Connections to the control socket. One connection serialised every registration: with 32 warm
 * claims at once, each waited for the others' round trips (the bench's `agent.egress.apply` span
 * held most of a ~600 ms warm create at C=32).
 */
const CONTROL_CONNECTIONS = 16;

/** Most registrations in one batch (the gateway takes up to 256: MAX_BATCH_REGISTRATIONS). */
const BATCH_MAX_ENTRIES = 128;

/**
 * Most bytes of registrations in one batch, under the gateway's 1 MiB body limit; a registration
 * larger than this goes alone, as it would without batching.
 */
const BATCH_MAX_BYTES = 512 * 1024;

/** What the gateway holds for one sandbox: the body of `PUT /v1/sandboxes/:address`. */
export interface Registration {
  sandboxId: string;
  policy: EgressPolicy;
  credentials: CredentialGrant[];
}

/** What a caller of {@link GatewayClient.register} sends and waits for. */
interface QueuedRegistration {
  address: string;
  registration: Registration;
  /** The batch entry (`{ address, ...registration }`), serialised. */
  entry: string;
  resolve(answer: { registryId: string | undefined }): void;
  reject(err: unknown): void;
}

export class GatewayClient {
  readonly #client: Pool;
  readonly socketPath: string;
  /** Registrations waiting for the batch in flight (or for the next turn of the event loop). */
  #queue: QueuedRegistration[] = [];
  /** Whether a batch is in flight or about to be sent. */
  #draining = false;
  /**
   * Undefined while batches are sent. Once a gateway answered that it has no batch route (one older
   * than it): the id of that gateway's registry ('' for a gateway too old to have one), or null
   * until the next answer says. An answer from another registry (the gateway restarted, perhaps
   * upgraded) turns batches on again. A restart between the refusal and that answer records the
   * new gateway as the one that refused: single calls until its next restart, as before batching.
   */
  #batchesRefusedBy: string | null | undefined = undefined;

  constructor(socketPath: string) {
    this.socketPath = socketPath;
    this.#client = new Pool('http://gateway', {
      socketPath,
      connections: CONTROL_CONNECTIONS,
      connect: { timeout: 3_000 },
    });
  }

  /** One control call; the parsed JSON answer (undefined for an empty or non-JSON body). */
  async #call(method: 'GET' | 'PUT' | 'DELETE', path: string, json?: string): Promise<unknown> {
    let res: Awaited<ReturnType<Pool['request']>>;
    try {
      res = await this.#client.request({
        method,
        path,
        headers: json !== undefined ? { 'content-type': 'application/json' } : {},
        body: json,
        headersTimeout: CALL_TIMEOUT_MS,
        bodyTimeout: CALL_TIMEOUT_MS,
      });
    } catch (err) {
      throw new SpaceError(
        'DRIVER_FAILED',
        `egress gateway at ${this.socketPath} did not answer`,
        undefined,
        {
          cause: err,
        },
      );
    }
    const text = await res.body.text();
    let parsed: unknown;
    try {
      parsed = text === '' ? undefined : JSON.parse(text);
    } catch {
      parsed = undefined;
    }
    if (res.statusCode >= 400) throw errorFromBody(res.statusCode, parsed, 'DRIVER_FAILED');
    return parsed;
  }

  /**
   * Registers (or replaces) what the sandbox at `address` may reach. Resolves to the id of the
   * gateway's registry that took it (undefined from a gateway older than `registryId`).
   * @throws SpaceError DRIVER_FAILED when the gateway does not answer, or its error when it refuses.
   */
  register(address: string, r: Registration): Promise<{ registryId: string | undefined }> {
    return new Promise((resolve, reject) => {
      const entry = JSON.stringify({ address, ...r });
      this.#queue.push({ address, registration: r, entry, resolve, reject });
      if (this.#draining) return; // goes with the next batch, once the one in flight is answered
      this.#draining = true;
      // the rest of this turn's registrations (a burst's other claims) go in the same batch
      setImmediate(() => void this.#drain());
    });
  }

  /** Sends the queued registrations, batch after batch, until none is left. Never throws. */
  async #drain(): Promise<void> {
    try {
      while (this.#queue.length > 0) {
        const batch = this.#take();
        if (this.#batchesRefusedBy === undefined && batch.length > 1) await this.#sendBatch(batch);
        else await this.#sendEach(batch);
      }
    } finally {
      this.#draining = false;
    }
  }

  /** The next batch off the queue: in order, within BATCH_MAX_ENTRIES and BATCH_MAX_BYTES. */
  #take(): QueuedRegistration[] {
    let n = 0;
    let bytes = 0;
    while (n < this.#queue.length && n < BATCH_MAX_ENTRIES) {
      bytes += Buffer.byteLength(this.#queue[n]!.entry) + 1;
      if (n > 0 && bytes > BATCH_MAX_BYTES) break;
      n++;
    }
    return this.#queue.splice(0, n);
  }

  /**
   * Each registration through the single route: those of one address one after the other, in
   * order (the last sent is the gateway's last word), the addresses at once. Never throws.
   */
  async #sendEach(batch: QueuedRegistration[]): Promise<void> {
    const byAddress = Map.groupBy(batch, (q) => q.address);
    await Promise.all(
      [...byAddress.values()].map(async (same) => {
        for (const q of same) await this.#sendOne(q);
      }),
    );
  }

  /** One registration through the single route; settles its caller. Never throws. */
  async #sendOne(q: QueuedRegistration): Promise<void> {
    try {
      const answer = await this.#call('PUT', `/v1/sandboxes/${q.address}`, JSON.stringify(q.registration));
      q.resolve({ registryId: this.#saw(registryIdOf(answer)) });
    } catch (err) {
      q.reject(err);
    }
  }

  /**
   * A batch through `PUT /v1/sandboxes`; settles each caller with its own result. A batch the
   * gateway refuses whole (a body that fails its schema or limit, or no such route on an older
   * gateway) is sent again one by one, so one bad registration fails alone. Never throws.
   */
  async #sendBatch(batch: QueuedRegistration[]): Promise<void> {
    let answer: unknown;
    try {
      answer = await this.#call(
        'PUT',
        '/v1/sandboxes',
        `{"registrations":[${batch.map((q) => q.entry).join(',')}]}`,
      );
    } catch (err) {
      if (err instanceof SpaceError && [400, 404, 413].includes(err.status)) {
        if (err.code === 'NOT_FOUND') this.#batchesRefusedBy = null;
        await this.#sendEach(batch);
      } else {
        for (const q of batch) q.reject(err);
      }
      return;
    }
    const results = (answer as { results?: unknown } | undefined)?.results;
    if (!Array.isArray(results) || results.length !== batch.length) {
      const err = new SpaceError(
        'DRIVER_FAILED',
        `egress gateway at ${this.socketPath} answered a batch of ${batch.length} registrations without their results`,
      );
      for (const q of batch) q.reject(err);
      return;
    }
    const registryId = registryIdOf(answer);
    batch.forEach((q, i) => {
      const r = results[i] as { error?: unknown } | undefined;
      if (r?.error !== undefined) q.reject(errorFromBody(400, r, 'BAD_REQUEST'));
      else q.resolve({ registryId });
    });
  }

  /**
   * The id of the gateway's registry now (its `/healthz`): a new one means the gateway restarted
   * and holds no registration. Undefined from a gateway older than `registryId`.
   * @throws SpaceError DRIVER_FAILED when the gateway does not answer.
   */
  async registryId(): Promise<string | undefined> {
    return this.#saw(registryIdOf(await this.#call('GET', '/healthz')));
  }

  /**
   * Notes the registry id a gateway answered with (undefined: a gateway without one); while
   * batches are off, another registry than the one that refused them (or a first id after none)
   * turns them on. Returns `id`.
   */
  #saw(id: string | undefined): string | undefined {
    if (this.#batchesRefusedBy === undefined) return id;
    if (this.#batchesRefusedBy === null) this.#batchesRefusedBy = id ?? '';
    else if (this.#batchesRefusedBy !== (id ?? '')) this.#batchesRefusedBy = undefined;
    return id;
  }

  /** Forgets the sandbox at `address` and closes its connections. Idempotent. */
  async unregister(address: string): Promise<void> {
    try {
      await this.#call('DELETE', `/v1/sandboxes/${address}`);
    } catch (err) {
      if (err instanceof SpaceError && err.status === 404) return;
      throw err;
    }
  }

  async close(): Promise<void> {
    await this.#client.close().catch(() => {});
  }
}

/** The `registryId` string field of a control answer, if there is one. */
function registryIdOf(body: unknown): string | undefined {
  const id = (body as { registryId?: unknown } | undefined)?.registryId;
  return typeof id === 'string' && id !== '' ? id : undefined;
}
