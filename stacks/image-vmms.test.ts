/**
 * The image a stack deploys (issue 42 item 2): no SPACE image is published, so a stack must name
 * the repository its image is pushed to (before, a default pointed every stack at a tag nobody
 * publishes); and a node pool whose driver the image lacks (`space:imageVmms`, the image's
 * `dev.space.vmms` label) is refused at preview (before, an offline-built image went out to a
 * Cloud Hypervisor pool and every agent failed at boot).
 */
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { imageBuildCommand } from './program.ts';
import { fails, type Raw, render, VARIANTS, withSecrets } from './test-stacks.ts';

const pool = (driver: string, instanceType: string) =>
  JSON.stringify([{ name: 'default', driver, instanceType, count: 2 }]);

describe('space:imageRepository', () => {
  it.each(Object.keys(VARIANTS))('%s: required, with where to get an image', (v) => {
    const raw: Raw = { ...withSecrets(VARIANTS[v]!), imageRepository: undefined };
    expect(fails(raw)).toEqual([
      expect.stringMatching(/^space:imageRepository: required: .*no SPACE image is published/),
    ]);
  });

  it('no stack file points at a registry that does not hold a SPACE image', () => {
    for (const raw of Object.values(VARIANTS))
      expect(raw.imageRepository).not.toMatch(/ghcr\.io\/space-sandbox/);
  });
});

describe('space:imageVmms: a pool runs only a driver the image has', () => {
  it('crusoe’s Cloud Hypervisor pool on an image of gvisor and qemu (an offline build) fails preview, naming the fix', () => {
    const problems = fails({ ...withSecrets(VARIANTS['crusoe']!), imageVmms: '["gvisor","qemu"]' });
    expect(problems).toEqual([
      expect.stringMatching(
        /^space:nodePools: pool "default" runs driver "cloud-hypervisor", which the image lacks \(space:imageVmms: gvisor, qemu\): build the image online/,
      ),
    ]);
  });

  it('the default is what every build has: gvisor and qemu pools pass, a firecracker one does not', () => {
    const akamai = withSecrets(VARIANTS['akamai']!);
    expect(fails({ ...akamai, nodePools: pool('gvisor', 'g6-dedicated-4') })).toEqual([]);
    const fc = [
      { name: 'fc', driver: 'firecracker', instanceType: 'g6-dedicated-4', allowUnverifiedKvm: true },
    ];
    expect(fails({ ...akamai, nodePools: JSON.stringify(fc) })).toEqual([
      expect.stringContaining('pool "fc" runs driver "firecracker", which the image lacks'),
    ]);
    expect(
      fails({ ...akamai, nodePools: JSON.stringify(fc), imageVmms: '["gvisor","qemu","firecracker"]' }),
    ).toEqual([]);
  });

  it('an unknown driver name is refused', () => {
    expect(fails({ ...withSecrets(VARIANTS['kind']!), imageVmms: '["gvisor","kvmtool"]' })).toEqual([
      expect.stringMatching(/^space:imageVmms: must be a list of drivers/),
    ]);
  });

  it('with space:imageBuild the build must produce the listed VMMs (--require), or nothing is pushed', async () => {
    expect(imageBuildCommand('r.example/space:1', ['gvisor', 'qemu']).create).toMatch(
      /^bash scripts\/image\.sh && /,
    );
    expect(imageBuildCommand('r.example/space:1', ['gvisor', 'qemu', 'cloud-hypervisor']).create).toMatch(
      /^bash scripts\/image\.sh --require cloud-hypervisor && buildah push/,
    );
    const recorded = await render({ ...withSecrets(VARIANTS['crusoe']!), imageBuild: 'true' });
    const cmd = recorded.find((r) => r.type === 'command:local:Command')!;
    expect(cmd.inputs['create']).toContain('--require cloud-hypervisor');
    const script = readFileSync(new URL('../scripts/image.sh', import.meta.url), 'utf8');
    expect(script).toContain('--require) assets_args+=(--require "$2")');
  });
});
