/**
 * VM guest images: what a VM driver (qemu, firecracker, cloud-hypervisor) boots for a template.
 *
 * - **Root filesystem**: an ext4 image of the template tree with the guest layer (`images.ts`) merged
 *   over it, made with `mkfs.ext4 -d` from a staging copy (no loop mount). Attached read-only as the
 *   first virtio disk; the instance's own disk (`vm-common.ts`) holds the overlay's upper/work.
 * - **Kernel**: Debian 12's cloud kernel, prepared at image build time into the image
 *   (`guest-kernel.ts`: `vmlinuz` for QEMU / Cloud Hypervisor, the ELF `vmlinux` for Firecracker, the
 *   modules the initrd loads); read from there, never fetched at run time.
 * - **initrd** (cpio.gz): busybox-static, the kernel modules the guest needs (virtio_mmio, virtio_blk,
 *   virtio_net, overlay and what they depend on, in load order; ext4 is built into this kernel) and
 *   `/init` ({@link initScript}), which mounts the template image read-only and the instance disk,
 *   stacks them with overlayfs, configures eth0 from the kernel command line, and `switch_root`s to
 *   the guest daemon ({@link GUEST_ARGV}).
 *
 * Cache layout (content-addressed, each built once; a build goes to a temporary name and is renamed):
 * ```
 * <cacheDir>/vm/initrd/<digest>/{initrd.cpio.gz,complete}
 * <cacheDir>/vm/rootfs/<digest>/{rootfs.ext4,complete}
 * ```
 */
import { createHash, randomBytes } from 'node:crypto';
import { createReadStream, existsSync } from 'node:fs';
import { chmod, copyFile, mkdir, rename, rm, writeFile } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';
import type { TemplateImage } from '../drivers/driver.ts';
import { MIB_PER_GUEST_PROCESS, MIN_GUEST_PROCESSES } from '../drivers/gvisor-limits.ts';
import { DEFAULT_IMAGE_ASSETS_DIR, guestKernelDir } from './assets.ts';
import { driverFailed, sh } from './build-exec.ts';
import { findGuestKernel, type GuestKernel } from './guest-kernel.ts';
import { directoryImage, GUEST_ARGV, type GuestLayerInputs, imageDigest } from './images.ts';

/** Bump when the layout of the rootfs image, the initrd or its init changes. */
export const VM_IMAGE_VERSION = 'space-vm-image/2';

/** `/dev/shm` of a VM guest, percent of its memory (as the gVisor driver's shmSizeMiB). */
const SHM_PERCENT = 25;
/** Line `/init` prints on the console when booted with `space.probe=early|late` (then powers off). */
export const BOOT_MARKER = 'SPACE-GUEST-PROBE-OK';
/** Environment the guest daemon starts with (the same as the gVisor OCI spec gives it). */
export const GUEST_ENV = {
  PATH: '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin',
  HOME: '/root',
  LANG: 'C.UTF-8',
} as const;

/** Progress callback for the slow steps (download, decompress, mkfs). */
export type Progress = (message: string) => void;

/** Options of the VM image builders. */
export interface VmImageOptions {
  /** Slow-step progress lines (default: to stderr with a `vm-image:` prefix). */
  progress?: Progress;
  /**
   * Directory of the prepared guest kernel (guest-kernel.ts), default the image's
   * (`/usr/lib/space/guest-kernel`, assets.ts); `<cacheDir>/vm/kernel/*` is the fallback.
   */
  kernelDir?: string;
  /** busybox-static binary copied into the initrd (default /bin/busybox). */
  busybox?: string;
  /** PEM CA added to the image's trust bundle (the gateway's per-deployment CA; see images.ts). */
  trustedCaFile?: string;
  /** Folder of template definitions (default the repo's `templates/`). */
  templatesDir?: string;
}

const defaultProgress: Progress = (m) => process.stderr.write(`vm-image: ${m}\n`);

/** Builds `dir` once: runs `make(tmp)` into a temporary sibling, writes `complete`, renames it. */
const builds = new Map<string, Promise<void>>();
async function buildOnce(dir: string, make: (tmp: string) => Promise<void>): Promise<void> {
  if (existsSync(join(dir, 'complete'))) return;
  let p = builds.get(dir);
  if (!p) {
    p = (async () => {
      const tmp = `${dir}.tmp-${process.pid}-${randomBytes(4).toString('hex')}`;
      await mkdir(tmp, { recursive: true });
      try {
        await make(tmp);
        await writeFile(join(tmp, 'complete'), new Date().toISOString());
        await rm(dir, { recursive: true, force: true });
        await rename(tmp, dir);
      } catch (err) {
        await rm(tmp, { recursive: true, force: true });
        throw err;
      }
    })().finally(() => builds.delete(dir));
    builds.set(dir, p);
  }
  return p;
}

