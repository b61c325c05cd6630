/**
 * `space:VmConfig` (type token `pulumi-nodejs:dynamic/space:VmConfig`): the deployment's VM
 * configuration, written through the API on **every** `pulumi up` (`PUT /v1/deployment/vm-config`,
 * see runtime/api/routes/deployment.ts). VMs ignore their user data after creation; the
 * `space-config-sync` timer on each applies what this writes, restarting only what changed.
 *
 * Why every `up`: the API's Redis is the state of record and Pulumi cannot read it back (`read`
 * does not work for dynamic resources), so a restore or a hand edit would otherwise stay; writing
 * the same document again restarts nothing. With `version`, it also sets the deployment's target
 * version, so bumping `space:version` and running `pulumi up` upgrades the VMs in place. So `pulumi preview` always lists this resource as an
 * update. Deleting it leaves the VMs' configuration as it is.
 *
 * The serialized provider captures only the URL of `vm-config-client.ts` (loaded when a method
 * runs, as the Crusoe provider does); the key is an input, kept secret in the state, never in the
 * outputs.
 */
import * as pulumi from '@pulumi/pulumi';
import type { VmConfigInputs } from './vm-config-client.ts';

const CLIENT_URL = new URL('./vm-config-client.ts', import.meta.url).href;
type Client = typeof import('./vm-config-client.ts');
type Props = Record<string, unknown>;

/**
 * The provider. `load` brings in the client; the default spells `import()` through Function so
 * the serialized closure holds only that text and a string (see crusoe/provider.ts). Tests pass
 * their own `load`.
 */
export function vmConfigProvider(load?: () => Promise<Client>): pulumi.dynamic.ResourceProvider {
  const url = CLIENT_URL;
  load ??= (): Promise<Client> => new Function('u', 'return import(u)')(url) as Promise<Client>;
  return {
    async diff() {
      return { changes: true };
    },
    async create(inputs: Props) {
      const outs = await (await load!()).writeVmConfig(inputs as unknown as VmConfigInputs, {
        allowPlain: true,
      });
      return { id: 'vm-config', outs };
    },
    async update(_id: string, olds: Props, news: Props) {
      // plain HTTP only until HTTPS has worked once (trust on first use of TLS)
      const outs = await (await load!()).writeVmConfig(news as unknown as VmConfigInputs, {
        allowPlain: olds['httpsConfirmed'] !== true,
      });
      return { outs: { ...outs, httpsConfirmed: outs.httpsConfirmed || olds['httpsConfirmed'] === true } };
    },
    async delete() {},
  };
}

/** Arguments of {@link VmConfig}. */
export interface VmConfigArgs {
  /** Base URL of the API (`apiUrl` stack output). */
  readonly apiUrl: pulumi.Input<string>;
  /** Plain-HTTP URL of the API, for the first write that turns TLS on (see the client). Default none. */
  readonly plainApiUrl?: pulumi.Input<string>;
  /** `space:bootstrapApiKey` (secret). */
  readonly apiKey: pulumi.Input<string>;
  /** Env of every VM service, from `controlServiceEnv` / `agentServiceEnv`. */
  readonly services: pulumi.Input<Record<string, Record<string, string>>>;
  /** `space:version`: VMs move to it (`PUT /v1/deployment/target-version`). Default: left as it is. */
  readonly version?: pulumi.Input<string>;
  /** Wait for the API up to this long, s. Default 1200 (a new control VM boots and pulls first). */
  readonly timeoutSec?: pulumi.Input<number>;
}

/** The deployment's VM configuration, written on every `pulumi up`. */
export class VmConfig extends pulumi.dynamic.Resource {
  declare readonly httpsConfirmed: pulumi.Output<boolean>;
  constructor(name: string, args: VmConfigArgs, opts?: pulumi.CustomResourceOptions) {
    super(
      vmConfigProvider(),
      name,
      { ...args, apiKey: pulumi.secret(args.apiKey), httpsConfirmed: undefined },
      { ...opts, additionalSecretOutputs: ['apiKey'] },
      'space',
      'VmConfig',
    );
  }
}
