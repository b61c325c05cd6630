/**
 * The API on Kubernetes: `space-api` through the shared scaled-service builder, with the signing
 * key (only here), its bootstrap-key directory and, with TLS, the certificate Secret.
 */
import { API_PORT, apiEnvironment, KEY_DIR, SERVICE_COMMANDS } from '../runtime-settings.ts';
import { env, type ObjectList, type RenderContext, redisUrlEnv } from './args.ts';
import { addScaledService } from './workload.ts';

/**
 * The router URL the API hands to clients (`SPACE_ROUTER_URL`): `router.publicUrl`, else with TLS
 * `https://<routerHostname>`, else none. Pure.
 */
export function routerPublicUrl(ctx: RenderContext): string | undefined {
  const { a } = ctx;
  return a.router?.publicUrl ?? (a.tls ? `https://${a.tls.routerHostname}` : undefined);
}

/** Adds the API's Deployment, Service, HPA and PDB. */
export function addApi(list: ObjectList, ctx: RenderContext): void {
  const { a, d } = ctx;
  const routerUrl = routerPublicUrl(ctx);
  addScaledService(list, ctx, {
    component: 'api',
    port: API_PORT,
    command: SERVICE_COMMANDS.api,
    env: [
      ...env(
        apiEnvironment(a.apiEnv, {
          tls: !!a.tls,
          ...(routerUrl ? { routerUrl } : {}),
          replicatedRedis: a.redis.mode === 'in-cluster' && !!a.redis.sentinel,
        }),
      ),
      redisUrlEnv,
    ],
    volumeMounts: [
      { name: 'signing-key', mountPath: KEY_DIR, readOnly: true },
      { name: 'api-state', mountPath: '/var/lib/space/api' },
      { name: 'tmp', mountPath: '/tmp' },
      ...ctx.tlsMount,
    ],
    volumes: [
      { name: 'signing-key', secret: { secretName: 'space-signing-key', defaultMode: 0o440 } },
      // the bootstrap API key file (see docs/deployment.md "first API key")
      { name: 'api-state', emptyDir: {} },
      { name: 'tmp', emptyDir: {} },
      ...ctx.tlsVolume,
    ],
    terminationGracePeriodSeconds: 30,
    minReplicas: d.apiReplicas,
    maxReplicas: d.apiMaxReplicas,
    ...(a.apiNodePort ? { nodePort: a.apiNodePort } : {}),
  });
}
