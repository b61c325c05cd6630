/**
 * What every VM driver (qemu, firecracker, cloud-hypervisor) shares: the per-instance writable disk
 * and the guest kernel command line. A VM boots the image's kernel and initrd; the initrd's init
 * mounts the template image (first virtio disk, read-only) under the instance's own disk (second
 * virtio disk: overlay upper/work) and starts the guest daemon. See `images.ts` and `vm-image.ts`.
 *
 * The guest's per-instance secret travels in the instance's own disk (`upper/opt/space/guest-token`,
 * mode 0400, deleted by the guest once read): never on the kernel command line, which every
 * process in the guest can read in `/proc/cmdline`.
 */
import { chmod, mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { SpaceError } from '../../core/errors.ts';
import { hostExec } from '../host/host-exec.ts';
import { GUEST_PATHS } from '../image/images.ts';
import { GUEST_NET } from './driver.ts';

const run = hostExec;

/** Device order every VM driver attaches: template image first (read-only), instance disk second. */
export const VM_DISKS = { rootfs: '/dev/vda', disk: '/dev/vdb' } as const;

/**
 * Makes the instance's writable disk: a sparse ext4 image of `sizeMiB` holding the overlay's
 * `upper/` (with the guest token) and `work/`. No loop mount: `mkfs.ext4 -d` fills it from a
 * staging directory.
 * @throws SpaceError DRIVER_FAILED when mkfs fails.
 */
export async function makeInstanceDisk(path: string, sizeMiB: number, guestToken: string): Promise<void> {
  const staging = await mkdtemp(join(tmpdir(), 'space-disk-'));
  try {
    const tokenFile = join(staging, 'upper', GUEST_PATHS.token.slice(1));
    await mkdir(join(staging, 'work'), { recursive: true });
    await mkdir(join(tokenFile, '..'), { recursive: true });
    await writeFile(tokenFile, guestToken, { mode: 0o400 });
    await chmod(join(staging, 'upper'), 0o755);
    await run('mkfs.ext4', [
      '-q',
      '-F',
      '-O',
      '^has_journal',
      '-E',
      'lazy_itable_init=1,root_owner=0:0',
      '-d',
      staging,
      path,
      `${sizeMiB}M`,
    ]);
  } catch (err) {
    const e = err as { stderr?: string; message: string };
    throw new SpaceError(
      'DRIVER_FAILED',
      `cannot make instance disk ${path}: ${(e.stderr || e.message).trim()}`,
      {
        path,
      },
    );
  } finally {
    await rm(staging, { recursive: true, force: true });
  }
}

/**
 * The guest kernel command line (same for every VMM; `extra` appends VMM-specific parameters such
 * as QEMU microvm's virtio-mmio device list). Holds no secret. Pure.
 */
export function vmKernelCmdline(extra: string[] = []): string {
  return [
    'console=ttyS0',
    'reboot=k',
    'panic=1',
    'quiet',
    'rdinit=/init',
    `space.rootfs=${VM_DISKS.rootfs}`,
    `space.disk=${VM_DISKS.disk}`,
    `space.ip=${GUEST_NET.guestAddress}/${GUEST_NET.prefixLength}`,
    `space.gw=${GUEST_NET.gatewayAddress}`,
    ...extra,
  ].join(' ');
}