/** Single-quotes `s` for a POSIX shell. Pure. */
export function shQuote(s: string): string {
  return `'${s.replace(/'/g, `'\\''`)}'`;
}

/**
 * The initrd's `/init` (busybox sh). Reads from the kernel command line: `space.rootfs` (template
 * image device, mounted read-only), `space.disk` (instance disk: `upper/`, `work/`), `space.ip`
 * (CIDR of eth0), `space.gw` (default gateway and DNS server), and optionally `space.probe=early`
 * (print {@link BOOT_MARKER} and power off before touching any device) or `space.probe=late` (the
 * same after the root filesystem and network are set up). Any failure prints `space-init: FAILED …`
 * and powers off. Limits, as the gVisor driver sets them: `/dev/shm` a quarter of the memory, each
 * user's tasks `max(MIN_GUEST_PROCESSES, memoryMiB / MIB_PER_GUEST_PROCESS)` (RLIMIT_NPROC), and
 * tini and the guest daemon out of the OOM killer's reach (`oom_score_adj` -1000). Pure.
 */
export function initScript(modules: readonly string[], argv: readonly string[] = GUEST_ARGV): string {
  const env = Object.entries(GUEST_ENV).map(([k, v]) => `${k}=${shQuote(v)}`);
  return `#!/bin/busybox sh
# SPACE guest init (${VM_IMAGE_VERSION}): generated by runtime/agent/vm-image.ts
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
die() { echo "space-init: FAILED: $*"; sync; reboot -f; sleep 5; }
arg() { for w in $(cat /proc/cmdline); do case "$w" in "$1="*) echo "\${w#*=}";; esac; done; }
probe=$(arg space.probe)
if [ "$probe" = early ]; then echo "${BOOT_MARKER}"; reboot -f; fi
for m in ${modules.join(' ')}; do insmod "/lib/modules/$m.ko" || die "insmod $m"; done
rootdev=$(arg space.rootfs); disk=$(arg space.disk); ip=$(arg space.ip); gw=$(arg space.gw)
n=0
while [ ! -b "$rootdev" ] || [ ! -b "$disk" ]; do
  n=$((n + 1)); [ $n -gt 100 ] && die "no $rootdev or $disk"; usleep 100000
