/**
 * The deployment's VM configuration (`/v1/deployment/vm-config`, scope `deployment:admin`): the
 * settings of every systemd service of a VM deployment, written by the Pulumi program on every
 * `pulumi up` (the `space:VmConfig` dynamic resource, providers/systemd/vm-config.ts) and read from
 * Redis by the `space-config-sync` timer on every VM, which checks them against the VM's own policy
 * (core/vm-config.ts) and restarts only the services whose env file changed. So a config change
 * reaches VMs made before it without SSH or replacement.
 */
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox';
import { Type } from '@sinclair/typebox';
import { ENV_NAME, ENV_VALUE } from '../../core/env-file.ts';
import { VM_SERVICE } from '../../core/redis-keys.ts';
import type { ApiDeps } from '../app.ts';

const Env = Type.Record(
  Type.String({ pattern: ENV_NAME.source }),
  Type.String({ pattern: ENV_VALUE.source, maxLength: 8192 }),
  // names that fit no pattern are refused, not passed through (TypeBox's Record leaves them open)
  { maxProperties: 256, additionalProperties: false },
);
const VmConfig = Type.Object(
  {
    services: Type.Record(Type.String({ pattern: VM_SERVICE.source }), Env, {
      maxProperties: 128,
      additionalProperties: false,
      description:
        'Env of each VM service: `space-api`, `space-router`, `space-tls` (control VM), `space-gateway`, `space-agent@<pool>` (node VMs).',
    }),
  },
  { additionalProperties: false },
);

/** The vm-config routes. */
export function deploymentRoutes(deps: ApiDeps): FastifyPluginAsyncTypebox {
  return async (app) => {
    app.put(
      '/v1/deployment/vm-config',
      {
        config: { scope: 'deployment:admin' },
        schema: {
          summary:
            'Replace the VM deployment configuration (every VM applies its services’ env within a minute and restarts only those that changed)',
          body: VmConfig,
          response: { 200: VmConfig },
        },
      },
      async (req) => {
        const { services } = req.body;
        // the whole document at once: a service missing from it is left as its VMs have it
        await deps.deployment.setVmConfig(services);
        req.log.info({ services: Object.keys(services) }, 'vm config set');
        return { services };
      },
    );
    app.get(
      '/v1/deployment/vm-config',
      {
        config: { scope: 'deployment:admin' },
        schema: {
          summary: 'The VM deployment configuration (empty when none was set)',
          response: { 200: VmConfig },
        },
      },
      async () => ({ services: await deps.deployment.vmConfig() }),
    );
  };
}
