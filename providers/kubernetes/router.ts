/**
 * The data-plane router on Kubernetes: `space-router` through the shared scaled-service builder.
 * The clients' only way to sandboxes; it needs Redis and the verify key, nothing else. Replicas
 * follow the API's unless {@link RouterArgs} says otherwise.
 */
import {
  KEY_DIR,
  ROUTER_PORT,
  routerEnvironment,
  SERVICE_COMMANDS,
  tracingEnvironment,
} from '../runtime-settings.ts';
import { env, type ObjectList, type RenderContext, type RouterArgs, redisUrlEnv } from './args.ts';
import { addScaledService } from './workload.ts';

/** Adds the router's Deployment, Service, HPA and PDB. */
export function addRouter(list: ObjectList, ctx: RenderContext): void {
  const { a, d } = ctx;
  const r: RouterArgs = a.router ?? {};
  const min = r.replicas ?? d.apiReplicas;
  addScaledService(list, ctx, {
    component: 'router',
    port: ROUTER_PORT,
    command: SERVICE_COMMANDS.router,
    // the router has no env key of its own: it traces where the API does (`OTEL_*` of space:apiEnv)
    env: [...env(routerEnvironment({ tls: !!a.tls, env: tracingEnvironment(a.apiEnv) })), redisUrlEnv],
    volumeMounts: [
      { name: 'verify-key', mountPath: KEY_DIR, readOnly: true },
      { name: 'tmp', mountPath: '/tmp' },
      ...ctx.tlsMount,
    ],
    volumes: [
      { name: 'verify-key', configMap: { name: 'space-verify-key' } },
      { name: 'tmp', emptyDir: {} },
      ...ctx.tlsVolume,
    ],
    // streams in flight get the grace period to finish before the pod goes
    terminationGracePeriodSeconds: 60,
    minReplicas: min,
    maxReplicas: Math.max(r.maxReplicas ?? d.apiMaxReplicas, min),
    ...(r.nodePort ? { nodePort: r.nodePort } : {}),
  });
}
