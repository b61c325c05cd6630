/**
 * The guest kernel of the VM drivers (qemu, firecracker, cloud-hypervisor): Debian 12's cloud
 * kernel, prepared once **at image build time** (`npm run image`, scripts/image-assets.ts) into a
 * directory of the runtime image; the agent only reads that directory, never apt.
 *
 * Preparing it ({@link prepareGuestKernel}): `linux-image-cloud-amd64` is resolved to the versioned
 * package it depends on, fetched with `apt-get download` (or a given `.deb`) and unpacked with
 * `dpkg-deb -x` (never installed as the host's kernel) into:
 * ```
 * <dir>/vmlinuz        bzImage, for QEMU and Cloud Hypervisor
 * <dir>/vmlinux        the ELF kernel inside the bzImage (Firecracker boots only ELF), found by its
 *                      compression magic and inflated with the system tools (the method of Linux's
 *                      own extract-vmlinux script)
 * <dir>/modules/*.ko   the modules the initrd loads ({@link GUEST_MODULES} and their dependencies)
 * <dir>/kernel.json    { version, package, modules }: modules in load order
 * <dir>/complete
 * ```
 * Finding it at run time ({@link findGuestKernel}): the image's directory (`SPACE_IMAGE_ASSETS_DIR`
 * `/guest-kernel`), else a kernel an earlier agent left in `<cacheDir>/vm/kernel/`, else
 * DRIVER_FAILED naming the directory.
 */
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { chmod, copyFile, mkdir, readdir, readFile, rename, rm, writeFile } from 'node:fs/promises';
import { basename, join } from 'node:path';
import { driverFailed, sh } from './build-exec.ts';

/** Debian's metapackage for the cloud kernel (depends on the versioned image package). */
export const GUEST_KERNEL_METAPACKAGE = 'linux-image-cloud-amd64';
/** Modules the guest loads (with their dependencies) when they are not built into the kernel. */
export const GUEST_MODULES = ['virtio_mmio', 'virtio_blk', 'virtio_net', 'overlay'] as const;

/** A prepared guest kernel. */
export interface GuestKernel {
  /** Kernel release, e.g. `6.1.0-57-cloud-amd64`. */
  version: string;
  /** Debian package and version it came from, e.g. `linux-image-6.1.0-57-cloud-amd64_6.1.192-3`. */
  package: string;
  bzImage: string;
  vmlinux: string;
  /** Directory of the guest's module files (`<name>.ko`) copied from the package. */
  modulesDir: string;
  /** Modules to insmod, dependencies first (empty when all are built in). */
  modules: string[];
}

/**
 * The versioned package a kernel metapackage depends on and its candidate version, from apt's
 * cache (`apt-cache depends` / `apt-cache show`), e.g. `{ name: 'linux-image-6.1.0-57-cloud-amd64',
 * version: '6.1.192-3' }`.
 * @throws SpaceError DRIVER_FAILED when apt does not know the package.
 */
export async function resolveKernelPackage(
  meta = GUEST_KERNEL_METAPACKAGE,
): Promise<{ name: string; version: string }> {
  const deps = await sh('apt-cache', ['depends', meta]);
  const name = /Depends:\s*(linux-image-[^\s<>]+)/.exec(deps)?.[1];
  if (!name) throw driverFailed(`apt-cache depends ${meta} names no linux-image package (apt-get update?)`);
  const show = await sh('apt-cache', ['show', '--no-all-versions', name]);
  const version = /^Version:\s*(\S+)/m.exec(show)?.[1];
  if (!version) throw driverFailed(`apt-cache show ${name} gives no version`);
  return { name, version };
}

/** Compression magics a bzImage payload may start with, and the tool that inflates each. */
const PAYLOAD_FORMATS: { magic: Buffer; cmd: string; args: string[] }[] = [
  { magic: Buffer.from([0x1f, 0x8b, 0x08]), cmd: 'gzip', args: ['-dc'] },
  { magic: Buffer.from([0xfd, 0x37, 0x7a, 0x58, 0x5a, 0x00]), cmd: 'xz', args: ['-dc'] },
  { magic: Buffer.from([0x28, 0xb5, 0x2f, 0xfd]), cmd: 'zstd', args: ['-dc'] },
  { magic: Buffer.from([0x02, 0x21, 0x4c, 0x18]), cmd: 'lz4', args: ['-dc'] },
];

const ELF_MAGIC = Buffer.from([0x7f, 0x45, 0x4c, 0x46]);

/** Runs `cmd args` with `input` on stdin; resolves its stdout (whatever the exit status). */
function inflate(cmd: string, args: string[], input: Buffer): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { stdio: ['pipe', 'pipe', 'ignore'] });
    const chunks: Buffer[] = [];
    child.stdout.on('data', (c: Buffer) => chunks.push(c));
    child.on('error', reject);
    child.on('close', () => resolve(Buffer.concat(chunks)));
    child.stdin.on('error', () => {}); // the tool may stop reading at the end of its stream
    child.stdin.end(input);
  });
}

