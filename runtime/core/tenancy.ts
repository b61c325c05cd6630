/**
 * Teams and API-key scopes, shared by the API (which authenticates keys and checks scopes) and the
 * router (which checks the team a session token carries against the sandbox's record).
 *
 * A *team* owns sandboxes, their operations, commands, session tokens, usage and credentials; an
 * API key belongs to exactly one team and carries a set of *scopes*. Records written before teams
 * existed belong to {@link DEFAULT_TEAM}.
 */

/** The team of everything made before teams existed, and of the local stack's bootstrap key. */
export const DEFAULT_TEAM = 'default';

/** What a team id looks like: lower-case letters, digits and `-`, 1–63 characters (DNS-label-like). */
export const TEAM_ID_PATTERN = '^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$';
const TEAM_ID_RE = new RegExp(TEAM_ID_PATTERN);

/** True when `id` is a well-formed team id. Pure. */
export function isTeamId(id: string): boolean {
  return TEAM_ID_RE.test(id);
}

/**
 * Every scope an API key can carry, with what it allows. Routes name the one scope they need in
 * their config (`config.scope`); the API refuses to start when a route names none.
 */
export const API_SCOPES = {
  'sandboxes:read': 'List and read the team’s sandboxes, operations and per-sandbox usage.',
  'sandboxes:write':
    'Create, delete, pause, resume the team’s sandboxes; change their lifetime and egress; start commands; mint session tokens.',
  'credentials:read': 'List and read the team’s credentials (never their values).',
  'credentials:admin': 'Register, replace and delete the team’s credentials.',
  'usage:read': 'Read the team’s usage over a time range.',
  'audit:read': 'Read the team’s audit log.',
  'keys:admin': 'Create, list, rotate and revoke the team’s API keys (granting at most its own scopes).',
  'nodes:read': 'List nodes and templates (platform-wide, no tenant data).',
  'teams:admin': 'Platform administration: create and list teams, set their quotas, manage keys of any team.',
  'deployment:admin':
    'Set and read what VM deployments run: the SPACE version they move to and their services’ configuration (platform-wide).',
} as const;

/** One API-key scope. */
export type ApiScope = keyof typeof API_SCOPES;

/** Every scope, in table order (the bootstrap key and migrated keys hold all of them). */
export const ALL_SCOPES = Object.keys(API_SCOPES) as ApiScope[];

/** Scopes a new key gets when its creator names none: a tenant's everyday work, no administration. */
export const DEFAULT_KEY_SCOPES: readonly ApiScope[] = [
  'sandboxes:read',
  'sandboxes:write',
  'credentials:read',
  'usage:read',
  'nodes:read',
];

/** True when `s` is a known scope. Pure. */
export function isApiScope(s: string): s is ApiScope {
  return Object.hasOwn(API_SCOPES, s);
}

/** Per-team limits; 0 means unlimited. */
export interface TeamQuotas {
  /** Sandboxes that exist at once (every state but killed). */
  sandboxes: number;
  /** vCPUs reserved by those sandboxes. */
  vcpus: number;
  /** Memory reserved by those sandboxes, MiB. */
  memoryMiB: number;
  /** Sandbox creates accepted in any 60 s window. */
  createsPerMinute: number;
  /**
   * Command output streams open at once (through the router or on an agent directly); counted by
   * agents with leases in Redis, the limit carried in session tokens (`agent/commands/team-streams.ts`).
   */
  streams: number;
}

/** The quota names, in a stable order (scripts receive limits in this order). */
export const QUOTA_NAMES = ['sandboxes', 'vcpus', 'memoryMiB', 'createsPerMinute', 'streams'] as const;

/** No limit at all (tests, tools that write records directly). */
export const UNLIMITED_QUOTAS: TeamQuotas = Object.freeze({
  sandboxes: 0,
  vcpus: 0,
  memoryMiB: 0,
  createsPerMinute: 0,
  streams: 0,
});
