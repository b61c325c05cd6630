/**
 * The rehearsal's stand-in for a cloud's stock VM image: a Debian release made by debootstrap with
 * systemd, cloud-init (NoCloud only) and Debian's cloud kernel, as a qcow2 disk plus the kernel and
 * initrd QEMU boots directly. Two releases stand in for the clouds' images:
 * - `bookworm` (Debian 12: Redis 7.0, podman 4.3) for Ubuntu 24.04 (Akamai's default);
 * - `bullseye` (Debian 11: Redis 6.0, podman 3.0) for Ubuntu 22.04 (Crusoe's default), whose
 *   Redis 6.0 is the one that stops at an `include` glob.
 * Ubuntu's exact packages are not rehearsed: only Debian's archive is reachable here.
 *
 * Two things are baked in that a cloud image gets from its cloud: the rehearsal's CA (the registry
 * stand-in's certificate chains to it, as a real registry's chains to a public CA) and an apt proxy
 * (the cloud's mirror: here apt-cacher-ng on the host). Built once per release and CA, cached under
 * `cacheDir`; a build takes a few minutes (debootstrap, then cloud-init from the archive).
 */
import { createHash } from 'node:crypto';
import { existsSync } from 'node:fs';
import { copyFile, mkdir, readdir, readFile, rename, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { REHEARSAL_NET, run } from './host.ts';

/** Debian releases the rehearsal boots. */
export type BaseRelease = 'bookworm' | 'bullseye';

/** A built base: boot these with a copy-on-write overlay of `disk`. */
export interface BaseImage {
  readonly release: BaseRelease;
  /** qcow2, root filesystem (ext4, label `root`) on the whole disk. */
  readonly disk: string;
  readonly kernel: string;
  readonly initrd: string;
}

/** Bumped when what goes into a base changes (part of the cache key). */
const BASE_RECIPE = 'space-rehearse-base/2';

/** Disk size of a VM (sparse qcow2): room for the runtime image, templates and sandboxes. */
const DISK_SIZE = '12G';

/**
 * Returns the base for `release`, building it when the cache lacks it. `caCertPem` is trusted by
 * the image. `mirror` is Debian's archive (`SPACE_DEBIAN_MIRROR` elsewhere). `log` gets progress lines.
 * Throws when debootstrap or apt fails (the error carries their stderr).
 */
export async function baseImage(o: {
  release: BaseRelease;
  cacheDir: string;
  caCertPem: string;
  mirror?: string;
  log?: (line: string) => void;
}): Promise<BaseImage> {
  const mirror = o.mirror ?? 'http://deb.debian.org/debian';
  const key = createHash('sha256')
    .update(`${BASE_RECIPE}\n${o.release}\n${REHEARSAL_NET.hostAddress}\n${o.caCertPem}`)
    .digest('hex')
    .slice(0, 16);
  const dir = join(o.cacheDir, `base-${o.release}-${key}`);
  const image: BaseImage = {
    release: o.release,
    disk: join(dir, 'disk.qcow2'),
    kernel: join(dir, 'vmlinuz'),
    initrd: join(dir, 'initrd.img'),
  };
  if (existsSync(image.disk) && existsSync(image.kernel) && existsSync(image.initrd)) return image;
  await mkdir(o.cacheDir, { recursive: true });
  const work = `${dir}.build`;
  await rm(work, { recursive: true, force: true });
  await mkdir(work, { recursive: true });
  const root = join(work, 'root');
  o.log?.(`base ${o.release}: debootstrap (a few minutes)`);
  await run(
    'debootstrap',
    [
      '--variant=minbase',
      '--include=systemd-sysv,udev,dbus,linux-image-cloud-amd64,initramfs-tools,ifupdown,isc-dhcp-client,iproute2,ca-certificates,netbase,procps,gnupg,locales',
      o.release,
      root,
      mirror,
    ],
    { timeoutMs: 1_200_000 },
  );
  o.log?.(`base ${o.release}: cloud-init`);
  await writeFile(join(root, 'etc/resolv.conf'), await readFile('/etc/resolv.conf', 'utf8'));
  await run('chroot', [root, 'apt-get', 'install', '-y', '--no-install-recommends', 'cloud-init'], {
    timeoutMs: 1_200_000,
    env: { ...process.env, DEBIAN_FRONTEND: 'noninteractive' },
  });
  await configure(root, o.caCertPem);
  o.log?.(`base ${o.release}: initramfs and disk`);
  await run('chroot', [root, 'update-initramfs', '-u', '-k', 'all'], { timeoutMs: 600_000 });
  const boot = await readdir(join(root, 'boot'));
  const vmlinuz = boot.find((f) => f.startsWith('vmlinuz-'));
  const initrd = boot.find((f) => f.startsWith('initrd.img-'));
  if (!vmlinuz || !initrd)
    throw new Error(`base ${o.release}: no kernel or initrd in /boot (${boot.join(', ')})`);
  await copyFile(join(root, 'boot', vmlinuz), join(work, 'vmlinuz'));
  await copyFile(join(root, 'boot', initrd), join(work, 'initrd.img'));
  const raw = join(work, 'disk.raw');
  await run('mkfs.ext4', ['-q', '-L', 'root', '-d', root, raw, DISK_SIZE], { timeoutMs: 600_000 });
  await run('qemu-img', ['convert', '-O', 'qcow2', raw, join(work, 'disk.qcow2')], { timeoutMs: 600_000 });
  await rm(raw);
  await rm(root, { recursive: true, force: true });
  await rm(dir, { recursive: true, force: true });
  await rename(work, dir);
  return image;
}

/** What the cloud's image would carry: NoCloud, the mirror, the CA, a clean identity. */
async function configure(root: string, caCertPem: string): Promise<void> {
  const { hostAddress, aptCachePort } = REHEARSAL_NET;
  await writeFile(join(root, 'etc/fstab'), '/dev/vda / ext4 defaults,discard 0 1\n');
  await writeFile(join(root, 'etc/machine-id'), '');
  await rm(join(root, 'var/lib/dbus/machine-id'), { force: true });
  await writeFile(join(root, 'etc/hostname'), 'localhost\n');
  await writeFile(
    join(root, 'etc/cloud/cloud.cfg.d/90-rehearsal.cfg'),
    'datasource_list: [ NoCloud, None ]\n',
  );
  await writeFile(
    join(root, 'etc/apt/apt.conf.d/01rehearsal-proxy'),
    `Acquire::http::Proxy "http://${hostAddress}:${aptCachePort}";\n`,
  );
  await mkdir(join(root, 'usr/local/share/ca-certificates'), { recursive: true });
  await writeFile(join(root, 'usr/local/share/ca-certificates/space-rehearsal.crt'), caCertPem);
  await run('chroot', [root, 'update-ca-certificates'], { timeoutMs: 120_000 });
  // cloud images ship en_US.UTF-8, which cloud-init's locale module sets by default: without it
  // every first boot logs a failed update-locale that no stack caused
  await writeFile(join(root, 'etc/locale.gen'), 'en_US.UTF-8 UTF-8\n');
  // a persistent journal (journald's Storage=auto keeps one when the folder exists), so a failed
  // rehearsal can read each VM's service logs from its disk afterwards
  await mkdir(join(root, 'var/log/journal'), { recursive: true });
  await run('chroot', [root, 'locale-gen'], { timeoutMs: 300_000 });
  // the resolver comes from the VM's network config at boot
  await rm(join(root, 'etc/resolv.conf'), { force: true });
  await run('chroot', [root, 'apt-get', 'clean'], { timeoutMs: 120_000 });
}
