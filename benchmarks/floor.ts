/**
 * A driver's floor: the cost of starting the same template bare on this host, with nothing of
 * SPACE around it, measured in the same run as the figures it is compared with.
 * - `gvisor`: `runsc run` of `/bin/true` on the template's root filesystem (gvisor-lib.ts
 *   {@link runscTemplateFloor});
 * - `qemu`: a bare QEMU boot of the template's VM image to the init's probe marker after the root
 *   filesystem and network are up, no Node (`probeBoot` with `space.probe=late`);
 * - other drivers: not measured (the result says why).
 * Needs root and the host's runtime; builds/reuses the template in the shared cache.
 */
import { existsSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { TemplateImage } from '../runtime/agent/drivers/driver.ts';
import type { DensityFloor } from './density.ts';

/** The floor's samples, or why there are none. */
export type FloorResult =
  | { driver: string; what: string; samples: number[] }
  | { driver: string; skipped: string };

/** Node binary the guest layer copies (the repository's pinned Node 24 when installed). */
export function guestNodeBinary(): string {
  return [fileURLToPath(new URL('../node_modules/node/bin/node', import.meta.url)), process.execPath].find(
    (p) => existsSync(p),
  )!;
}

/** The gVisor platform the local agent uses: `SPACE_GVISOR_PLATFORM`, else the driver's default. */
export async function gvisorPlatform(): Promise<'ptrace' | 'systrap'> {
  const { DEFAULT_GVISOR_PLATFORM } = await import('../runtime/agent/drivers/gvisor-platform.ts');
  const env = process.env['SPACE_GVISOR_PLATFORM'];
  return env === 'ptrace' || env === 'systrap' ? env : DEFAULT_GVISOR_PLATFORM;
}

/** Template `base` as the gVisor driver boots it (built into `cacheDir` on first use). */
export async function baseDirectoryImage(cacheDir: string): Promise<TemplateImage> {
  const [{ directoryImage }, { buildTemplate }] = await Promise.all([
    import('../runtime/agent/image/images.ts'),
    import('../runtime/agent/image/templates.ts'),
  ]);
  await buildTemplate('base', { cacheDir });
  return directoryImage('base', cacheDir, {
    nodeBinary: guestNodeBinary(),
    tiniBinary: '/usr/bin/tini-static',
  });
}

/** Inputs of {@link measureQemuFloor}. */
export interface QemuFloorOptions {
  runs: number;
  kvm: boolean;
  cacheDir: string;
  /** /30 slots for the boot's namespace come from here, e.g. `10.79.43.0/24`. */
  pool: string;
  memoryMiB?: number;
  onSample?: () => void;
}

/**
 * Bare QEMU boots of template `base` (kernel + initrd + template image + instance disk + tap) to the
 * probe marker after the root filesystem and network are up. @returns ms per boot.
 * @throws Error when a boot fails (with the console tail).
 */
export async function measureQemuFloor(o: QemuFloorOptions): Promise<number[]> {
  const [
    { probeBoot },
    { makeInstanceDisk },
    { SandboxNetworks },
    { buildTemplate },
    { vmImage },
    kernel,
    assets,
  ] = await Promise.all([
    import('../runtime/agent/drivers/qemu.ts'),
    import('../runtime/agent/drivers/vm-common.ts'),
    import('../runtime/agent/host/network.ts'),
    import('../runtime/agent/image/templates.ts'),
    import('../runtime/agent/image/vm-image.ts'),
    import('../runtime/agent/image/guest-kernel.ts'),
    import('../runtime/agent/image/assets.ts'),
  ]);
  await buildTemplate('base', { cacheDir: o.cacheDir });
  await kernel.ensureGuestKernel(assets.guestKernelDir(assets.DEFAULT_IMAGE_ASSETS_DIR), o.cacheDir);
  const image = await vmImage('base', o.cacheDir, {
    nodeBinary: guestNodeBinary(),
    tiniBinary: '/usr/bin/tini-static',
  });
  const nets = new SandboxNetworks({ pool: o.pool });
  const dir = await mkdtemp(join(tmpdir(), 'space-floor-qemu-'));
  const net = await nets.allocate(`i-floor${process.pid % 1000}`);
  const out: number[] = [];
  try {
    net.tap = await nets.attachTap(net);
    for (let i = 0; i < o.runs; i++) {
      const disk = join(dir, `floor-${i}.img`);
      await makeInstanceDisk(disk, 256, 'bench');
      const r = await probeBoot({
        kvm: o.kvm,
        kernel: image.kernel!.bzImage,
        initrd: image.kernel!.initrd,
        probe: 'late',
        timeoutMs: 120_000,
        memoryMiB: o.memoryMiB ?? 512,
        rootfsImage: image.rootfsImage,
        disk,
        netns: net.netns,
      });
      if (!r.ok) throw new Error(`floor boot failed: ${r.output}`);
      out.push(r.ms);
      o.onSample?.();
      await rm(disk, { force: true });
    }
    return out;
  } finally {
    await nets.release(net).catch(() => {});
    await rm(dir, { recursive: true, force: true });
  }
}

/**
 * The floor of `driver` for template `base`, `runs` samples. Never throws for a driver it cannot
 * measure or a host that cannot (not root): it says why in `skipped`. Throws what the measurement
 * itself throws.
 */
export async function measureFloor(
  driver: string,
  runs: number,
  o: { cacheDir: string; onSample?: () => void },
): Promise<FloorResult> {
  if (process.getuid?.() !== 0) return { driver, skipped: 'needs root on the stack’s host' };
  if (driver === 'gvisor') {
    const { runscTemplateFloor } = await import('./gvisor-lib.ts');
    const image = await baseDirectoryImage(o.cacheDir);
    const platform = await gvisorPlatform();
    const samples = await runscTemplateFloor({
      image,
      runs,
      stateDir: await mkdtemp(join(tmpdir(), 'space-floor-')),
      platform,
      runscBinary: process.env['SPACE_RUNSC_BINARY'] ?? 'runsc',
      onSample: o.onSample,
    });
    return {
      driver,
      what: `bare \`runsc run\` of /bin/true on template base's root filesystem (${platform}, --network=none)`,
      samples,
    };
  }
  if (driver === 'qemu') {
    const kvm = existsSync('/dev/kvm') && process.env['SPACE_KVM'] !== 'off';
    const samples = await measureQemuFloor({
      runs,
      kvm,
      cacheDir: o.cacheDir,
      pool: '10.79.43.0/24',
      onSample: o.onSample,
    });
    return {
      driver,
      what: `bare QEMU boot of template base to its rootfs+network marker (${kvm ? 'KVM' : 'TCG'}, no Node)`,
      samples,
    };
  }
  return { driver, skipped: `no floor measurement for the ${driver} driver yet` };
}

/**
 * The density floor of `driver` for template `base` (see density.ts), or why there is none: only
 * gVisor has one (VMM drivers' bare-boot memory is not measured yet), and it needs root.
 */
export function densityFloor(driver: string, cacheDir: string): DensityFloor | { skipped: string } {
  if (process.getuid?.() !== 0) return { skipped: 'needs root on the stack’s host' };
  if (driver !== 'gvisor') return { skipped: `no density floor for the ${driver} driver yet` };
  return {
    driver,
    start: async (n) => {
      const { startIdleRunscFloor } = await import('./gvisor-lib.ts');
      return startIdleRunscFloor({
        image: await baseDirectoryImage(cacheDir),
        n,
        stateDir: await mkdtemp(join(tmpdir(), 'space-density-floor-')),
        platform: await gvisorPlatform(),
        runscBinary: process.env['SPACE_RUNSC_BINARY'] ?? 'runsc',
      });
    },
  };
}
