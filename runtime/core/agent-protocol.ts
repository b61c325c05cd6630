/**
 * The API ↔ agent dispatch contract, declared once and used by both ends: the API's client
 * (`api/agent-client.ts`) types its bodies from these schemas and the agent's internal routes
 * (`agent/routes/internal.ts`) validate with them.
 *
 * Transport: HTTP/1.1 JSON to the agent's internal routes, each call carrying a dispatch token
 * (EdDSA JWS for that node, `core/tokens.ts`). Errors use the core error body.
 *
 * | method | path | body → answer |
 * |---|---|---|
 * | POST | /internal/v1/sandboxes | {@link AgentCreateRequest} → {@link AgentCreateResponse} (idempotent per sandbox id) |
 * | DELETE | /internal/v1/sandboxes/:id | → 204 (idempotent; a late create is refused afterwards) |
 * | PUT | /internal/v1/sandboxes/:id/egress | EgressPolicy → 204 |
 * | POST | /internal/v1/sandboxes/:id/commands | {@link AgentCommandRequest} → 201 {@link AgentCommandResponse} |
 * | GET | /internal/v1/sandboxes | → `{ sandboxes: AgentSandboxSummary[] }` |
 * | POST | /internal/v1/sandboxes/:id/pause | {@link AgentPauseRequest} → {@link AgentPauseResponse} (idempotent) |
 * | POST | /internal/v1/sandboxes/:id/resume | {@link AgentResumeRequest} → {@link AgentResumeResponse} (idempotent) |
 *
 * Mixed versions (one release apart) must interoperate, so changes are additive: a new field is
 * optional, and an agent ignores fields it does not know (request objects here allow additional
 * properties; the agent never reads them). Removing or re-typing a field takes two releases.
 */
import { type Static, Type } from '@sinclair/typebox';
import { CredentialGrantSchema } from './credentials.ts';
import { EgressPolicySchema } from './egress.ts';
import { ID_PATTERN } from './ids.ts';
import { stringEnum } from './json-schema.ts';

/** Version of this contract, sent by agents in their registration. */
export const AGENT_PROTOCOL_VERSION = 3;

/** Environment variables: POSIX names to strings. */
export const EnvVarsSchema = Type.Record(
  Type.String({ pattern: '^[A-Za-z_][A-Za-z0-9_]*$' }),
  Type.String(),
  {
    additionalProperties: false,
  },
);

/** Platform ids (`sbx…` and older `sbx_…`, `ses_…`, `cmd_…`). */
export const PlatformIdSchema = Type.String({ pattern: ID_PATTERN });

/** Body of POST /internal/v1/sandboxes. */
export const AgentCreateRequestSchema = Type.Object({
  sandboxId: PlatformIdSchema,
  sessionId: PlatformIdSchema,
  template: Type.String({ pattern: '^[a-z0-9][a-z0-9-]{0,62}$' }),
  /** vCPUs; the node's driver may refuse a shape it cannot run (SHAPE_UNSUPPORTED). */
  vcpus: Type.Number({ minimum: 0.25 }),
  /** MiB. */
  memoryMiB: Type.Integer({ minimum: 128 }),
  env: EnvVarsSchema,
  /** Epoch ms; the agent's backstop for the lifetime. */
  expiresAtMs: Type.Integer(),
  egress: EgressPolicySchema,
  /** Credentials with their values, for the node's gateway only. */
  credentials: Type.Array(CredentialGrantSchema, { maxItems: 32 }),
});
export type AgentCreateRequest = Static<typeof AgentCreateRequestSchema>;

/** Answer of POST /internal/v1/sandboxes. */
export const AgentCreateResponseSchema = Type.Object({
  instanceId: Type.String(),
  /** How the instance came to be: a warm-pool claim, a snapshot restore or a cold boot. */
  fromWarmPool: Type.Boolean(),
  source: Type.Optional(stringEnum(['warm', 'snapshot', 'boot'] as const)),
});
export type AgentCreateResponse = Static<typeof AgentCreateResponseSchema>;

/** A terminal size in characters (1–1000 each way). */
export const PtySizeSchema = Type.Object({
  cols: Type.Integer({ minimum: 1, maximum: 1000 }),
  rows: Type.Integer({ minimum: 1, maximum: 1000 }),
});
export type PtySize = Static<typeof PtySizeSchema>;

