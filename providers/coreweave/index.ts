/**
 * CoreWeave CKS: no installable Pulumi package here (`@pulumi/coreweave` is not served), so the
 * cluster is made outside this program (Console or Terraform) and this stack deploys into it with
 * `@pulumi/kubernetes`: one CKS `NodePool` custom resource per pool (bare-metal CPU nodes labelled
 * with the pool) and the Kubernetes component, tolerating the pools' taints.
 */
import { createHash } from 'node:crypto';
import * as k8s from '@pulumi/kubernetes';
import type * as pulumi from '@pulumi/pulumi';
import { CloudStack, type CloudStackArgs, type StackOutputs } from '../cloud-stack.ts';
import { type RedisVolumeDefault, runtimeArgsFromConfig } from '../kubernetes/from-config.ts';
import { type PublicExposure, Runtime } from '../kubernetes/runtime.ts';
import { NODE_LABEL, type NodePool, POOL_LABEL } from '../node-pool.ts';

/**
 * The name of `pool`'s CKS NodePool: `space-<pool>-<8 hex of sha256(instanceType)>`. The instance
 * type is in the name because it is immutable on a NodePool, so changing it replaces the object,
 * and pulumi-kubernetes deletes a named object *before* making its replacement when the new name
 * equals the old (`deleteBeforeReplace` in the provider's Diff, pulumi/pulumi-kubernetes
 * `provider/pkg/provider/provider.go`): the whole pool, every sandbox on it, would go before a
 * single new node existed. A new name makes the replacement create-then-delete: the new pool comes
 * up, then the old one goes. Fixed length after the pool name, so two pools never share a name.
 */
export function coreweaveNodePoolName(pool: Pick<NodePool, 'name' | 'instanceType'>): string {
  const type = createHash('sha256').update(pool.instanceType).digest('hex').slice(0, 8);
  return `space-${pool.name}-${type}`;
}

/**
 * The CKS NodePool object of `pool` (`compute.coreweave.com/v1alpha1`, docs.coreweave.com/products/
 * cks/reference/node-pool), named by {@link coreweaveNodePoolName}.
 */
export function coreweaveNodePool(pool: NodePool): Record<string, unknown> {
  return {
    apiVersion: 'compute.coreweave.com/v1alpha1',
    kind: 'NodePool',
    metadata: { name: coreweaveNodePoolName(pool) },
    spec: {
      computeClass: 'default',
      instanceType: pool.instanceType,
      targetNodes: pool.count,
      minNodes: pool.count,
      maxNodes: pool.count,
      nodeLabels: { [POOL_LABEL]: pool.name, [NODE_LABEL]: 'true', ...pool.labels },
    },
  };
}

/** The annotation that makes a CKS LoadBalancer Service public; without it the address is private. */
export const COREWEAVE_LB_TYPE_ANNOTATION = 'service.beta.kubernetes.io/coreweave-load-balancer-type';

/**
 * How CKS exposes client-facing Services: a LoadBalancer Service gets a non-public address unless
 * annotated `coreweave-load-balancer-type: public` (docs.coreweave.com/products/networking/
 * ingress-service/expose-service-dns; …/support/networking/articles/how-do-i-get-a-publicly-
 * routable-ip-for-my-loadbalancer-service). On a public Service CKS honours
 * `spec.loadBalancerSourceRanges` and silently drops other sources; an empty list restricts
 * nothing (…/support/networking/articles/how-do-i-restrict-which-ips-can-reach-my-loadbalancer-service).
 * Pure.
 */
export function coreweaveExposure(clientCidrs: readonly string[]): PublicExposure {
  return {
    annotations: { [COREWEAVE_LB_TYPE_ANNOTATION]: 'public' },
    loadBalancerSourceRanges: [...clientCidrs],
  };
}

/**
 * The Redis volume on CKS when `space:redisStorageClass` is unset: `shared-vast`, the one
 * StorageClass CKS documents for PersistentVolumeClaims (Distributed File Storage, docs.coreweave.com/
 * products/storage/distributed-file-storage/create-volumes), with the access mode that page sets,
 * `ReadWriteMany`. Without a class the claim waits for a cluster default CKS need not have, and
 * Redis never starts.
 */
export const COREWEAVE_REDIS_VOLUME: RedisVolumeDefault = {
  storageClassName: 'shared-vast',
  accessMode: 'ReadWriteMany',
};

/** Arguments of {@link CoreweaveStack}. */
export type CoreweaveStackArgs = CloudStackArgs;

/**
 * `space:coreweave:Stack`: the runtime on an existing CKS cluster (kubeconfig from the secret
 * `space:kubeconfig`), one CKS NodePool per pool, public load balancers limited to the clients.
 */
export class CoreweaveStack extends CloudStack {
  readonly outputs: StackOutputs;

  constructor(name: string, args: CoreweaveStackArgs, opts?: pulumi.ComponentResourceOptions) {
    super('coreweave', name, opts);
    const { config: cfg, image } = args;
    // every Kubernetes object goes through this provider: with space:imageBuild, after the push
    const provider = new k8s.Provider(
      'cks',
      { kubeconfig: cfg.secrets.kubeconfig! },
      this.child(CloudStack.afterImage(image)),
    );
    const pools = cfg.nodePools.map(
      (pool) =>
        new k8s.apiextensions.CustomResource(
          `cks-pool-${pool.name}`,
          coreweaveNodePool(pool) as k8s.apiextensions.CustomResourceArgs,
          // an instance type change replaces the pool, and the name changes with it
          // (coreweaveNodePoolName), so Pulumi makes the new pool before it deletes the old one
          this.child({ provider, replaceOnChanges: ['spec.instanceType'], deleteBeforeReplace: false }),
        ),
    );
    const runtime = new Runtime(
      'space',
      runtimeArgsFromConfig(cfg, { exposure: coreweaveExposure(cfg.clientCidrs) }, COREWEAVE_REDIS_VOLUME),
      this.child({ providers: [provider], dependsOn: pools }),
    );
    this.outputs = {
      namespace: runtime.namespace,
      apiLoadBalancer: runtime.apiService.status.loadBalancer.ingress,
      // point space:routerUrl (or the router TLS hostname) here
      routerLoadBalancer: runtime.routerService.status.loadBalancer.ingress,
    };
    this.registerOutputs(this.outputs);
  }
}
