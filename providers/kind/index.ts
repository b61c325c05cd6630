/**
 * kind: the Kubernetes component on a local kind cluster. Pulumi cannot create a kind cluster
 * (no provider): `kindClusterConfig` renders the cluster file (`kind create cluster --config`),
 * one worker per pool node, labelled with its pool, `/dev/kvm` passed through for VMM pools.
 */
import * as k8s from '@pulumi/kubernetes';
import type * as pulumi from '@pulumi/pulumi';
import { stringify } from 'yaml';
import { CloudStack, type CloudStackArgs, type StackOutputs } from '../cloud-stack.ts';
import { runtimeArgsFromConfig } from '../kubernetes/from-config.ts';
import { Runtime } from '../kubernetes/runtime.ts';
import { isVmmDriver, NODE_LABEL, type NodePool, POOL_LABEL } from '../node-pool.ts';
import { AGENT_PORT, API_PORT, ROUTER_PORT } from '../runtime-settings.ts';

/** NodePort of the API on kind (mapped to the host by the cluster config). */
export const KIND_API_NODE_PORT = 30080;
/** NodePort of the router on kind (mapped to the host's `ROUTER_PORT`). */
export const KIND_ROUTER_NODE_PORT = 30082;

/** The kind cluster file for `pools` (kind.x-k8s.io/v1alpha4). */
export function kindClusterConfig(pools: readonly NodePool[]): string {
  const workers = pools.flatMap((pool) =>
    Array.from({ length: pool.count }, () => ({
      role: 'worker',
      labels: { [POOL_LABEL]: pool.name, [NODE_LABEL]: 'true', ...pool.labels },
      // rootful Docker shows the host's devices to privileged nodes; be explicit for VMM pools
      ...(isVmmDriver(pool.driver)
        ? { extraMounts: [{ hostPath: '/dev/kvm', containerPath: '/dev/kvm' }] }
        : {}),
    })),
  );
  const doc = {
    kind: 'Cluster',
    apiVersion: 'kind.x-k8s.io/v1alpha4',
    name: 'space',
    nodes: [
      {
        role: 'control-plane',
        extraPortMappings: [
          { containerPort: KIND_API_NODE_PORT, hostPort: API_PORT, listenAddress: '127.0.0.1' },
          { containerPort: KIND_ROUTER_NODE_PORT, hostPort: ROUTER_PORT, listenAddress: '127.0.0.1' },
        ],
      },
      ...workers,
    ],
  };
  return `# rendered by providers/kind/index.ts (kindClusterConfig); agents listen on node port ${AGENT_PORT}\n${stringify(doc)}`;
}

/** Arguments of {@link KindStack}. */
export type KindStackArgs = CloudStackArgs;

/**
 * `space:kind:Stack`: the runtime on the kind cluster of the current kubeconfig (context
 * `space:kubeContext`), the API and the router on fixed node ports the cluster file maps to the host.
 */
export class KindStack extends CloudStack {
  readonly outputs: StackOutputs;

  constructor(name: string, args: KindStackArgs, opts?: pulumi.ComponentResourceOptions) {
    super('kind', name, opts);
    const { config: cfg, image } = args;
    // every Kubernetes object goes through this provider: with space:imageBuild, after the push
    const provider = new k8s.Provider(
      'kind',
      {
        ...(cfg.secrets.kubeconfig ? { kubeconfig: cfg.secrets.kubeconfig } : {}),
        ...(cfg.kubeContext ? { context: cfg.kubeContext } : {}),
      },
      this.child(CloudStack.afterImage(image)),
    );
    const runtime = new Runtime(
      'space',
      runtimeArgsFromConfig(cfg, {
        apiServiceType: 'NodePort',
        apiNodePort: KIND_API_NODE_PORT,
        apiReplicas: 1,
        router: {
          nodePort: KIND_ROUTER_NODE_PORT,
          publicUrl: cfg.routerUrl ?? `http://127.0.0.1:${ROUTER_PORT}`,
        },
      }),
      this.child({ providers: [provider] }),
    );
    this.outputs = {
      namespace: runtime.namespace,
      apiUrl: `http://127.0.0.1:${API_PORT}`,
      routerUrl: cfg.routerUrl ?? `http://127.0.0.1:${ROUTER_PORT}`,
      kindClusterConfig: kindClusterConfig(cfg.nodePools),
    };
    this.registerOutputs(this.outputs);
  }
}