/** Body of POST /internal/v1/sandboxes/:id/commands. */
export const AgentCommandRequestSchema = Type.Object({
  commandId: PlatformIdSchema,
  cmd: Type.String({ minLength: 1 }),
  args: Type.Array(Type.String()),
  shell: Type.Boolean(),
  env: EnvVarsSchema,
  cwd: Type.Optional(Type.String()),
  user: stringEnum(['user', 'root'] as const),
  /** `true`: keep stdin open; a string: write it then close; absent/false: /dev/null. */
  stdin: Type.Optional(Type.Union([Type.Boolean(), Type.String()])),
  /** ms. */
  timeoutMs: Type.Optional(Type.Integer({ minimum: 1 })),
  /** The caller's own name for the command (E2B's process tag), listed back with it. */
  tag: Type.Optional(Type.String({ maxLength: 256 })),
  /**
   * Run on a pseudo-terminal of this size: stdout carries the terminal's output, stdin (always
   * open) is its input, stderr only the guest's own complaints (e.g. no python3 in the template).
   */
  pty: Type.Optional(PtySizeSchema),
});
export type AgentCommandRequest = Static<typeof AgentCommandRequestSchema>;

/** Answer of POST /internal/v1/sandboxes/:id/commands. */
export const AgentCommandResponseSchema = Type.Object({ commandId: Type.String(), pid: Type.Integer() });
export type AgentCommandResponse = Static<typeof AgentCommandResponseSchema>;

/** One row of GET /internal/v1/sandboxes. */
export const AgentSandboxSummarySchema = Type.Object({
  id: Type.String(),
  instanceId: Type.String(),
  template: Type.String(),
  commands: Type.Integer(),
});
export type AgentSandboxSummary = Static<typeof AgentSandboxSummarySchema>;

/** Body of POST /internal/v1/sandboxes/:id/pause. */
export const AgentPauseRequestSchema = Type.Object({
  /**
   * `frozen`: the driver freezes the instance in memory. `hibernated`: the agent snapshots it into
   * its hibernation store (with the sandbox's command spools), destroys the instance and forgets
   * the sandbox; any node reading the same store can resume it.
   */
  mode: stringEnum(['frozen', 'hibernated'] as const),
});
export type AgentPauseRequest = Static<typeof AgentPauseRequestSchema>;

/** Answer of POST /internal/v1/sandboxes/:id/pause. */
export const AgentPauseResponseSchema = Type.Object({
  mode: stringEnum(['frozen', 'hibernated'] as const),
  /** Hibernated: the snapshot's folder in the node's hibernation store (`store`). */
  hibernation: Type.Optional(Type.Object({ store: Type.String(), path: Type.String() })),
  /**
   * How long ago (ms, by the node's clock) the instance stopped running for this pause, also when
   * the answer repeats an earlier one: the API meters the sandbox paused from then (absent from
   * agents before it was sent: from the answer).
   */
  pausedForMs: Type.Optional(Type.Number({ minimum: 0 })),
});
export type AgentPauseResponse = Static<typeof AgentPauseResponseSchema>;

/**
 * Body of POST /internal/v1/sandboxes/:id/resume. Empty for a frozen sandbox (the node that froze
 * it thaws it). For a hibernated one, everything a create carries plus where its snapshot is: the
 * node restores it as a new instance, so the API may place it on any node of the same store.
 */
export const AgentResumeRequestSchema = Type.Object({
  restore: Type.Optional(
    Type.Intersect([
      AgentCreateRequestSchema,
      Type.Object({ hibernation: Type.Object({ store: Type.String(), path: Type.String() }) }),
    ]),
  ),
});
export type AgentResumeRequest = Static<typeof AgentResumeRequestSchema>;

/** Answer of POST /internal/v1/sandboxes/:id/resume. */
export const AgentResumeResponseSchema = Type.Object({
  instanceId: Type.String(),
  /** `thawed`: a frozen instance resumed; `restored`: a hibernated one restored from its snapshot. */
  how: stringEnum(['thawed', 'restored'] as const),
  /** How long ago (ms, by the node's clock) the instance ran again, when the node knows. */
  runningForMs: Type.Optional(Type.Number({ minimum: 0 })),
});
export type AgentResumeResponse = Static<typeof AgentResumeResponseSchema>;

/** Route patterns of the internal routes (the agent registers these; `:id` is a sandbox id). */
export const AGENT_ROUTES = {
  sandboxes: '/internal/v1/sandboxes',
  sandbox: '/internal/v1/sandboxes/:id',
  egress: '/internal/v1/sandboxes/:id/egress',
  commands: '/internal/v1/sandboxes/:id/commands',
  pause: '/internal/v1/sandboxes/:id/pause',
  resume: '/internal/v1/sandboxes/:id/resume',
} as const;

/** The path of `route` for sandbox `id` (the API's client builds URLs with this). Pure. */
export function agentPath(route: (typeof AGENT_ROUTES)[keyof typeof AGENT_ROUTES], id = ''): string {
  return route.replace(':id', encodeURIComponent(id));
}
