/**
 * What every cloud's stack component shares. Each cloud is one Pulumi ComponentResource of type
 * `space:<cloud>:Stack` (the pattern of pulumi-eks's `eks:index:Cluster`): typed, readonly
 * arguments; every resource it makes is its child (`{ parent: this }`); its outputs are registered
 * with `registerOutputs`. A new cloud is a new subclass, not a copy of another cloud's module.
 *
 * Before issue 43 the clouds' resources were made at the root of the Pulumi stack. A child's URN
 * names its parent's type, so parenting them here would change every URN and make Pulumi replace
 * live infrastructure (VMs with their sandboxes, load balancers, clusters). {@link CloudStack.child}
 * therefore gives each direct child an alias to its old place, `{ parent: pulumi.rootStackResource }`
 * ("no parent" before; www.pulumi.com/docs/iac/concepts/options/aliases/), and the engine derives
 * the grandchildren's aliases from their parent's. stacks/resources.test.ts checks that every
 * resource of every stack config still maps to the URN and inputs it had.
 */
import * as pulumi from '@pulumi/pulumi';
import type { Cloud } from './catalogue.ts';
import type { StackConfig } from './stack-config.ts';

/** Arguments of every `space:<cloud>:Stack`. */
export interface CloudStackArgs {
  /** The validated stack configuration (stacks/config.ts `loadStackConfig`). */
  readonly config: StackConfig;
  /**
   * The image build of `space:imageBuild`, when on: whatever runs the image (the cluster's
   * Kubernetes provider, the VMs) is ordered after it. Default: none (the tag is already pushed).
   */
  readonly image?: pulumi.Resource;
}

/** Stack outputs (`pulumi stack output`), by name. */
export type StackOutputs = Record<string, pulumi.Input<unknown>>;

/** The base of the `space:<cloud>:Stack` components. */
export abstract class CloudStack extends pulumi.ComponentResource {
  /** What the stack publishes (`pulumi stack output`); also registered as the component's outputs. */
  abstract readonly outputs: StackOutputs;

  protected constructor(cloud: Cloud, name: string, opts: pulumi.ComponentResourceOptions = {}) {
    super(`space:${cloud}:Stack`, name, {}, opts);
  }

  /**
   * Options of a direct child (`opts` plus these): parented here, with an alias to the stack root
   * where it was made before this component existed (so its URN maps to the one in the state: no
   * replacement). Every resource a cloud stack makes directly takes its options from here.
   */
  child<T extends pulumi.CustomResourceOptions | pulumi.ComponentResourceOptions>(opts?: T): T {
    return {
      ...(opts as T),
      parent: this,
      aliases: [...(opts?.aliases ?? []), { parent: pulumi.rootStackResource }],
    };
  }

  /** `dependsOn` the image build, when there is one. */
  protected static afterImage(image: pulumi.Resource | undefined): { dependsOn: pulumi.Resource[] } {
    return { dependsOn: image ? [image] : [] };
  }
}
