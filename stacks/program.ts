/**
 * The SPACE Pulumi program: validate the whole stack configuration first (one error listing every
 * problem, before any resource exists), then make the cloud's `space:<cloud>:Stack` component.
 */
import { fileURLToPath } from 'node:url';
import * as command from '@pulumi/command';
import * as pulumi from '@pulumi/pulumi';
import { AkamaiStack } from '../providers/akamai/index.ts';
import { backupSummary } from '../providers/backup-schedule.ts';
import type { Cloud } from '../providers/catalogue.ts';
import type { CloudStack, CloudStackArgs, StackOutputs } from '../providers/cloud-stack.ts';
import { CoreweaveStack } from '../providers/coreweave/index.ts';
import { CrusoeStack } from '../providers/crusoe/index.ts';
import { KindStack } from '../providers/kind/index.ts';
import { imageRef } from '../providers/runtime-settings.ts';
import { loadStackConfig, pulumiConfigKeys, pulumiRawConfig, type RawConfig } from './config.ts';

export type { StackOutputs };

/** The `space:<cloud>:Stack` component of each cloud. */
const STACKS: Record<Cloud, new (name: string, args: CloudStackArgs) => CloudStack> = {
  akamai: AkamaiStack,
  coreweave: CoreweaveStack,
  crusoe: CrusoeStack,
  kind: KindStack,
};

/** The repository root: where `scripts/image.sh` builds from. */
const ROOT = fileURLToPath(new URL('..', import.meta.url));

/**
 * The shell command that builds the image and pushes it as `ref` (`space:imageBuild`): the
 * repository's own build (`scripts/image.sh`, which tags what it builds `SPACE_IMAGE_TAG`), then
 * `buildah push` to the registry named in `ref`. `vmms` (`space:imageVmms`) are the drivers the
 * image must carry: the build fails rather than push an image without one (`--require`). Pure.
 */
export function imageBuildCommand(
  ref: string,
  vmms: readonly string[] = [],
): { create: string; environment: Record<string, string> } {
  // gVisor and QEMU come with every build; the others are downloads the build must not skip
  const fetched = vmms.filter((d) => d !== 'gvisor' && d !== 'qemu');
  return {
    create: `bash scripts/image.sh${fetched.length ? ` --require ${fetched.join(',')}` : ''} && buildah push "$SPACE_IMAGE_TAG" "docker://$SPACE_IMAGE_TAG"`,
    environment: { SPACE_IMAGE_TAG: ref },
  };
}

/**
 * Runs the program against `raw` config and the `space:` key names `setKeys` (default: the Pulumi
 * runtime's). Returns the outputs.
 */
export function run(
  raw: RawConfig = pulumiRawConfig,
  setKeys: readonly string[] = pulumiConfigKeys(),
): StackOutputs {
  const cfg = loadStackConfig(raw, setKeys);
  let image: pulumi.Resource | undefined;
  if (cfg.imageBuild) {
    const ref = imageRef(cfg.imageRepository, cfg.version);
    const build = imageBuildCommand(ref, cfg.imageVmms);
    // a new version (new tag) runs it again; the same one does not
    image = new command.local.Command('space-image', {
      ...build,
      update: build.create,
      dir: ROOT,
      triggers: [ref],
    });
  }
  // on or off, the preview says where Redis is backed up (or that nothing backs it up)
  const backup = backupSummary(cfg.backup);
  if (cfg.backup) pulumi.log.info(`scheduled Redis backups: ${backup}`);
  else pulumi.log.warn(`scheduled Redis backups: ${backup}`);
  return {
    cloud: cfg.cloud,
    mode: cfg.mode,
    version: cfg.version,
    backup,
    // every cloud stack orders what runs the image after it (its Kubernetes provider, its VMs)
    ...new STACKS[cfg.cloud]('space', { config: cfg, ...(image ? { image } : {}) }).outputs,
  };
}
