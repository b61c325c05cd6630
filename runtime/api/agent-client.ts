/**
 * The API's client for node agents' internal routes (dispatch). Each call carries a dispatch
 * token (signed by the API, verified offline by the agent) and has a timeout; agent errors come
 * back as the same coded SpaceError, transport failures as NODE_UNAVAILABLE.
 */
import { request } from 'undici';
import {
  AGENT_ROUTES,
  type AgentCommandRequest,
  type AgentCommandResponse,
  type AgentCreateRequest,
  type AgentCreateResponse,
  type AgentPauseRequest,
  type AgentPauseResponse,
  type AgentResumeRequest,
  type AgentResumeResponse,
  agentPath,
} from '../core/agent-protocol.ts';
import type { EgressPolicy } from '../core/egress.ts';
import { errorFromBody, SpaceError } from '../core/errors.ts';
import { DISPATCH_TOKEN_TTL_SEC, mintDispatchToken, type SigningKey } from '../core/tokens.ts';
import { injectTraceHeaders, inSpan } from '../core/tracing.ts';
import type { NodeInfo } from '../core/types.ts';

export type { AgentCommandRequest, AgentCreateRequest };

/**
 * A dispatch token is reused for calls to the same node while more than this much of its
 * lifetime ({@link DISPATCH_TOKEN_TTL_SEC}) is left, ms: signing one costs ~0.2–0.5 ms of a warm
 * create's ~20 ms (EdDSA in jose, measured on this project's 2-core VM), and every call to a node
 * carries one. A reused token still has at least this long to live when it is sent.
 */
export const DISPATCH_TOKEN_REUSE_MARGIN_MS = (DISPATCH_TOKEN_TTL_SEC * 1000) / 2;

export class AgentClient {
  readonly #key: SigningKey;
  readonly #timeoutMs: number;
  /** Per node id: the token being reused and when it expires (ms since the epoch). */
  readonly #tokens = new Map<string, { token: Promise<string>; expiresAtMs: number }>();
  constructor(key: SigningKey, timeoutMs: number) {
    this.#key = key;
    this.#timeoutMs = timeoutMs;
  }

  /** A dispatch token for `nodeId` with at least {@link DISPATCH_TOKEN_REUSE_MARGIN_MS} to live. */
  dispatchToken(nodeId: string, now = Date.now()): Promise<string> {
    const cached = this.#tokens.get(nodeId);
    if (cached && cached.expiresAtMs - now > DISPATCH_TOKEN_REUSE_MARGIN_MS) return cached.token;
    // exp is whole seconds (iat floored + TTL), as mintDispatchToken writes it
    const expiresAtMs = Math.floor(now / 1000) * 1000 + DISPATCH_TOKEN_TTL_SEC * 1000;
    const token = mintDispatchToken(this.#key, nodeId, now);
    this.#tokens.set(nodeId, { token, expiresAtMs });
    token.catch(() => this.#tokens.delete(nodeId));
    return token;
  }

  async #call<T>(
    node: Pick<NodeInfo, 'id' | 'url'>,
    method: 'GET' | 'POST' | 'PUT' | 'DELETE',
    path: string,
    body?: unknown,
    signal?: AbortSignal,
  ) {
    // one span per dispatch, its context carried to the agent in `traceparent`
    return inSpan(
      'api.dispatch',
      { 'http.request.method': method, 'url.path': path, 'space.node.id': node.id },
      async () => {
        const token = await this.dispatchToken(node.id);
        let res: Awaited<ReturnType<typeof request>>;
        try {
          res = await request(new URL(path, node.url), {
            method,
            headers: {
              ...injectTraceHeaders({ authorization: `Bearer ${token}` }),
              ...(body ? { 'content-type': 'application/json' } : {}),
            },
            body: body ? JSON.stringify(body) : undefined,
            headersTimeout: this.#timeoutMs,
            bodyTimeout: this.#timeoutMs,
            signal,
          });
        } catch (err) {
          throw new SpaceError(
            'NODE_UNAVAILABLE',
            `node ${node.id} did not answer: ${(err as Error).message}`,
            {
              nodeId: node.id,
            },
          );
        }
        const text = await res.body.text();
        const json = text ? (JSON.parse(text) as unknown) : undefined;
        if (res.statusCode >= 400) throw errorFromBody(res.statusCode, json, 'NODE_UNAVAILABLE');
        return json as T;
      },
    );
  }

  /**
   * Creates (or returns the existing) instance for a sandbox; idempotent per sandbox id, so a retried
   * dispatch the node already carried out answers with the same instance. `signal` aborts the call.
   */
  createSandbox(node: Pick<NodeInfo, 'id' | 'url'>, req: AgentCreateRequest, signal?: AbortSignal) {
    return this.#call<AgentCreateResponse>(node, 'POST', AGENT_ROUTES.sandboxes, req, signal);
  }

  /**
   * Destroys a sandbox and remembers its id so a late create is refused; idempotent (a sandbox the
   * node no longer has answers 204). `signal` aborts the call.
   */
  deleteSandbox(node: Pick<NodeInfo, 'id' | 'url'>, sandboxId: string, signal?: AbortSignal) {
    return this.#call<void>(node, 'DELETE', agentPath(AGENT_ROUTES.sandbox, sandboxId), undefined, signal);
  }

  /** Replaces a sandbox's egress policy on its node (gateway + packet rules). */
  updateEgress(node: NodeInfo, sandboxId: string, egress: EgressPolicy) {
    return this.#call<void>(node, 'PUT', agentPath(AGENT_ROUTES.egress, sandboxId), egress);
  }

  /** Starts a command in the sandbox's guest; the output is then read over the data plane. */
  startCommand(node: NodeInfo, sandboxId: string, req: AgentCommandRequest) {
    return this.#call<AgentCommandResponse>(node, 'POST', agentPath(AGENT_ROUTES.commands, sandboxId), req);
  }

  /** Freezes or hibernates a sandbox on its node; idempotent (a paused sandbox answers as paused). */
  pauseSandbox(node: NodeInfo, sandboxId: string, req: AgentPauseRequest) {
    return this.#call<AgentPauseResponse>(node, 'POST', agentPath(AGENT_ROUTES.pause, sandboxId), req);
  }

  /**
   * Thaws a frozen sandbox on its node, or restores a hibernated one there (`req.restore`);
   * idempotent (a running sandbox answers as resumed).
   */
  resumeSandbox(node: NodeInfo, sandboxId: string, req: AgentResumeRequest) {
    return this.#call<AgentResumeResponse>(node, 'POST', agentPath(AGENT_ROUTES.resume, sandboxId), req);
  }
}