done
mkdir -p /mnt/lower /mnt/disk /newroot
mount -t ext4 -o ro "$rootdev" /mnt/lower || die "mount $rootdev"
mount -t ext4 -o nodev,nosuid "$disk" /mnt/disk || die "mount $disk"
mount -t overlay overlay -o lowerdir=/mnt/lower,upperdir=/mnt/disk/upper,workdir=/mnt/disk/work /newroot || die overlay
ip link set lo up
ip addr add "$ip" dev eth0 || die "eth0 $ip"
ip link set eth0 up
ip route add default via "$gw" || die "route via $gw"
rm -f /newroot/etc/resolv.conf
echo "nameserver $gw" > /newroot/etc/resolv.conf
hostname sandbox
echo sandbox > /newroot/etc/hostname
if [ "$probe" = late ]; then echo "${BOOT_MARKER}"; reboot -f; fi
# one process never ends the sandbox: the kernel's OOM killer never picks tini or the guest daemon
# (the daemon gives each command oom_score_adj 0 again), and each user's tasks are bounded (here,
# while /proc is still this init's)
echo -1000 > /proc/self/oom_score_adj
mem=$(awk '/^MemTotal:/ { print int($2 / 1024) }' /proc/meminfo)
nproc=$((mem / ${MIB_PER_GUEST_PROCESS})); [ "$nproc" -lt ${MIN_GUEST_PROCESSES} ] && nproc=${MIN_GUEST_PROCESSES}
ulimit -u "$nproc" || echo "space-init: no process limit"
mkdir -p /newroot/proc /newroot/sys /newroot/dev
mount --move /proc /newroot/proc
mount --move /sys /newroot/sys
mount --move /dev /newroot/dev
mkdir -p /newroot/dev/pts /newroot/dev/shm
mount -t devpts -o nosuid,noexec,gid=5,mode=620,ptmxmode=666 devpts /newroot/dev/pts
mount -t tmpfs -o nosuid,nodev,noexec,size=${SHM_PERCENT}% shm /newroot/dev/shm
exec env -i ${env.join(' ')} switch_root /newroot ${argv.map(shQuote).join(' ')}
`;
}

/** Hex SHA-256 of a file. */
async function fileDigest(path: string): Promise<string> {
  const h = createHash('sha256');
  for await (const chunk of createReadStream(path)) h.update(chunk as Buffer);
  return h.digest('hex');
}

/**
 * The initrd for `kernel` (busybox + modules + {@link initScript}), built once per content digest.
 * @returns absolute path of `initrd.cpio.gz`. @throws SpaceError DRIVER_FAILED (busybox missing, cpio).
 */
export async function guestInitrd(
  cacheDir: string,
  kernel: GuestKernel,
  opts: VmImageOptions = {},
): Promise<string> {
  const busybox = opts.busybox ?? '/bin/busybox';
  if (!existsSync(busybox))
    throw driverFailed(`${busybox} is missing (apt: busybox-static)`, { path: busybox });
  const init = initScript(kernel.modules);
  const digest = createHash('sha256')
    .update(`${VM_IMAGE_VERSION}\n${kernel.package}\n${await fileDigest(busybox)}\n${init}`)
    .digest('hex');
  const dir = join(cacheDir, 'vm', 'initrd', digest);
  await buildOnce(dir, async (tmp) => {
    (opts.progress ?? defaultProgress)(`building initrd ${digest.slice(0, 12)}`);
    const root = join(tmp, 'root');
    for (const d of ['bin', 'dev', 'proc', 'sys', 'mnt', 'lib/modules', 'newroot'])
      await mkdir(join(root, d), { recursive: true });
    await copyFile(busybox, join(root, 'bin', 'busybox'));
    await chmod(join(root, 'bin', 'busybox'), 0o755);
    for (const m of kernel.modules)
      await copyFile(join(kernel.modulesDir, `${m}.ko`), join(root, 'lib/modules', `${m}.ko`));
    await writeFile(join(root, 'init'), init, { mode: 0o755 });
    await sh('sh', [
      '-c',
      'cd "$1" && find . | sort | cpio -o -H newc -R 0:0 --quiet | gzip -9 > "$2"',
      'sh',
      root,
      join(tmp, 'initrd.cpio.gz'),
    ]);
    await rm(root, { recursive: true, force: true });
  });
  return join(dir, 'initrd.cpio.gz');
}

/**
 * The ext4 image of a template tree with the guest layer over it, built once per digest.
 * Size: the tree's bytes × 1.25 + 64 MiB, inodes: its entries × 1.5 + 4096 (the guest writes to
 * its own disk, not here). @returns absolute path of `rootfs.ext4`. @throws SpaceError DRIVER_FAILED.
 */
export async function rootfsImage(
  cacheDir: string,
  digest: string,
  lowerDirs: string[],
  opts: VmImageOptions = {},
): Promise<string> {
  const dir = join(cacheDir, 'vm', 'rootfs', digest);
  await buildOnce(dir, async (tmp) => {
    const progress = opts.progress ?? defaultProgress;
    const staging = join(tmp, 'tree');
    progress(`merging ${lowerDirs.length} layers (template, trust, guest)`);
    // lowest first, so each layer above overwrites what it shares with the ones below
    for (const lower of [...lowerDirs].reverse()) {
      await sh('cp', ['-a', '--reflink=auto', `${lower}/.`, staging]);
    }
    const bytes = Number((await sh('du', ['-sb', staging])).split('\t')[0]);
    const entries = (await sh('find', [staging, '-xdev'])).split('\n').length;
    const sizeMiB = Math.ceil((bytes * 1.25) / 2 ** 20) + 64;
    progress(`mkfs.ext4 -d: ${sizeMiB} MiB, ${entries} entries`);
    await sh('mkfs.ext4', [
      '-q',
      '-F',
      '-L',
      'space-root',
      '-O',
      '^has_journal',
      '-m',
      '0',
      '-N',
      String(Math.ceil(entries * 1.5) + 4096),
      '-E',
      'lazy_itable_init=1',
      '-d',
      staging,
      join(tmp, 'rootfs.ext4'),
      `${sizeMiB}M`,
    ]);
    await rm(staging, { recursive: true, force: true });
  });
  return join(dir, 'rootfs.ext4');
}

/**
 * A template as a VM driver boots it: ext4 image (template + guest layer), guest kernel and initrd.
 * `digest` covers the template definition, the guest layer, the kernel package and the initrd, so a
 * snapshot is only restored onto the exact image it was taken from.
 * @throws SpaceError TEMPLATE_NOT_FOUND / TEMPLATE_NOT_READY (template), DRIVER_FAILED (any build step).
 */
export async function vmImage(
  template: string,
  cacheDir: string,
  inputs: GuestLayerInputs,
  opts: VmImageOptions = {},
): Promise<TemplateImage> {
  const dirImage = await directoryImage(template, cacheDir, inputs, opts.trustedCaFile, opts.templatesDir);
  const rDigest = imageDigest(dirImage.digest, VM_IMAGE_VERSION);
  const kernel = await findGuestKernel(opts.kernelDir ?? guestKernelDir(DEFAULT_IMAGE_ASSETS_DIR), cacheDir);
  const initrd = await guestInitrd(cacheDir, kernel, opts);
  const image = await rootfsImage(cacheDir, rDigest, dirImage.lowerDirs, opts);
  return {
    template,
    digest: imageDigest(rDigest, kernel.package, basename(dirname(initrd))),
    lowerDirs: dirImage.lowerDirs,
    rootfsImage: image,
    kernel: { bzImage: kernel.bzImage, vmlinux: kernel.vmlinux, initrd, version: kernel.version },
    ...(dirImage.start ? { start: dirImage.start } : {}),
  };
}
