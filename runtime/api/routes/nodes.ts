/** Views of nodes and templates, a node's drain, and the VM deployments' target version. */
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox';
import { Type } from '@sinclair/typebox';
import { nullable } from '../../core/json-schema.ts';
import { VERSION_TAG } from '../../core/redis-keys.ts';
import type { ApiDeps } from '../app.ts';
import { knownTemplates, readyTemplates } from '../node-store.ts';
import { drainNode, undrainNode } from '../usecases/drain.ts';

const NodeSchema = Type.Object({
  id: Type.String(),
  url: Type.String(),
  driver: Type.String(),
  capabilities: Type.Array(Type.String()),
  version: Type.String(),
  vcpus: Type.Number(),
  memoryMiB: Type.Number(),
  maxSandboxes: Type.Integer(),
  usedVcpus: Type.Number(),
  usedMemoryMiB: Type.Number(),
  sandboxes: Type.Integer(),
  warm: Type.Record(Type.String(), Type.Integer()),
  schedulable: Type.Boolean(),
  drainRequestedAt: nullable(Type.String()),
  heartbeatAt: Type.String(),
  alive: Type.Boolean(),
  templates: Type.Array(Type.String()),
  hibernateStore: Type.String(),
});

export function nodeRoutes(deps: ApiDeps): FastifyPluginAsyncTypebox {
  return async (app) => {
    app.get(
      '/v1/nodes',
      {
        config: { scope: 'nodes:read' },
        schema: { summary: 'List nodes', response: { 200: Type.Object({ nodes: Type.Array(NodeSchema) }) } },
      },
      async () => ({ nodes: await deps.nodes.list() }),
    );
    const NodeId = Type.Object({ id: Type.String({ minLength: 1, maxLength: 128 }) });
    app.put(
      '/v1/nodes/:id/drain',
      {
        config: { scope: 'deployment:admin' },
        schema: {
          summary:
            'Drain a node before it goes: it takes no new sandboxes, and its agent waits for them at SIGTERM; with `hibernate`, its running sandboxes are hibernated to resume elsewhere (needs a shared hibernation store)',
          params: NodeId,
          body: Type.Object({ hibernate: Type.Optional(Type.Boolean()) }, { additionalProperties: false }),
          response: {
            200: Type.Object({
              node: NodeSchema,
              hibernating: Type.Array(Type.Object({ sandboxId: Type.String(), operationId: Type.String() })),
              skipped: Type.Array(Type.Object({ sandboxId: Type.String(), reason: Type.String() })),
            }),
          },
        },
      },
      async (req) => drainNode(deps, req.params.id, { hibernate: req.body.hibernate ?? false }, req.log),
    );
    app.delete(
      '/v1/nodes/:id/drain',
      {
        config: { scope: 'deployment:admin' },
        schema: {
          summary: 'Lift a node’s drain: it takes new sandboxes again',
          params: NodeId,
          response: { 200: Type.Object({ node: NodeSchema }) },
        },
      },
      async (req) => ({ node: await undrainNode(deps, req.params.id, req.log) }),
    );
    // VM deployments upgrade without SSH: every VM's space-version-sync timer reads this target and
    // moves its own services to `<its image repository>:<version>` (docs/deployment.md "vm mode")
    const TargetVersion = Type.Object({ version: Type.String({ pattern: VERSION_TAG.source }) });
    app.put(
      '/v1/deployment/target-version',
      {
        config: { scope: 'deployment:admin' },
        schema: {
          summary:
            'Set the SPACE version VM deployments move to (each VM pulls its image repository at this tag and restarts its services)',
          body: TargetVersion,
          response: { 200: TargetVersion },
        },
      },
      async (req) => {
        await deps.deployment.setTargetVersion(req.body.version);
        req.log.info({ version: req.body.version }, 'deployment target version set');
        return { version: req.body.version };
      },
    );
    app.get(
      '/v1/deployment/target-version',
      {
        config: { scope: 'nodes:read' },
        schema: {
          summary: 'The SPACE version VM deployments move to (null when none was set)',
          response: { 200: Type.Object({ version: nullable(Type.String()) }) },
        },
      },
      async () => ({ version: await deps.deployment.targetVersion() }),
    );
    app.get(
      '/v1/templates',
      {
        config: { scope: 'nodes:read' },
        schema: {
          summary:
            'Templates built on some registered node; `ready` when at least one alive node has it (otherwise creates answer TEMPLATE_NOT_READY, retryable)',
          response: {
            200: Type.Object({
              templates: Type.Array(Type.Object({ name: Type.String(), ready: Type.Boolean() })),
            }),
          },
        },
      },
      async () => {
        const nodes = await deps.nodes.list();
        const ready = readyTemplates(nodes);
        return {
          templates: [...knownTemplates(nodes)].sort().map((name) => ({ name, ready: ready.has(name) })),
        };
      },
    );
  };
}
