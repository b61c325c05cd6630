/** TypeBox schemas of the public API v1 (the OpenAPI document is generated from these). */
import { type Static, Type } from '@sinclair/typebox';
import { EgressPolicySchema } from './egress.ts';
import { ID_PATTERN } from './ids.ts';
import { nullable, stringEnum } from './json-schema.ts';
import {
  KILL_REASONS,
  ON_TIMEOUT,
  OPERATION_KINDS,
  OPERATION_STATES,
  PAUSE_MODES,
  PAUSE_REASONS,
  SANDBOX_STATES,
} from './types.ts';
import { USAGE_STATES } from './usage.ts';

/** Limits on client input (documented in the README). */
export const LIMITS = {
  metadataKeys: 32,
  metadataValueBytes: 256,
  envKeys: 128,
  envValueBytes: 32 * 1024,
  argBytes: 128 * 1024,
  args: 1024,
  stdinBytes: 512 * 1024,
  maxCommandTimeoutMs: 24 * 3600 * 1000,
} as const;

export const ErrorSchema = Type.Object(
  {
    error: Type.Object({
      code: Type.String(),
      message: Type.String(),
      details: Type.Optional(Type.Record(Type.String(), Type.Unknown())),
    }),
  },
  { $id: 'Error' },
);

export const IdParams = Type.Object({ id: Type.String({ pattern: ID_PATTERN }) });

// Record keys are patterns (patternProperties); `additionalProperties: false` makes a key that
// does not match an error instead of an unchecked extra property.
const Metadata = Type.Record(
  Type.String({ pattern: '^[^\\u0000-\\u001f]{1,64}$' }),
  Type.String({ maxLength: LIMITS.metadataValueBytes }),
  { maxProperties: LIMITS.metadataKeys, additionalProperties: false },
);
const EnvVars = Type.Record(
  Type.String({ pattern: '^[A-Za-z_][A-Za-z0-9_]{0,127}$' }),
  Type.String({ maxLength: LIMITS.envValueBytes }),
  { maxProperties: LIMITS.envKeys, additionalProperties: false },
);

/** Credential names: lower-case letters, digits, `-`, `_`. */
export const CREDENTIAL_NAME = '^[a-z0-9][a-z0-9_-]{0,63}$';

export const CredentialBody = Type.Object(
  {
    domains: Type.Array(Type.String({ minLength: 1, maxLength: 255 }), { minItems: 1, maxItems: 64 }),
    header: Type.Optional(Type.String({ minLength: 1, maxLength: 128 })),
    format: Type.Optional(
      Type.String({ minLength: 7, maxLength: 1024, description: 'Contains `{value}` once.' }),
    ),
    envVar: Type.Optional(Type.String({ pattern: '^[A-Za-z_][A-Za-z0-9_]{0,127}$' })),
    value: Type.String({ minLength: 1, maxLength: 16_384, description: 'Write-only.' }),
    methods: Type.Optional(
      Type.Array(Type.String({ minLength: 1, maxLength: 32 }), {
        maxItems: 16,
        uniqueItems: true,
        description: 'Only requests with these methods get the value (e.g. `["GET","POST"]`); default any.',
      }),
    ),
    paths: Type.Optional(
      Type.Array(Type.String({ minLength: 1, maxLength: 1024 }), {
        maxItems: 64,
        uniqueItems: true,
        description:
          'Only requests to these paths get the value: `/v1/models` exact, `/v1/chat/*` prefix; default any.',
      }),
    ),
  },
  { additionalProperties: false },
);

export const CredentialSchema = Type.Object({
  name: Type.String(),
  domains: Type.Array(Type.String()),
  header: Type.String(),
  format: Type.String(),
  envVar: Type.String(),
  methods: nullable(Type.Array(Type.String())),
  paths: nullable(Type.Array(Type.String())),
  createdAt: Type.String({ format: 'date-time' }),
  updatedAt: Type.String({ format: 'date-time' }),
});

