/**
 * How envd requests name things: the sandbox (header or host), paths (relative to the user's home)
 * and the user (Basic auth username), as the E2B SDK sends them (docs/e2b.md). Pure.
 */
import type { IncomingHttpHeaders } from 'node:http';

/** envd's port: the host form is `49983-<sandboxId>.<domain>` (§3). */
export const ENVD_PORT = '49983';
/** Home of E2B's default user `user` (§2.5). */
export const HOME = '/home/user';
const HOST = /^(\d{1,5})-([a-z0-9_]{8,64})\./;

/** The sandbox an envd request names (`E2b-Sandbox-Id` first, then the host), or undefined. */
export function envdSandboxOf(headers: IncomingHttpHeaders): string | undefined {
  const header = headers['e2b-sandbox-id'];
  if (typeof header === 'string' && header) return header;
  const host = String(headers.host ?? headers[':authority'] ?? '');
  const m = HOST.exec(host);
  return m && m[1] === ENVD_PORT ? m[2] : undefined;
}

/** Absolute path for an envd path (relative ones are under `home`). */
export function envdPath(p: string, home = HOME): string {
  if (!p) return home;
  return p.startsWith('/') ? p : `${home}/${p}`;
}

/** The users SPACE sandboxes offer E2B clients, with their homes. */
export const ENVD_USERS = { user: HOME, root: '/root' } as const;
export type EnvdUser = keyof typeof ENVD_USERS;

/**
 * The user an envd RPC acts as: the username of `Authorization: Basic base64("<user>:")`, or
 * `user` when absent (envd ≥ 0.4.0 semantics, §2.1). Undefined for a user SPACE does not offer.
 */
export function envdUserOf(authorization: string | null | undefined): EnvdUser | undefined {
  const m = /^Basic\s+(\S+)$/i.exec(authorization ?? '');
  if (!m?.[1]) return 'user';
  const name = Buffer.from(m[1], 'base64').toString('utf8').split(':')[0] ?? '';
  if (name === '') return 'user';
  return Object.hasOwn(ENVD_USERS, name) ? (name as EnvdUser) : undefined;
}
