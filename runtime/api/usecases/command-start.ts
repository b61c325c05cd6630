/**
 * Use cases of the data plane's entry: start a command on a sandbox's node, and mint a session
 * token for its data plane. A paused sandbox is resumed first (bounded by
 * SPACE_RESUME_TIMEOUT_MS). Output then flows client → router → node (or client → node where no
 * router is configured). Called by `POST /v1/sandboxes/:id/commands` and `…/tokens`.
 */

import type { CommandBody } from '../../core/api-schemas.ts';
import { SpaceError } from '../../core/errors.ts';
import { newId } from '../../core/ids.ts';
import { ensureRunning } from '../../core/lifecycle-requests.ts';
import { F } from '../../core/log-fields.ts';
import { mintSessionToken, type SessionScope } from '../../core/tokens.ts';
import type { NodeInfo } from '../../core/types.ts';
import type { ApiDeps } from '../app.ts';
import type { SandboxRecord } from '../sandbox-store.ts';
import type { UseCaseLog } from './log.ts';

/** A data-plane grant: the URL to call, the session token, and when it expires (ISO 8601). */
export interface StreamGrant {
  url: string;
  token: string;
  expiresAt: string;
}

/**
 * Team `team`'s sandbox `id`, running (resumed first when paused, pausing or resuming), and its
 * alive node.
 * @throws SpaceError SANDBOX_NOT_FOUND, SANDBOX_NOT_RUNNING (creating or ending), SANDBOX_PAUSED
 *   (not resumed in time), NODE_UNAVAILABLE.
 */
export async function liveSandbox(
  deps: ApiDeps,
  team: string,
  id: string,
): Promise<{ rec: SandboxRecord; node: NodeInfo }> {
  let rec = await deps.requireSandbox(id, team);
  if (rec.state === 'paused' || rec.state === 'pausing' || rec.state === 'resuming') {
    await ensureRunning(deps.redis, id, { timeoutMs: deps.config.resumeTimeoutMs, reason: 'command' });
    rec = await deps.requireSandbox(id, team);
  }
  if (rec.state !== 'running' || !rec.nodeId) {
    throw new SpaceError('SANDBOX_NOT_RUNNING', `sandbox ${id} is ${rec.state}`, {
      sandboxId: id,
      state: rec.state,
    });
  }
  return { rec, node: await deps.nodes.requireAlive(rec.nodeId) };
}

/** Base URL of the data plane clients should use: the router when configured, else the node. */
const dataPlaneBase = (deps: ApiDeps, nodeUrl: string) => deps.config.publicDataPlaneUrl || nodeUrl;

/** A session token for `rec`'s current session with `scopes`, valid `ttlSec`. */
async function grantFor(deps: ApiDeps, rec: SandboxRecord, scopes: SessionScope[], ttlSec: number) {
  return mintSessionToken(deps.signingKey, {
    sandboxId: rec.id,
    sessionId: rec.sessionId,
    team: rec.team,
    maxStreams: (await deps.teams.quotas(rec.team)).streams,
    scopes,
    ttlSec,
  });
}

/**
 * Starts command `b` in team `team`'s sandbox `id` and returns it with the URL of its output stream
 * and a `commands` session token for it (the config's session token TTL).
 * @throws SpaceError as {@link liveSandbox}; BAD_REQUEST (both `args` and `shell`); the node's
 *   refusals (e.g. a cwd the user may not enter).
 */
export async function startCommand(
  deps: ApiDeps,
  team: string,
  id: string,
  b: CommandBody,
  log: UseCaseLog,
): Promise<{ command: { id: string; sandboxId: string; pid: number }; stream: StreamGrant }> {
  if (b.shell && b.args?.length) throw new SpaceError('BAD_REQUEST', 'give either args or shell, not both');
  let { rec, node } = await liveSandbox(deps, team, id);
  const commandId = newId('cmd');
  const start = {
    commandId,
    cmd: b.cmd,
    args: b.args ?? [],
    shell: b.shell ?? false,
    env: b.env ?? {},
    cwd: b.cwd,
    user: b.user ?? 'user',
    stdin: b.stdin,
    timeoutMs: b.timeoutMs,
  };
  let started: Awaited<ReturnType<typeof deps.agents.startCommand>>;
  try {
    started = await deps.agents.startCommand(node, rec.id, start);
  } catch (err) {
    // a pause took the sandbox between our look and the node's: resume it and start once more
    if (!(err instanceof SpaceError && err.code === 'SANDBOX_PAUSED')) throw err;
    await ensureRunning(deps.redis, rec.id, { timeoutMs: deps.config.resumeTimeoutMs, reason: 'command' });
    ({ rec, node } = await liveSandbox(deps, team, id));
    started = await deps.agents.startCommand(node, rec.id, start);
  }
  const grant = await grantFor(deps, rec, ['commands'], deps.config.sessionTokenTtlSec);
  log.info({ [F.sandboxId]: rec.id, [F.commandId]: commandId }, 'command started');
  return {
    command: { id: commandId, sandboxId: rec.id, pid: started.pid },
    stream: {
      url: new URL(
        `/v1/sandboxes/${rec.id}/commands/${commandId}/events`,
        dataPlaneBase(deps, node.url),
      ).toString(),
      token: grant.token,
      expiresAt: new Date(grant.expiresAt * 1000).toISOString(),
    },
  };
}

/**
 * A session token for team `team`'s sandbox `id`'s data plane with `scopes` (default both), valid
 * `ttlSec` (default the config's), and the data-plane URL of the sandbox.
 * @throws SpaceError as {@link liveSandbox}.
 */
export async function grantSession(
  deps: ApiDeps,
  team: string,
  id: string,
  opts: { scopes?: SessionScope[]; ttlSec?: number },
): Promise<StreamGrant> {
  const { rec, node } = await liveSandbox(deps, team, id);
  const grant = await grantFor(
    deps,
    rec,
    opts.scopes ?? ['commands', 'files'],
    opts.ttlSec ?? deps.config.sessionTokenTtlSec,
  );
  return {
    url: new URL(`/v1/sandboxes/${rec.id}`, dataPlaneBase(deps, node.url)).toString(),
    token: grant.token,
    expiresAt: new Date(grant.expiresAt * 1000).toISOString(),
  };
}
