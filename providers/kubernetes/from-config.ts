/** Builds the Kubernetes component's arguments from the stack configuration (shared by LKE, CKS, kind). */
import { createPublicKey } from 'node:crypto';
import type * as k8s from '@pulumi/kubernetes';
import * as pulumi from '@pulumi/pulumi';
import type { StackConfig } from '../stack-config.ts';
import type { RuntimeArgs } from './runtime.ts';

/** The SPKI public key of a PKCS#8 Ed25519 private key. Not secret, so unwrapped from the secret. */
export function publicKeyOf(privateKeyPem: pulumi.Output<string>): pulumi.Output<string> {
  return pulumi.unsecret(
    privateKeyPem.apply((pem) => createPublicKey(pem).export({ type: 'spki', format: 'pem' }).toString()),
  );
}

/** The Redis volume a cloud uses when `space:redisStorageClass` is unset (its documented class). */
export interface RedisVolumeDefault {
  readonly storageClassName: string;
  readonly accessMode: 'ReadWriteOnce' | 'ReadWriteMany';
}

/**
 * {@link RuntimeArgs} for `cfg` plus cloud-specific settings. `redisVolume`: the cloud's volume
 * when the operator names no StorageClass (default: the cluster's default class, `ReadWriteOnce`).
 */
export function runtimeArgsFromConfig(
  cfg: StackConfig,
  extra: Partial<RuntimeArgs> = {},
  redisVolume?: RedisVolumeDefault,
): RuntimeArgs {
  const signingKey = cfg.secrets.signingKey!;
  return {
    version: cfg.version,
    imageRepository: cfg.imageRepository,
    nodePools: cfg.nodePools,
    signingKey,
    verifyKey: publicKeyOf(signingKey),
    redis: cfg.secrets.redisUrl
      ? { mode: 'external', url: cfg.secrets.redisUrl }
      : {
          mode: 'in-cluster',
          password: cfg.secrets.redisPassword!,
          ...(cfg.redis.mode === 'sentinel'
            ? { sentinel: { servers: cfg.redis.servers, sentinels: cfg.redis.sentinels } }
            : {}),
          ...(cfg.redisStorageClass
            ? { storageClassName: cfg.redisStorageClass }
            : redisVolume
              ? { storageClassName: redisVolume.storageClassName, accessMode: redisVolume.accessMode }
              : {}),
        },
    apiReplicas: cfg.apiReplicas,
    agentDrainSeconds: cfg.agentDrainSeconds,
    gatewayEnabled: cfg.gatewayEnabled,
    ...(cfg.gatewayEnabled && cfg.gatewayCaCertificate && cfg.secrets.gatewayCaKey
      ? { gatewayCa: { certificate: cfg.gatewayCaCertificate, key: cfg.secrets.gatewayCaKey } }
      : {}),
    ...(cfg.gatewayUpstreamDns.length ? { gatewayUpstreamDns: cfg.gatewayUpstreamDns } : {}),
    ...(cfg.gatewayDenyCidrs.length ? { gatewayDenyCidrs: cfg.gatewayDenyCidrs } : {}),
    gatewayEnv: cfg.gatewayEnv,
    nodeCidrs: cfg.nodeCidrs,
    agentTolerations: cfg.nodeTolerations as readonly k8s.types.input.core.v1.Toleration[],
    apiEnv: cfg.apiEnv,
    agentEnv: cfg.agentEnv,
    ...(cfg.routerUrl ? { router: { publicUrl: cfg.routerUrl } } : {}),
    ...(cfg.prometheusOperator ? { prometheusOperator: { labels: cfg.prometheusOperator.labels } } : {}),
    ...(cfg.backup
      ? {
          backup: {
            ...cfg.backup,
            ...(cfg.secrets.backupSecretAccessKey
              ? { secretAccessKey: cfg.secrets.backupSecretAccessKey }
              : {}),
          },
        }
      : {}),
    ...(cfg.imagePullSecretName
      ? { imagePull: { secretName: cfg.imagePullSecretName } }
      : cfg.imagePullUsername && cfg.secrets.imagePullPassword
        ? { imagePull: { username: cfg.imagePullUsername, password: cfg.secrets.imagePullPassword } }
        : {}),
    ...(cfg.tls
      ? {
          tls: {
            issuer: { name: cfg.tls.issuer, kind: 'ClusterIssuer' as const },
            apiHostname: cfg.tls.apiHostname,
            routerHostname: cfg.tls.routerHostname,
            ...(cfg.tls.sandboxDomain ? { sandboxDomain: cfg.tls.sandboxDomain } : {}),
          },
        }
      : {}),
    ...extra,
  };
}
