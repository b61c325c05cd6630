/**
 * Pulumi dynamic resources for Crusoe (no Pulumi package exists, docs/deployment.md "Crusoe"). The provider
 * object Pulumi serializes into the state captures only two strings (the kind and the URL of
 * `crud.ts`); the implementation and the credentials are loaded when a method runs, so no secret
 * is ever captured. Type tokens: `pulumi-nodejs:dynamic/crusoe:<Kind>`.
 *
 * Caveats (Pulumi docs): dynamic providers do not work with pnpm or Bun, and `read` is not used by
 * refresh/import for dynamic resources.
 */
import * as pulumi from '@pulumi/pulumi';
import type { CrusoeKind, FirewallRuleInputs, InstanceInputs, SubnetInputs } from './crud.ts';

const CRUD_URL = new URL('./crud.ts', import.meta.url).href;

type Props = Record<string, unknown>;
type Crud = typeof import('./crud.ts');

/**
 * The dynamic provider of one Crusoe kind. `load` brings in `crud.ts`; the default spells
 * `import()` through Function so the serialized closure holds only that text and two strings,
 * whatever transforms the source went through (vitest rewrites a literal `import()` into a helper
 * that captures its module loader, which Pulumi cannot serialize). Tests pass their own `load`.
 */
export function crusoeProvider(
  kind: CrusoeKind,
  load?: () => Promise<Crud>,
): pulumi.dynamic.ResourceProvider {
  const crudUrl = CRUD_URL;
  load ??= (): Promise<Crud> => new Function('u', 'return import(u)')(crudUrl) as Promise<Crud>;
  return {
    async check(_olds: Props, news: Props) {
      return (await load!()).check(kind, news);
    },
    async diff(_id: string, olds: Props, news: Props) {
      return (await load!()).diff(kind, olds, news);
    },
    async create(inputs: Props) {
      return (await load!()).create(kind, inputs);
    },
    async read(id: string, props: Props) {
      return (await load!()).read(kind, id, props);
    },
    async update(id: string, olds: Props, news: Props) {
      return (await load!()).update(kind, id, olds, news);
    },
    async delete(id: string, props: Props) {
      await (await load!()).remove(kind, id, props);
    },
  };
}

type Inputs<T> = { [K in keyof T]: pulumi.Input<T[K]> };

/** A Crusoe VM with nested virtualisation (`pulumi-nodejs:dynamic/crusoe:Instance`). */
export class Instance extends pulumi.dynamic.Resource {
  declare readonly resource: pulumi.Output<Record<string, unknown>>;
  constructor(name: string, args: Inputs<InstanceInputs>, opts?: pulumi.CustomResourceOptions) {
    super(crusoeProvider('instance'), name, { ...args, resource: undefined }, opts, 'crusoe', 'Instance');
  }
}

/** A Crusoe VPC subnet (`pulumi-nodejs:dynamic/crusoe:Subnet`). */
export class Subnet extends pulumi.dynamic.Resource {
  declare readonly resource: pulumi.Output<Record<string, unknown>>;
  constructor(name: string, args: Inputs<SubnetInputs>, opts?: pulumi.CustomResourceOptions) {
    super(crusoeProvider('subnet'), name, { ...args, resource: undefined }, opts, 'crusoe', 'Subnet');
  }
}

/** A Crusoe VPC firewall rule (`pulumi-nodejs:dynamic/crusoe:FirewallRule`). */
export class FirewallRule extends pulumi.dynamic.Resource {
  declare readonly resource: pulumi.Output<Record<string, unknown>>;
  constructor(name: string, args: Inputs<FirewallRuleInputs>, opts?: pulumi.CustomResourceOptions) {
    super(
      crusoeProvider('firewallRule'),
      name,
      { ...args, resource: undefined },
      opts,
      'crusoe',
      'FirewallRule',
    );
  }
}