export const CreateSandboxBody = Type.Object(
  {
    template: Type.String({
      pattern: '^[a-z0-9][a-z0-9-]{0,62}$',
      description: 'Template name, e.g. `base`.',
    }),
    vcpus: Type.Optional(Type.Number({ minimum: 0.25, maximum: 64, default: 1, description: 'vCPUs.' })),
    memoryMiB: Type.Optional(
      Type.Integer({ minimum: 128, maximum: 262_144, default: 512, description: 'MiB.' }),
    ),
    timeoutSec: Type.Optional(
      Type.Integer({
        minimum: 1,
        description: 'Running lifetime, s (paused time does not count); default from config.',
      }),
    ),
    autoPauseSec: Type.Optional(
      Type.Integer({
        minimum: 0,
        maximum: 7 * 86_400,
        description: 'Pause the sandbox after this many idle seconds (0: never); default from config.',
      }),
    ),
    onTimeout: Type.Optional(
      stringEnum(ON_TIMEOUT, {
        description:
          'What the end of the running lifetime does: `kill` (default) or `pause` (resume restarts the lifetime; paused time is metered as paused).',
      }),
    ),
    autoResume: Type.Optional(
      Type.Boolean({
        description:
          'Whether traffic through the router (a command, a file call, a port) resumes the sandbox when it is paused (default true); false: only a resume through the API does, and idle auto-pause is off unless autoPauseSec is given.',
      }),
    ),
    metadata: Type.Optional(Metadata),
    env: Type.Optional(EnvVars),
    egress: Type.Optional(EgressPolicySchema),
    ports: Type.Optional(
      Type.Object(
        {
          public: Type.Boolean({
            description:
              'Servers in the sandbox are reachable through the router by anyone who has the URL (`<port>-<id>.<domain>`); false: only with the header `e2b-traffic-access-token: <ports.trafficToken>`. Default true.',
          }),
        },
        { additionalProperties: false },
      ),
    ),
    credentials: Type.Optional(
      Type.Array(Type.String({ pattern: CREDENTIAL_NAME }), {
        maxItems: 32,
        uniqueItems: true,
        description: 'Names of registered credentials; the sandbox gets a placeholder for each.',
      }),
    ),
  },
  { additionalProperties: false },
);
export type CreateSandboxBody = Static<typeof CreateSandboxBody>;

/** The public sandbox record (API JSON); its static type is `Sandbox` (core/types.ts). */
export const SandboxSchema = Type.Object(
  {
    id: Type.String(),
    template: Type.String(),
    state: stringEnum(SANDBOX_STATES),
    vcpus: Type.Number(),
    /** MiB. */
    memoryMiB: Type.Integer(),
    /**
     * Running lifetime, seconds, from creation or the last timeout change. Only running time
     * counts: a paused sandbox's clock stops (see `pause`).
     */
    timeoutSec: Type.Integer(),
    /** Idle seconds after which the platform pauses the sandbox (0: never). */
    autoPauseSec: Type.Integer(),
    /** What the end of its running lifetime does: kill it or pause it. */
    onTimeout: stringEnum(ON_TIMEOUT),
    /** Whether traffic through the router resumes it when paused. */
    autoResume: Type.Boolean(),
    /** Set while paused (or pausing/resuming after a pause): how and since when. */
    pause: nullable(
      Type.Object({
        mode: stringEnum(PAUSE_MODES),
        reason: stringEnum(PAUSE_REASONS),
        pausedAt: Type.String({ format: 'date-time' }),
        timeLeftSec: Type.Integer({ description: 'Running lifetime left, s.' }),
      }),
    ),
    metadata: Type.Record(Type.String(), Type.String()),
    /** Node holding it, once placed. */
    nodeId: nullable(Type.String()),
    /** Whether creation claimed a warm-pool slot. */
    fromWarmPool: Type.Boolean(),
    /** How its instance came to be: a warm-pool claim, a snapshot restore or a cold boot (null before). */
    createdFrom: nullable(stringEnum(['warm', 'snapshot', 'boot'] as const)),
    /** Current session id (bound into session tokens). */
    sessionId: Type.String(),
    createdAt: Type.String({ format: 'date-time' }),
    updatedAt: Type.String({ format: 'date-time' }),
    /**
     * When the platform will kill it: the end of its running lifetime, or while paused the end of
     * the paused retention.
     */
    expiresAt: Type.String({ format: 'date-time' }),
    endedAt: nullable(Type.String({ format: 'date-time' })),
    killReason: nullable(stringEnum(KILL_REASONS)),
    /** Human explanation of the end (or of the failure), when ended. */
    endMessage: nullable(Type.String()),
    /** The sandbox's egress policy (normalised). */
    egress: Type.Object({
      mode: Type.String(),
      allow: Type.Array(Type.String()),
      deny: Type.Array(Type.String()),
      cidrs: Type.Array(Type.Object({ cidr: Type.String(), ports: Type.Array(Type.Integer()) })),
    }),
    /**
     * Servers in the sandbox, through the router (`<port>-<id>.<domain>`): public, or only with the
     * header `e2b-traffic-access-token: <trafficToken>` (null when public).
     */
    ports: Type.Object({ public: Type.Boolean(), trafficToken: nullable(Type.String()) }),
    /** Credentials granted: the env var in the sandbox holds a placeholder, never the value. */
    credentials: Type.Array(Type.Object({ name: Type.String(), envVar: Type.String() })),
  },
  { $id: 'Sandbox' },
);

