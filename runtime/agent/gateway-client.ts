/**
 * The agent's client for its node's egress gateway (control API on a Unix socket; see
 * runtime/gateway/DESIGN.md). The agent registers each sandbox's source address with its egress
 * policy and credential grants, and forgets it when the sandbox ends.
 */
import { Pool } from 'undici';
import type { CredentialGrant } from '../core/credentials.ts';
import type { EgressPolicy } from '../core/egress.ts';
import { errorFromBody, SpaceError } from '../core/errors.ts';

/** Timeout of one control call, ms. */
const CALL_TIMEOUT_MS = 10_000;

/**
 * Connections to the control socket. One connection serialised every registration: with 32 warm
 * claims at once, each waited for the others' round trips (the bench's `agent.egress.apply` span
 * held most of a ~600 ms warm create at C=32).
 */
const CONTROL_CONNECTIONS = 16;

export class GatewayClient {
  readonly #client: Pool;
  readonly socketPath: string;

  constructor(socketPath: string) {
    this.socketPath = socketPath;
    this.#client = new Pool('http://gateway', {
      socketPath,
      connections: CONTROL_CONNECTIONS,
      connect: { timeout: 3_000 },
    });
  }

  /** One control call; the parsed JSON answer (undefined for an empty or non-JSON body). */
  async #call(method: 'GET' | 'PUT' | 'DELETE', path: string, body?: unknown): Promise<unknown> {
    let res: Awaited<ReturnType<Pool['request']>>;
    try {
      res = await this.#client.request({
        method,
        path,
        headers: body ? { 'content-type': 'application/json' } : {},
        body: body ? JSON.stringify(body) : undefined,
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
  async register(
    address: string,
    r: { sandboxId: string; policy: EgressPolicy; credentials: CredentialGrant[] },
  ): Promise<{ registryId: string | undefined }> {
    return { registryId: registryIdOf(await this.#call('PUT', `/v1/sandboxes/${address}`, r)) };
  }

  /**
   * The id of the gateway's registry now (its `/healthz`): a new one means the gateway restarted
   * and holds no registration. Undefined from a gateway older than `registryId`.
   * @throws SpaceError DRIVER_FAILED when the gateway does not answer.
   */
  async registryId(): Promise<string | undefined> {
    return registryIdOf(await this.#call('GET', '/healthz'));
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
