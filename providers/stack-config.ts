/**
 * The validated stack configuration every cloud's component takes: the providers own this type
 * (stacks/config.ts reads and validates `space:*` keys into it; nothing in providers/ imports from
 * stacks/). Keys and their meaning: docs/configuration.md and docs/deployment.md.
 */
import type * as pulumi from '@pulumi/pulumi';
import type { DriverName } from '../runtime/core/drivers.ts';
import type { BackupPlan } from './backup-schedule.ts';
import type { Cloud } from './catalogue.ts';
import type { DeployMode, NodePool } from './node-pool.ts';

/** The validated, frozen stack configuration (secrets stay Outputs). */
export interface StackConfig {
  readonly cloud: Cloud;
  readonly mode: DeployMode;
  readonly version: string;
  readonly imageRepository: string;
  /** `space:imagePullUsername`, with `secrets.imagePullPassword`: pull credentials for the image's registry. */
  readonly imagePullUsername: string | undefined;
  /** `space:imageBuild`: build and push the image in `pulumi up`. */
  readonly imageBuild: boolean;
  /** `space:imageVmms`: the drivers the image can run (its `dev.space.vmms` label). */
  readonly imageVmms: readonly DriverName[];
  /** `space:imagePullSecretName`: an existing pull Secret (`kubernetes` mode), when set. */
  readonly imagePullSecretName: string | undefined;
  readonly region: string;
  readonly nodePools: readonly NodePool[];
  readonly clientCidrs: readonly string[];
  readonly sshCidrs: readonly string[];
  readonly sshPublicKey: string | undefined;
  readonly privateCidr: string;
  readonly controlInstanceType: string;
  readonly gatewayEnabled: boolean;
  /** The CA certificate (kubernetes mode with the gateway). */
  readonly gatewayCaCertificate: string | undefined;
  /** Empty: the gateway's own default. */
  readonly gatewayUpstreamDns: readonly string[];
  /** Empty: the gateway's own default. */
  readonly gatewayDenyCidrs: readonly string[];
  readonly gatewayEnv: Readonly<Record<string, string>>;
  readonly apiReplicas: number;
  readonly agentDrainSeconds: number;
  readonly k8sVersion: string;
  readonly kubeContext: string | undefined;
  readonly redisStorageClass: string | undefined;
  /**
   * `space:redis` (`kubernetes` mode, in-cluster Redis): Sentinel failover with `servers` data
   * servers and `sentinels` sentinels, or one Redis.
   */
  readonly redis:
    | { readonly mode: 'sentinel'; readonly servers: number; readonly sentinels: number }
    | { readonly mode: 'single' };
  /** `space:controlPlane.replicas` (`vm` mode): control VMs, 1, 3 or 5. */
  readonly controlPlaneReplicas: number;
  readonly apiTlsCertificate: string | undefined;
  /** `space:routerUrl`, when set. */
  readonly routerUrl: string | undefined;
  /** ACME TLS on the Crusoe control VM, when `space:tlsHostnames` is set there. */
  readonly acme:
    | { readonly hostnames: readonly string[]; readonly email: string; readonly server: string }
    | undefined;
  /** Akamai `vm`: the names `space:apiTlsCertificate` carries (`space:tlsHostnames`), when set. */
  readonly vmTlsHostnames: { readonly api: string; readonly router: string } | undefined;
  /** cert-manager TLS (`kubernetes` mode), when `space:tlsIssuer` and `space:tlsHostnames` are set. */
  readonly tls:
    | {
        readonly issuer: string;
        readonly apiHostname: string;
        readonly routerHostname: string;
        /** `space:tlsHostnames.sandboxes`: the certificate also carries `*.<it>`. */
        readonly sandboxDomain?: string;
      }
    | undefined;
  readonly nodeCidrs: readonly string[];
  readonly nodeTolerations: readonly Record<string, string>[];
  readonly crusoeProjectId: string;
  readonly crusoeVpcNetworkId: string;
  readonly crusoeImage: string;
  /** `space:prometheusOperator` (with its labels), when true. */
  readonly prometheusOperator: { readonly labels: Readonly<Record<string, string>> } | undefined;
  /** `space:backup`: scheduled Redis backups to an S3-compatible store, when set. */
  readonly backup: BackupPlan | undefined;
  readonly apiEnv: Readonly<Record<string, string>>;
  readonly agentEnv: Readonly<Record<string, string>>;
  /** Secret values, present only when set. */
  readonly secrets: {
    readonly signingKey?: pulumi.Output<string>;
    readonly redisPassword?: pulumi.Output<string>;
    readonly redisUrl?: pulumi.Output<string>;
    readonly kubeconfig?: pulumi.Output<string>;
    readonly apiTlsKey?: pulumi.Output<string>;
    readonly gatewayCaKey?: pulumi.Output<string>;
    readonly lkeFirewallToken?: pulumi.Output<string>;
    readonly bootstrapApiKey?: pulumi.Output<string>;
    readonly imagePullPassword?: pulumi.Output<string>;
    readonly backupSecretAccessKey?: pulumi.Output<string>;
  };
}
