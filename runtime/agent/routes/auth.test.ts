/**
 * The data plane's one token hook (auth.ts): every route of `DATA_PLANE_ROUTES` is admitted by the
 * auth kind its row declares, on a Fastify app with the agent's data-plane plugin, real session
 * tokens and a real sandbox registry (no guest: a guest call fails GUEST_UNAVAILABLE, which tells
 * an admitted request from a refused one).
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import fastify, { type FastifyInstance } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DATA_PLANE_ROUTES, type DataPlaneRoute } from '../../core/data-plane.ts';
import { SpaceError } from '../../core/errors.ts';
import { acceptEmptyBodies, installErrorHandlers } from '../../core/http-errors.ts';
import {
  loadSigningKey,
  loadVerifyKey,
  mintSessionToken,
  type SessionScope,
  type SigningKey,
  writeNewKeyPair,
} from '../../core/tokens.ts';
import { installValidators } from '../../core/validation.ts';
import type { AgentDeps } from '../app.ts';
import type { AgentConfig } from '../config.ts';
import type { GuestClient } from '../guest-client.ts';
import type { HibernatedView } from '../sandboxes/hibernated-view.ts';
import type { SandboxManager } from '../sandboxes/manager.ts';
import { SandboxRegistry } from '../sandboxes/registry.ts';
import { type LocalSandbox, localSandbox } from '../sandboxes/types.ts';
import { dataPlaneRoutes } from './data-plane.ts';

const SBX = 'sbx0000000001';
const HIB = 'sbx0000000002';
const SESSION = 'ses0000000001';
const CMD = 'cmd0000000001';

/** A guest that never answers (every call fails as an unreachable guest does). */
const deadGuest = new Proxy(
  {},
  {
    get: (_t, name) =>
      name === 'then'
        ? undefined
        : async () => {
            throw new SpaceError('GUEST_UNAVAILABLE', `guest call ${String(name)} refused (test)`);
          },
  },
) as GuestClient;

/** A valid request for `route` (params, query, body), so schema validation passes and the hook decides. */
function requestFor(route: DataPlaneRoute, id: string, token?: string) {
  const url = route.path.replace(':id', id).replace(':cmd', CMD);
  const query: Record<string, string> = {};
  if (route.path.endsWith('/files') || route.path.includes('/fs/stat') || route.path.includes('/fs/list'))
    query.path = '/tmp/x';
  if (route.name === 'fs.remove' || route.name === 'fs.watch') query.path = '/tmp/x';
  const bodies: Record<string, unknown> = {
    'command.start': { cmd: 'true', args: [], shell: false, env: {}, user: 'user' },
    'command.resize': { cols: 80, rows: 24 },
    'command.signal': { signal: 'SIGTERM' },
    'fs.mkdir': { path: '/tmp/x' },
    'fs.rename': { from: '/tmp/x', to: '/tmp/y' },
  };
  const raw = route.body === 'upload' || route.body === 'stream';
  const payload = raw ? Buffer.from('x') : bodies[route.name];
  return {
    method: route.method,
    url,
    query,
    headers: {
      ...(token ? { authorization: `Bearer ${token}` } : {}),
      ...(raw ? { 'content-type': 'application/octet-stream' } : {}),
      ...(payload && !raw ? { 'content-type': 'application/json' } : {}),
    },
    ...(payload ? { payload: raw ? (payload as Buffer) : JSON.stringify(payload) } : {}),
  };
}