/**
 * The uncompressed ELF kernel inside a bzImage: tries each offset where a known compression magic
 * occurs and keeps the first output that is an ELF file (trailing data after the compressed stream
 * makes some tools exit non-zero; their output still counts).
 * @throws SpaceError DRIVER_FAILED when no payload inflates to an ELF image.
 */
export async function extractVmlinux(bzImage: Buffer): Promise<Buffer> {
  const tried: string[] = [];
  for (const f of PAYLOAD_FORMATS) {
    for (let at = bzImage.indexOf(f.magic); at >= 0; at = bzImage.indexOf(f.magic, at + 1)) {
      tried.push(`${f.cmd}@${at}`);
      const out = await inflate(f.cmd, f.args, bzImage.subarray(at)).catch(() => Buffer.alloc(0));
      if (out.length > 1024 * 1024 && out.subarray(0, 4).equals(ELF_MAGIC)) return out;
    }
  }
  throw driverFailed(
    `no compressed ELF kernel found in the bzImage (tried ${tried.join(', ') || 'nothing'})`,
  );
}

/** `depends=` of a kernel module file (its `.modinfo` strings), as module names. Pure. */
export function moduleDepends(ko: Buffer): string[] {
  const at = ko.indexOf('\0depends=');
  if (at < 0) return [];
  const start = at + '\0depends='.length;
  const value = ko.subarray(start, ko.indexOf(0, start)).toString('latin1');
  return value ? value.split(',').map((m) => m.replace(/-/g, '_')) : [];
}

/**
 * Modules to load for `wanted`, dependencies first, leaving out built-in ones. Pure.
 * @param paths module name → path relative to the modules dir (from `modules.order`).
 * @param builtin names of built-in modules (from `modules.builtin`).
 * @param depends module name → its `depends=` list.
 * @throws Error when a wanted module (or a dependency) is neither built in nor shipped.
 */
export function moduleLoadOrder(
  wanted: readonly string[],
  paths: Map<string, string>,
  builtin: Set<string>,
  depends: (name: string) => string[],
): string[] {
  const order: string[] = [];
  const seen = new Set<string>();
  const visit = (m: string, chain: string[]) => {
    if (seen.has(m) || builtin.has(m)) return;
    if (chain.includes(m)) throw new Error(`module dependency cycle: ${[...chain, m].join(' → ')}`);
    if (!paths.has(m)) throw new Error(`kernel module ${m} is neither built in nor in the package`);
    for (const d of depends(m)) visit(d, [...chain, m]);
    seen.add(m);
    order.push(m);
  };
  for (const m of wanted) visit(m, []);
  return order;
}

/** Module name of a `kernel/…/name.ko` path, `-` normalised to `_`. Pure. */
function moduleName(path: string): string {
  return basename(path.trim())
    .replace(/\.ko(\.\w+)?$/, '')
    .replace(/-/g, '_');
}

/**
 * The guest kernel prepared in `dir` (see the module doc), or null when `dir` holds none
 * (no `complete` marker).
 */
export async function readGuestKernel(dir: string): Promise<GuestKernel | null> {
  if (!existsSync(join(dir, 'complete'))) return null;
  const meta = JSON.parse(await readFile(join(dir, 'kernel.json'), 'utf8')) as {
    version: string;
    package: string;
    modules: string[];
  };
  return {
    ...meta,
    bzImage: join(dir, 'vmlinuz'),
    vmlinux: join(dir, 'vmlinux'),
    modulesDir: join(dir, 'modules'),
  };
}

/**
 * The guest kernel a VM driver boots: the one prepared in `kernelDir` (the image's), else the
 * newest one in `<cacheDir>/vm/kernel/` (left by an agent before kernels were baked). Reads files
 * only: no apt, no network.
 * @throws SpaceError DRIVER_FAILED naming `kernelDir` when neither holds a kernel.
 */
export async function findGuestKernel(kernelDir: string, cacheDir: string): Promise<GuestKernel> {
  const baked = await readGuestKernel(kernelDir);
  if (baked) return baked;
  const root = join(cacheDir, 'vm', 'kernel');
  const cached = (await readdir(root).catch(() => [] as string[]))
    .filter((d) => existsSync(join(root, d, 'complete')))
    .sort();
  if (cached.length) return (await readGuestKernel(join(root, cached.at(-1)!)))!;
  throw driverFailed(
    `no guest kernel in ${kernelDir} (the runtime image bakes it there; on a host without the image, ` +
      `\`space up\` prepares one in ${join(cacheDir, 'vm', 'kernel')}, or run ` +
      `\`node scripts/image-assets.ts --kernel ${kernelDir}\`; SPACE_IMAGE_ASSETS_DIR moves it)`,
    { path: kernelDir },
  );
}