/** An operation (API JSON); its static type is `Operation` (core/types.ts). */
export const OperationSchema = Type.Object(
  {
    id: Type.String(),
    kind: stringEnum(OPERATION_KINDS),
    target: Type.String(),
    state: stringEnum(OPERATION_STATES),
    error: nullable(Type.Object({ code: Type.String(), message: Type.String() })),
    createdAt: Type.String({ format: 'date-time' }),
    updatedAt: Type.String({ format: 'date-time' }),
  },
  { $id: 'Operation' },
);

export const SandboxAndOperation = Type.Object({
  sandbox: Type.Ref(SandboxSchema),
  operation: Type.Ref(OperationSchema),
});

export const ListSandboxesQuery = Type.Object(
  {
    state: Type.Optional(
      Type.String({
        pattern: `^(${SANDBOX_STATES.join('|')})(,(${SANDBOX_STATES.join('|')}))*$`,
        description: 'Comma list.',
      }),
    ),
    metadata: Type.Optional(
      Type.Union(
        [
          Type.String({ maxLength: 4096 }),
          Type.Array(Type.String({ maxLength: 4096 }), { maxItems: LIMITS.metadataKeys }),
        ],
        {
          description:
            'URL-encoded query string of metadata pairs, e.g. `team%3Da`; the key may repeat. All pairs must match; a key with two values is refused (400).',
        },
      ),
    ),
    limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 1000, default: 100 })),
    cursor: Type.Optional(Type.String({ maxLength: 512, pattern: '^[A-Za-z0-9_-]+$' })),
  },
  { additionalProperties: false },
);
export type ListSandboxesQuery = Static<typeof ListSandboxesQuery>;

export const TimeoutBody = Type.Object(
  { timeoutSec: Type.Integer({ minimum: 1 }) },
  { additionalProperties: false },
);

export const WaitQuery = Type.Object(
  {
    waitMs: Type.Optional(
      Type.Integer({ minimum: 0, maximum: 60_000, description: 'Long-poll up to this many ms.' }),
    ),
  },
  { additionalProperties: false },
);

/** Query of `POST /v1/sandboxes`: the long-poll of {@link WaitQuery} and a bounded wait for room. */
export const CreateQuery = Type.Object(
  {
    waitMs: WaitQuery.properties.waitMs,
    roomWaitMs: Type.Optional(
      Type.Integer({
        minimum: 0,
        maximum: 60_000,
        description:
          'When no node has room now, wait up to this many ms for room before refusing with 503 NODE_CAPACITY_EXHAUSTED (0: refuse at once).',
      }),
    ),
  },
  { additionalProperties: false },
);