describe('data-plane token hook', () => {
  let dir: string;
  let sign: SigningKey;
  let app: FastifyInstance;
  const reg = new SandboxRegistry();
  let sb: LocalSandbox;
  const hibernated: HibernatedView = { sandboxId: HIB, sessionId: SESSION, commands: async () => [] };

  const token = async (o: { sandboxId?: string; sessionId?: string; scopes?: SessionScope[] } = {}) =>
    (
      await mintSessionToken(sign, {
        sandboxId: o.sandboxId ?? SBX,
        sessionId: o.sessionId ?? SESSION,
        team: 'default',
        scopes: o.scopes ?? ['commands', 'files'],
        ttlSec: 60,
      })
    ).token;

  /** The error code `route` answers with for `id` and `tok` (undefined: it answered 2xx). */
  async function codeOf(route: DataPlaneRoute, id: string, tok?: string): Promise<string | undefined> {
    const res = await app.inject(requestFor(route, id, tok));
    if (res.statusCode < 300) return undefined;
    return (res.json() as { error: { code: string } }).error.code;
  }

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'space-auth-'));
    await writeNewKeyPair(join(dir, 'k.pem'), join(dir, 'k.pub.pem'));
    sign = await loadSigningKey(join(dir, 'k.pem'));
    const verifyKey = await loadVerifyKey(join(dir, 'k.pub.pem'));
    sb = localSandbox(
      {
        sandboxId: SBX,
        sessionId: SESSION,
        template: 'base',
        egress: { allow: [], cidrs: [] } as never,
        credentials: [],
      },
      {
        instanceId: 'i-test',
        template: 'base',
        state: 'running',
        guest: { host: '127.0.0.1', port: 1, token: 't' },
        network: {} as never,
        createdAt: 0,
        vcpus: 1,
        memoryMiB: 256,
      },
      deadGuest,
      'boot',
    );
    reg.running.set(SBX, sb);
    const sandboxes = {
      find: (id: string) => reg.running.get(id),
      get: (id: string) => reg.get(id),
      hibernated: async (id: string) => (id === HIB ? hibernated : null),
      holdGuest: (id: string) => reg.holdGuest(id),
      beginActivity: () => () => {},
      command: (_sid: string, cmdId: string) => {
        throw new SpaceError('COMMAND_NOT_FOUND', `no command ${cmdId}`);
      },
      startCommand: async () => {
        throw new SpaceError('GUEST_UNAVAILABLE', 'no guest (test)');
      },
      guestFailed: async (_id: string, err: unknown) => err,
    } as unknown as SandboxManager;
    const deps = {
      config: { maxStreams: 10, maxUploadBytes: 1 << 20 } as AgentConfig,
      verifyKey,
      sandboxes,
    } as unknown as AgentDeps;
    app = fastify();
    installErrorHandlers(app);
    acceptEmptyBodies(app);
    installValidators(app);
    await app.register(dataPlaneRoutes(deps));
    await app.ready();
  });

  afterAll(async () => {
    await app?.close();
    await rm(dir, { recursive: true, force: true });
  });

  it('every route declares the auth kind its handler was written for', () => {
    // guest calls hold the guest; reading spooled output and a long watch do not; spooled output
    // of a hibernated sandbox is served from the store
    expect(Object.fromEntries(DATA_PLANE_ROUTES.map((r) => [r.name, r.auth]))).toEqual({
      'command.start': 'guest',
      'command.events': 'spool',
      'command.list': 'spool',
      'command.get': 'spool',
      'command.stdin': 'guest',
      'command.stdin-close': 'guest',
      'command.resize': 'guest',
      'command.signal': 'guest',
      'files.read': 'guest',
      'files.write': 'guest',
      'fs.stat': 'guest',
      'fs.list': 'guest',
      'fs.mkdir': 'guest',
      'fs.remove': 'guest',
      'fs.rename': 'guest',
      'fs.watch': 'sandbox',
    });
  });

  it('refuses every route without a token, with another sandbox’s, scope’s or session’s token', async () => {
    const other = await token({ sandboxId: 'sbx0000000009' });
    const otherSession = await token({ sessionId: 'ses0000000009' });
    for (const r of DATA_PLANE_ROUTES) {
      const wrongScope = await token({ scopes: [r.scope === 'files' ? 'commands' : 'files'] });
      expect([r.name, await codeOf(r, SBX)]).toEqual([r.name, 'UNAUTHENTICATED']);
      expect([r.name, await codeOf(r, SBX, other)]).toEqual([r.name, 'TOKEN_SCOPE']);
      expect([r.name, await codeOf(r, SBX, wrongScope)]).toEqual([r.name, 'TOKEN_SCOPE']);
      expect([r.name, await codeOf(r, SBX, otherSession)]).toEqual([r.name, 'TOKEN_SCOPE']);
    }
  });

  it('admits a good token to a running sandbox and releases its guest hold when the response closes', async () => {
    const tok = await token();
    for (const r of DATA_PLANE_ROUTES) {
      const code = await codeOf(r, SBX, tok);
      // past the hook: the handler met the (dead) guest or the unknown command
      expect([r.name, ['GUEST_UNAVAILABLE', 'COMMAND_NOT_FOUND', undefined].includes(code)]).toEqual([
        r.name,
        true,
      ]);
      expect([r.name, sb.guestCalls]).toEqual([r.name, 0]);
    }
    expect(
      await codeOf(DATA_PLANE_ROUTES[0], 'sbx0000000007', await token({ sandboxId: 'sbx0000000007' })),
    ).toBe('SANDBOX_NOT_FOUND');
  });

  it('refuses `guest` routes of a frozen sandbox; `spool` and `sandbox` routes pass', async () => {
    const tok = await token();
    sb.paused = 'frozen';
    try {
      for (const r of DATA_PLANE_ROUTES) {
        const code = await codeOf(r, SBX, tok);
        expect([r.name, code === 'SANDBOX_PAUSED']).toEqual([r.name, r.auth === 'guest']);
      }
    } finally {
      sb.paused = null;
    }
  });

  it('serves `spool` routes of a hibernated sandbox from the store and refuses the others as paused', async () => {
    const tok = await token({ sandboxId: HIB });
    for (const r of DATA_PLANE_ROUTES) {
      const code = await codeOf(r, HIB, tok);
      if (r.auth === 'spool')
        expect([r.name, code]).toEqual([r.name, r.name === 'command.list' ? undefined : 'COMMAND_NOT_FOUND']);
      else expect([r.name, code]).toEqual([r.name, 'SANDBOX_PAUSED']);
    }
    // its session is checked there too
    const otherSession = await token({ sandboxId: HIB, sessionId: 'ses0000000009' });
    for (const r of DATA_PLANE_ROUTES)
      expect([r.name, await codeOf(r, HIB, otherSession)]).toEqual([r.name, 'TOKEN_SCOPE']);
  });
});