/**
 * For a host without the runtime image (tests, benchmarks, a development machine): the guest
 * kernel as {@link findGuestKernel} finds it, else prepared with apt ({@link prepareGuestKernel})
 * into `<cacheDir>/vm/kernel/<package>`, where the agent's fallback finds it. Build-time work, as a
 * template build is: the agent itself never calls this.
 * @throws SpaceError DRIVER_FAILED (apt, dpkg-deb, extraction).
 */
export async function ensureGuestKernel(kernelDir: string, cacheDir: string): Promise<GuestKernel> {
  try {
    return await findGuestKernel(kernelDir, cacheDir);
  } catch {}
  const { name, version } = await resolveKernelPackage();
  return prepareGuestKernel(join(cacheDir, 'vm', 'kernel', `${name}_${version}`));
}

/**
 * Prepares the guest kernel into `dir` (layout in the module doc) from `deb`, or from the package
 * apt resolves for {@link GUEST_KERNEL_METAPACKAGE} (`apt-get download`: needs apt lists, so build
 * time only). Written to a temporary sibling and renamed. Returns the kernel.
 * @throws SpaceError DRIVER_FAILED (apt, dpkg-deb, extraction or a missing module).
 */
export async function prepareGuestKernel(
  dir: string,
  opts: { deb?: string; progress?: (message: string) => void } = {},
): Promise<GuestKernel> {
  const progress = opts.progress ?? (() => {});
  const tmp = `${dir}.tmp-${process.pid}`;
  await rm(tmp, { recursive: true, force: true });
  await mkdir(tmp, { recursive: true });
  try {
    let deb = opts.deb;
    if (!deb) {
      const { name, version } = await resolveKernelPackage();
      progress(`downloading ${name} ${version} (apt-get download)`);
      await chmod(tmp, 0o755); // apt's sandbox user must be able to write here
      await sh('apt-get', ['download', '-q', `${name}=${version}`], { cwd: tmp });
      deb = join(tmp, (await readdir(tmp)).find((f) => f.endsWith('.deb'))!);
    }
    const pkg = basename(deb).replace(/(_[^_]*)?\.deb$/, '');
    progress(`unpacking ${basename(deb)}`);
    const x = join(tmp, 'x');
    await sh('dpkg-deb', ['-x', deb, x]);
    const vmlinuz = (await readdir(join(x, 'boot'))).find((f) => f.startsWith('vmlinuz-'));
    if (!vmlinuz) throw driverFailed(`${basename(deb)} holds no /boot/vmlinuz-*`);
    const version = vmlinuz.slice('vmlinuz-'.length);
    await copyFile(join(x, 'boot', vmlinuz), join(tmp, 'vmlinuz'));
    progress(`extracting the ELF vmlinux from ${vmlinuz}`);
    await writeFile(join(tmp, 'vmlinux'), await extractVmlinux(await readFile(join(tmp, 'vmlinuz'))));
    const modRoot = join(x, 'lib', 'modules', version);
    const order = (await readFile(join(modRoot, 'modules.order'), 'utf8')).split('\n').filter(Boolean);
    const paths = new Map(order.map((p) => [moduleName(p), p]));
    const builtin = new Set(
      (await readFile(join(modRoot, 'modules.builtin'), 'utf8').catch(() => ''))
        .split('\n')
        .filter(Boolean)
        .map(moduleName),
    );
    const deps = new Map<string, string[]>();
    // read `depends=` lazily: only the modules on the way are opened
    const files = new Map<string, Buffer>();
    const load = async (m: string) => {
      if (files.has(m) || !paths.has(m)) return;
      const buf = await readFile(join(modRoot, paths.get(m)!));
      files.set(m, buf);
      deps.set(m, moduleDepends(buf));
      for (const d of deps.get(m)!) await load(d);
    };
    for (const m of GUEST_MODULES) await load(m);
    let modules: string[];
    try {
      modules = moduleLoadOrder(GUEST_MODULES, paths, builtin, (m) => deps.get(m) ?? []);
    } catch (err) {
      throw driverFailed(`${pkg}: ${(err as Error).message}`, { package: pkg }, err);
    }
    await mkdir(join(tmp, 'modules'));
    for (const m of modules) await writeFile(join(tmp, 'modules', `${m}.ko`), files.get(m)!);
    await writeFile(join(tmp, 'kernel.json'), JSON.stringify({ version, package: pkg, modules }));
    await rm(x, { recursive: true, force: true });
    if (!opts.deb) await rm(deb, { force: true });
    await writeFile(join(tmp, 'complete'), new Date().toISOString());
    await rm(dir, { recursive: true, force: true });
    await rename(tmp, dir);
  } catch (err) {
    await rm(tmp, { recursive: true, force: true });
    throw err;
  }
  return (await readGuestKernel(dir))!;
}
