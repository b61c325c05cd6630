/**
 * QEMU driver latencies beside their floor, measured in one run (prints, asserts nothing):
 *
 * - floor (spawn to QEMU exit just after the marker): a bare QEMU boot of the same kernel + initrd + template image + instance disk + tap to the
 *   init's probe marker after the root filesystem and network are up (`space.probe=late`: no Node);
 * - cold create: `QemuDriver.create` until the guest daemon answers /health at the sandbox address;
 * - snapshot-restore create: `QemuDriver.restore` of one snapshot until /health answers;
 * - pause/resume: `pause()` + `resume()` (QMP stop/cont) round trip.
 *
 * Usage (root; builds/reuses the template and VM image in SPACE_TEST_CACHE_DIR, default /var/lib/space):
 *   npm run bench:drivers -- [N]     (N runs of each, default 3)
 * Env SPACE_KVM=on uses KVM (only where it is usable).
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { InstanceSpec, SandboxNetwork } from '../runtime/agent/drivers/driver.ts';
import { QemuDriver } from '../runtime/agent/drivers/qemu.ts';
import { SandboxNetworks } from '../runtime/agent/host/network.ts';
import { DEFAULT_IMAGE_ASSETS_DIR, guestKernelDir } from '../runtime/agent/image/assets.ts';
import { ensureGuestKernel } from '../runtime/agent/image/guest-kernel.ts';
import { buildTemplate } from '../runtime/agent/image/templates.ts';
import { vmImage } from '../runtime/agent/image/vm-image.ts';
import { TEST_CACHE_DIR } from '../test/cache-dir.ts';
import { measureQemuFloor } from './floor.ts';

const N = Math.max(1, Number(process.argv[2] ?? 3));
const CACHE = TEST_CACHE_DIR;
const KVM = process.env['SPACE_KVM'] === 'on';
const nets = new SandboxNetworks({ pool: '10.79.43.0/24' });

/** Median of ms values. */
function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
}

const fmt = (xs: number[]) =>
  `median ${median(xs).toFixed(0)} ms  (runs: ${xs.map((x) => x.toFixed(0)).join(', ')})`;

async function main(): Promise<void> {
  await buildTemplate('base', { cacheDir: CACHE });
  await ensureGuestKernel(guestKernelDir(DEFAULT_IMAGE_ASSETS_DIR), CACHE);
  const image = await vmImage('base', CACHE, {
    nodeBinary: process.execPath,
    tiniBinary: '/usr/bin/tini-static',
  });
  const stateDir = await mkdtemp(join(tmpdir(), 'space-bench-qemu-'));
  const driver = new QemuDriver({ stateDir, kvm: KVM });
  await driver.preflight();
  const made: SandboxNetwork[] = [];
  let seq = 0;
  const network = async (id: string) => {
    const n = await nets.allocate(id);
    made.push(n);
    n.tap = await nets.attachTap(n);
    return n;
  };
  const spec = async (): Promise<InstanceSpec> => {
    const instanceId = `i-bench${process.pid % 1000}${(seq++).toString(36)}`;
    return {
      instanceId,
      template: 'base',
      image,
      vcpus: 1,
      memoryMiB: 512,
      diskMiB: 256,
      pidsLimit: 256,
      guestToken: 'bench',
      network: await network(instanceId),
    };
  };
  const results: Record<string, number[]> = { floor: [], cold: [], restore: [], pauseResume: [] };
  try {
    // the floor of `space bench latency` for the qemu driver, on its own /24
    results.floor = await measureQemuFloor({ runs: N, kvm: KVM, cacheDir: CACHE, pool: '10.79.44.0/24' });
    let keep: InstanceSpec | undefined;
    for (let i = 0; i < N; i++) {
      const s = await spec();
      const t = performance.now();
      await driver.create(s);
      results.cold!.push(performance.now() - t);
      if (keep) await driver.destroy(s.instanceId);
      else keep = s;
    }
    for (let i = 0; i < N; i++) {
      const t = performance.now();
      await driver.pause(keep!.instanceId);
      await driver.resume(keep!.instanceId);
      results.pauseResume!.push(performance.now() - t);
    }
    const snap = await driver.snapshot(keep!.instanceId, join(stateDir, 'snap'));
    await driver.destroy(keep!.instanceId);
    for (let i = 0; i < N; i++) {
      const s = await spec();
      const t = performance.now();
      await driver.restore(snap, { ...s });
      results.restore!.push(performance.now() - t);
      await driver.destroy(s.instanceId);
    }
  } finally {
    for (const n of made) await nets.release(n).catch(() => {});
    await rm(stateDir, { recursive: true, force: true });
  }
  const accel = KVM ? 'KVM' : 'TCG (software emulation)';
  console.log(`qemu microvm, ${accel}, 1 vCPU, 512 MiB, N=${N}, kernel ${image.kernel!.version}`);
  console.log(`  floor: bare boot to rootfs+network marker (no Node)  ${fmt(results.floor!)}`);
  console.log(`  cold create (to guest /health)                        ${fmt(results.cold!)}`);
  console.log(`  snapshot-restore create (to guest /health)            ${fmt(results.restore!)}`);
  console.log(`  pause + resume (QMP stop/cont)                        ${fmt(results.pauseResume!)}`);
}

await main();
