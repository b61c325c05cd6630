/**
 * The SPACE Pulumi program: validate the whole stack configuration first (one error listing every
 * problem, before any resource exists), then hand off to the cloud's provider module.
 */
import type * as pulumi from '@pulumi/pulumi';
import { deployAkamai } from '../providers/akamai/index.ts';
import type { Cloud } from '../providers/catalogue.ts';
import { deployCoreweave } from '../providers/coreweave/index.ts';
import { deployCrusoe } from '../providers/crusoe/index.ts';
import { deployKind } from '../providers/kind/index.ts';
import { loadStackConfig, pulumiRawConfig, type RawConfig, type StackConfig } from './config.ts';

/** Stack outputs (`pulumi stack output`). */
export type StackOutputs = Record<string, pulumi.Input<unknown>>;

const DEPLOY: Record<Cloud, (cfg: StackConfig) => StackOutputs> = {
  akamai: deployAkamai,
  coreweave: deployCoreweave,
  crusoe: deployCrusoe,
  kind: deployKind,
};

/** Runs the program against `raw` config (default: the Pulumi runtime's). Returns the outputs. */
export function run(raw: RawConfig = pulumiRawConfig): StackOutputs {
  const cfg = loadStackConfig(raw);
  return {
    cloud: cfg.cloud,
    mode: cfg.mode,
    version: cfg.version,
    ...DEPLOY[cfg.cloud](cfg),
  };
}
