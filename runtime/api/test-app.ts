/**
 * Test fixture: the API app built in process (`buildApp` + `inject`) over a real Redis (one
 * database of the test run's redis-server) with a fake agent client — the node agent is a separate
 * service, so the fake is its stand-in; everything else (stores, scripts, operation worker) is the
 * real code. Not shipped (the image leaves out test-*.ts).
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { FastifyInstance } from 'fastify';
import { Redis } from 'ioredis';
import { pino } from 'pino';
import type { AgentCommandRequest, AgentCreateRequest, AgentPauseRequest } from '../core/agent-protocol.ts';
import type { EgressPolicy } from '../core/egress.ts';
import { keys } from '../core/redis-keys.ts';
import { ALL_SCOPES, DEFAULT_TEAM } from '../core/tenancy.ts';
import { loadSigningKey, writeNewKeyPair } from '../core/tokens.ts';
import type { AgentClient } from './agent-client.ts';
import { type ApiDeps, buildApp, createApiDeps, createApiRuntime } from './app.ts';
import { loadApiConfig } from './config.ts';

/** What the fake agent was asked, in order per kind. */
export interface AgentCalls {
  creates: AgentCreateRequest[];
  deletes: string[];
  commands: { sandboxId: string; req: AgentCommandRequest }[];
  egress: { sandboxId: string; egress: EgressPolicy }[];
  pauses: { sandboxId: string; req: AgentPauseRequest }[];
  resumes: string[];
}

/** A node agent that answers every dispatch at once and records it. */
export function fakeAgent(): { client: AgentClient; calls: AgentCalls } {
  const calls: AgentCalls = { creates: [], deletes: [], commands: [], egress: [], pauses: [], resumes: [] };
  const client = {
    async createSandbox(_node: unknown, req: AgentCreateRequest) {
      calls.creates.push(req);
      return { instanceId: `i-${req.sandboxId}`, fromWarmPool: false, source: 'boot' as const };
    },
    async deleteSandbox(_node: unknown, sandboxId: string) {
      calls.deletes.push(sandboxId);
    },
    async startCommand(_node: unknown, sandboxId: string, req: AgentCommandRequest) {
      calls.commands.push({ sandboxId, req });
      return { commandId: req.commandId, pid: 4242 };
    },
    async updateEgress(_node: unknown, sandboxId: string, egress: EgressPolicy) {
      calls.egress.push({ sandboxId, egress });
    },
    async pauseSandbox(_node: unknown, sandboxId: string, req: AgentPauseRequest) {
      calls.pauses.push({ sandboxId, req });
      return { mode: req.mode };
    },
    async resumeSandbox(_node: unknown, sandboxId: string) {
      calls.resumes.push(sandboxId);
      return { instanceId: `i-${sandboxId}`, how: 'thawed' as const };
    },
  };
  return { client: client as unknown as AgentClient, calls };
}

/** A node registration as an agent writes it (capacity in whole vCPUs and MiB). */
export interface TestNode {
  id: string;
  templates?: string[];
  driver?: string;
  vcpus?: number;
  memoryMiB?: number;
  alive?: boolean;
  schedulable?: boolean;
}

/** A running in-process API. */
export interface TestApi {
  app: FastifyInstance;
  deps: ApiDeps;
  calls: AgentCalls;
  /** The secret of an admin key of the default team (`authorization: Bearer <key>`). */
  key: string;
  /** A client of the same Redis database, for arranging and inspecting. */
  redis: Redis;
  /** Registers (or replaces) a node. */
  addNode(n: TestNode): Promise<void>;
  close(): Promise<void>;
}

/**
 * Builds the API over Redis database `db` (emptied first) at `redisUrl`. With `worker`, the
 * operation worker runs too (so operations finish, against the fake agent). `env`: more settings.
 */
export async function startTestApi(
  redisUrl: string,
  db: number,
  opts: { worker?: boolean; env?: Record<string, string> } = {},
): Promise<TestApi> {
  const dir = mkdtempSync(join(tmpdir(), 'space-test-api-'));
  await writeNewKeyPair(join(dir, 'signing.pem'), join(dir, 'verify.pem'));
  const redis = new Redis(redisUrl, { db });
  await redis.flushdb();
  const config = loadApiConfig({
    SPACE_REDIS_URL: redisUrl,
    SPACE_SIGNING_KEY_FILE: join(dir, 'signing.pem'),
    SPACE_LOG_LEVEL: 'silent',
    ...opts.env,
  });
  const deps = createApiDeps({
    config,
    log: pino({ level: 'silent' }),
    redis: new Redis(redisUrl, { db }),
    subscriber: new Redis(redisUrl, { db }),
    signingKey: await loadSigningKey(join(dir, 'signing.pem')),
  });
  const agent = fakeAgent();
  deps.agents = agent.client;
  await deps.teams.ensure(DEFAULT_TEAM);
  const { secret } = await deps.apiKeys.create({ team: DEFAULT_TEAM, name: 'test', scopes: ALL_SCOPES });
  const app = await buildApp(deps);
  const runtime = opts.worker ? createApiRuntime(deps, new Redis(redisUrl, { db })) : null;
  await runtime?.start();
  return {
    app,
    deps,
    calls: agent.calls,
    key: secret,
    redis,
    async addNode(n) {
      const m = redis
        .multi()
        .sadd(keys.nodeIndex(), n.id)
        .hset(keys.node(n.id), {
          id: n.id,
          url: `http://${n.id}.invalid:8081`,
          driver: n.driver ?? 'gvisor',
          capabilities: 'pause',
          version: 'test',
          protocol: '3',
          schedulable: n.schedulable === false ? '0' : '1',
          vcpusMilli: String((n.vcpus ?? 4) * 1000),
          memoryMiB: String(n.memoryMiB ?? 8192),
          maxSandboxes: '100',
          usedVcpusMilli: '0',
          usedMemoryMiB: '0',
          sandboxes: '0',
          templates: (n.templates ?? ['base']).join(','),
          hibernateStore: '',
        });
      if (n.alive === false) m.del(keys.nodeAlive(n.id));
      else m.set(keys.nodeAlive(n.id), '1');
      await m.exec();
    },
    async close() {
      await app.close();
      if (runtime) await runtime.stop();
      else await deps.waiter.close();
      deps.redis.disconnect();
      redis.disconnect();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