export const CommandBody = Type.Object(
  {
    cmd: Type.String({
      minLength: 1,
      maxLength: LIMITS.argBytes,
      description: 'Program, or a script with `shell`.',
    }),
    args: Type.Optional(Type.Array(Type.String({ maxLength: LIMITS.argBytes }), { maxItems: LIMITS.args })),
    shell: Type.Optional(Type.Boolean({ description: 'Run `cmd` with /bin/sh -c.' })),
    env: Type.Optional(EnvVars),
    cwd: Type.Optional(Type.String({ minLength: 1, maxLength: 4096 })),
    user: Type.Optional(stringEnum(['user', 'root'] as const)),
    stdin: Type.Optional(
      Type.Union([Type.Boolean(), Type.String({ maxLength: LIMITS.stdinBytes })], {
        description: '`true` keeps stdin open for the data plane; a string is written then closed.',
      }),
    ),
    timeoutMs: Type.Optional(Type.Integer({ minimum: 1, maximum: LIMITS.maxCommandTimeoutMs })),
  },
  { additionalProperties: false },
);
export type CommandBody = Static<typeof CommandBody>;

export const StreamGrant = Type.Object({
  url: Type.String({ description: 'Data-plane URL.' }),
  token: Type.String({ description: 'Session token (Authorization: Bearer, or ?token=).' }),
  expiresAt: Type.String({ format: 'date-time' }),
});

export const CommandResponse = Type.Object({
  command: Type.Object({ id: Type.String(), sandboxId: Type.String(), pid: Type.Integer() }),
  stream: StreamGrant,
});

export const TokenBody = Type.Object(
  {
    scopes: Type.Optional(
      Type.Array(stringEnum(['commands', 'files'] as const), { minItems: 1, uniqueItems: true }),
    ),
    ttlSec: Type.Optional(Type.Integer({ minimum: 10, maximum: 86_400 })),
  },
  { additionalProperties: false },
);

export const PauseBody = Type.Object(
  {
    mode: Type.Optional(
      stringEnum(['auto', ...PAUSE_MODES] as const, {
        description:
          '`frozen`: kept in memory, instant resume. `hibernated`: snapshot to disk, capacity freed. `auto` (default): the platform’s policy.',
      }),
    ),
  },
  { additionalProperties: false },
);

const PerState = Type.Object(
  Object.fromEntries(USAGE_STATES.map((s) => [s, Type.Number()])) as Record<
    (typeof USAGE_STATES)[number],
    ReturnType<typeof Type.Number>
  >,
);

/** Usage of one sandbox (or one group): seconds per state, and vCPU- and GiB-seconds per state. */
export const UsageFigures = Type.Object({
  seconds: PerState,
  vcpuSeconds: PerState,
  gibSeconds: PerState,
});

export const SandboxUsageSchema = Type.Object({
  sandboxId: Type.String(),
  template: Type.String(),
  startedAt: nullable(Type.String({ format: 'date-time' })),
  endedAt: nullable(Type.String({ format: 'date-time' })),
  /** Current activity state (null once ended). */
  state: nullable(stringEnum(USAGE_STATES)),
  ...UsageFigures.properties,
});

export const UsageQuery = Type.Object(
  {
    from: Type.Optional(
      Type.String({ format: 'date-time', description: 'Start (inclusive); default 24 h ago.' }),
    ),
    to: Type.Optional(Type.String({ format: 'date-time', description: 'End (exclusive); default now.' })),
    groupBy: Type.Optional(stringEnum(['sandbox', 'apiKey', 'template'] as const)),
  },
  { additionalProperties: false },
);

export const UsageReportSchema = Type.Object({
  from: Type.String({ format: 'date-time' }),
  to: Type.String({ format: 'date-time' }),
  groupBy: Type.String(),
  /** Closed time is kept in one-minute buckets: `from`/`to` are rounded out to whole minutes. */
  resolutionSec: Type.Integer(),
  groups: Type.Array(Type.Object({ key: Type.String(), ...UsageFigures.properties })),
  total: UsageFigures,
});
