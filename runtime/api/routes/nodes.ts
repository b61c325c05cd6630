/** Read-only views of nodes and templates. */
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox';
import { Type } from '@sinclair/typebox';
import type { ApiDeps } from '../app.ts';

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
        schema: { summary: 'List nodes', response: { 200: Type.Object({ nodes: Type.Array(NodeSchema) }) } },
      },
      async () => ({ nodes: await deps.nodes.list() }),
    );
    app.get(
      '/v1/templates',
      {
        schema: {
          summary: 'Templates ready on at least one alive node',
          response: { 200: Type.Object({ templates: Type.Array(Type.Object({ name: Type.String() })) }) },
        },
      },
      async () => ({ templates: [...(await deps.templates())].sort().map((name) => ({ name })) }),
    );
  };
}
