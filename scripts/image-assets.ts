/**
 * The build-time half of the runtime image (`npm run image`, scripts/image.sh): everything a node
 * would otherwise fetch at run time, prepared once on the build machine and put into the build
 * context (see Containerfile):
 *
 * - `assets.tar` → `/usr/lib/space` (runtime/agent/image/assets.ts): the guest kernel of the VM
 *   drivers (`guest-kernel/`, Debian's cloud kernel fetched with apt and unpacked by
 *   runtime/agent/image/guest-kernel.ts) and the templates `--templates` names (default `base`)
 *   built as the agent builds them (debootstrap; `templates/<name>/<digest>/`). Cached in `<cache>/assets`, the tarball
 *   in `<cache>/assets-<key>.tar` (deterministic, so buildah's layer cache holds across builds).
 * - `vmm/` → `/usr/local/bin`: Firecracker + jailer and Cloud Hypervisor, downloaded from their
 *   release pages at the versions pinned in scripts/vmm-releases.json, each checked against its
 *   pinned SHA-256 (a pin without one fails the build; nothing is skipped silently), cached in
 *   `<cache>/vmm/<sha256>`. `--offline` (or `SPACE_IMAGE_OFFLINE=1`) builds without them. Binaries
 *   given by path (`SPACE_FIRECRACKER_BINARY`, `SPACE_JAILER_BINARY`,
 *   `SPACE_CLOUD_HYPERVISOR_BINARY`) are used as given instead.
 * - `labels`: `key=value` lines for `buildah build --label`: `dev.space.vmms` (the drivers the
 *   image can run, e.g. `gvisor,qemu`), `dev.space.offline`, `dev.space.guest-kernel`.
 *
 * Usage: node scripts/image-assets.ts --cache <dir> --out <context-dir> [--offline] [--require <drivers>]
 *          [--templates base,code-interpreter-v1]
 *        node scripts/image-assets.ts --kernel <dir>   (only the guest kernel, e.g. on a bare host)
 * `--require firecracker,cloud-hypervisor` fails unless the image gets those drivers (the stacks'
 * `space:imageVmms` when `space:imageBuild` builds it).
 */
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { createReadStream, existsSync, readFileSync } from 'node:fs';
import { chmod, copyFile, link, mkdir, rename, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { guestKernelDir } from '../runtime/agent/image/assets.ts';
import {
  prepareGuestKernel,
  readGuestKernel,
  resolveKernelPackage,
} from '../runtime/agent/image/guest-kernel.ts';
import { buildTemplate, listTemplateDefinitions } from '../runtime/agent/image/templates.ts';
import { DRIVER_NAMES, type DriverName } from '../runtime/core/drivers.ts';

/** The VMMs the image can fetch (drivers that need a binary Debian does not ship). */
export const FETCHED_VMMS = ['firecracker', 'cloud-hypervisor'] as const;
export type FetchedVmm = (typeof FETCHED_VMMS)[number];

/** One pinned release (scripts/vmm-releases.json). */
export interface VmmRelease {
  readonly version: string;
  /** The release asset (https). */
  readonly url: string;
  /** Hex SHA-256 of the asset, as published with the release; empty = not filled in yet. */
  readonly sha256: string;
  /** Binary name in /usr/local/bin → its path inside the asset (a .tgz), or '' when the asset is the binary. */
  readonly binaries: Readonly<Record<string, string>>;
}

/** The binaries each fetched driver needs in /usr/local/bin (where the agent's defaults look). */
export const VMM_BINARIES: Readonly<Record<FetchedVmm, readonly string[]>> = {
  firecracker: ['firecracker', 'jailer'],
  'cloud-hypervisor': ['cloud-hypervisor'],
};

/** The file the pins live in. */
export const VMM_RELEASES_FILE = fileURLToPath(new URL('./vmm-releases.json', import.meta.url));

/**
 * Reads and checks the pins: every fetched VMM present, an https URL, its binaries named, and a
 * 64-hex-digit sha256. Returns the releases and the problems (one line each; a pin without a
 * checksum is a problem, so an online build fails on it). Pure apart from reading `file`.
 */
export function readVmmReleases(file = VMM_RELEASES_FILE): {
  releases: Partial<Record<FetchedVmm, VmmRelease>>;
  problems: string[];
} {
  const doc = JSON.parse(readFileSync(file, 'utf8')) as Record<string, unknown>;
  const releases: Partial<Record<FetchedVmm, VmmRelease>> = {};
  const problems: string[] = [];
  for (const name of FETCHED_VMMS) {
    const r = doc[name] as VmmRelease | undefined;
    if (!r || typeof r !== 'object') {
      problems.push(`${name}: no pin`);
      continue;
    }
    if (typeof r.version !== 'string' || !r.version) problems.push(`${name}: no version`);
    if (typeof r.url !== 'string' || !r.url.startsWith('https://'))
      problems.push(`${name}: url must be https://`);
    const missing = VMM_BINARIES[name].filter((b) => typeof r.binaries?.[b] !== 'string');
    if (missing.length) problems.push(`${name}: binaries lacks ${missing.join(', ')}`);
    if (typeof r.sha256 !== 'string' || !/^[0-9a-f]{64}$/.test(r.sha256))
      problems.push(
        `${name} ${r.version}: no sha256 pinned (fill in the published checksum of ${r.url}; or build with --offline)`,
      );
    releases[name] = r;
  }
  return { releases, problems };
}

/** Hex SHA-256 of a file. */
export async function sha256File(path: string): Promise<string> {
  const h = createHash('sha256');
  for await (const chunk of createReadStream(path)) h.update(chunk as Buffer);
  return h.digest('hex');
}

/** Downloads `url` to `dest` (redirects followed). @throws Error on a non-2xx answer. */
async function download(url: string, dest: string): Promise<void> {
  const res = await fetch(url, { redirect: 'follow' });
  if (!res.ok) throw new Error(`GET ${url}: ${res.status} ${res.statusText}`);
  await writeFile(dest, Buffer.from(await res.arrayBuffer()));
}

/**
 * The release's asset in `<cacheDir>/vmm/<sha256>` (downloaded with `fetchTo` when absent), after
 * checking its SHA-256 against the pin; then its binaries unpacked into `outDir` (mode 0755).
 * @returns the binary names written. @throws Error when the pin has no checksum, or the download's
 *   checksum differs (the file is removed, nothing is unpacked).
 */
export async function fetchVmm(
  name: FetchedVmm,
  rel: VmmRelease,
  cacheDir: string,
  outDir: string,
  fetchTo: (url: string, dest: string) => Promise<void> = download,
): Promise<string[]> {
  if (!/^[0-9a-f]{64}$/.test(rel.sha256))
    throw new Error(`${name} ${rel.version}: no sha256 pinned in scripts/vmm-releases.json`);
  const dir = join(cacheDir, 'vmm');
  await mkdir(dir, { recursive: true });
  const asset = join(dir, rel.sha256);
  if (!existsSync(asset)) {
    const tmp = `${asset}.part-${process.pid}`;
    await fetchTo(rel.url, tmp);
    const got = await sha256File(tmp);
    if (got !== rel.sha256) {
      await rm(tmp, { force: true });
      throw new Error(`${name} ${rel.version}: ${rel.url} has sha256 ${got}, the pin says ${rel.sha256}`);
    }
    await rename(tmp, asset);
  } else if ((await sha256File(asset)) !== rel.sha256) {
    await rm(asset, { force: true });
    throw new Error(`${name}: cached ${asset} does not match its checksum (removed; build again)`);
  }
  await mkdir(outDir, { recursive: true });
  const written: string[] = [];
  for (const [bin, member] of Object.entries(rel.binaries)) {
    const dest = join(outDir, bin);
    if (member === '') await copyFile(asset, dest);
    else {
      const x = join(dir, `${rel.sha256}.x`);
      await mkdir(x, { recursive: true });
      execFileSync('tar', ['-xzf', asset, '-C', x, member]);
      await copyFile(join(x, member), dest);
      await rm(x, { recursive: true, force: true });
    }
    await chmod(dest, 0o755);
    written.push(bin);
  }
  return written;
}

/** The drivers an image with `binaries` in /usr/local/bin can run (gVisor and QEMU come with host-deps.sh). Pure. */
export function imageVmms(binaries: ReadonlySet<string>): DriverName[] {
  return DRIVER_NAMES.filter(
    (d) =>
      !(FETCHED_VMMS as readonly string[]).includes(d) ||
      VMM_BINARIES[d as FetchedVmm].every((b) => binaries.has(b)),
  );
}

/** Paths given by hand (`SPACE_*_BINARY`), by binary name. */
const GIVEN: Record<string, string> = {
  firecracker: 'SPACE_FIRECRACKER_BINARY',
  jailer: 'SPACE_JAILER_BINARY',
  'cloud-hypervisor': 'SPACE_CLOUD_HYPERVISOR_BINARY',
};

/** Puts the VMM binaries into `<out>/vmm`; returns the binary names there. */
async function vmmStep(cache: string, out: string, offline: boolean): Promise<Set<string>> {
  const vmmDir = join(out, 'vmm');
  await mkdir(vmmDir, { recursive: true });
  const have = new Set<string>();
  for (const [bin, env] of Object.entries(GIVEN)) {
    const src = process.env[env];
    if (!src) continue;
    await copyFile(src, join(vmmDir, bin));
    await chmod(join(vmmDir, bin), 0o755);
    have.add(bin);
    console.error(`image: ${bin} from ${src} (${env}: used as given, not checked against a pin)`);
  }
  if (offline) {
    console.error('image: offline build: no VMM downloads (the image records dev.space.vmms)');
    return have;
  }
  const { releases, problems } = readVmmReleases();
  const needed = FETCHED_VMMS.filter((n) => !VMM_BINARIES[n].every((b) => have.has(b)));
  const blocking = problems.filter((p) => needed.some((n) => p.startsWith(`${n}`)));
  if (blocking.length) throw new Error(`scripts/vmm-releases.json:\n  ${blocking.join('\n  ')}`);
  for (const n of needed) {
    for (const b of await fetchVmm(n, releases[n]!, cache, vmmDir)) have.add(b);
    console.error(`image: ${n} ${releases[n]!.version} (sha256 checked)`);
  }
  return have;
}

/**
 * Templates the image bakes unless `--templates` (or `SPACE_IMAGE_TEMPLATES`) names others: `base`.
 * `code-interpreter-v1` is left out (1.7 GB and ~3 min of debootstrap + apt): a node builds it
 * when it is a warm template (SPACE_BUILD_TEMPLATES=warm) or with `space template build`.
 */
export const DEFAULT_IMAGE_TEMPLATES = ['base'];

/** The guest kernel (reused while apt names the same package) and `templates`, as one tarball. */
async function assetsStep(cache: string, out: string, templates: readonly string[]): Promise<string> {
  const root = join(cache, 'assets');
  const kdir = guestKernelDir(root);
  const { name, version } = await resolveKernelPackage();
  const have = await readGuestKernel(kdir);
  const kernel =
    have?.package === `${name}_${version}`
      ? have
      : await prepareGuestKernel(kdir, { progress: (m) => console.error(`image: kernel: ${m}`) });
  const members = ['guest-kernel'];
  const defined = await listTemplateDefinitions();
  const unknown = templates.filter((t) => !defined.includes(t));
  if (unknown.length) throw new Error(`no template definition for ${unknown.join(', ')} (--templates)`);
  for (const t of templates) {
    const built = await buildTemplate(t, {
      cacheDir: root,
      onProgress: (m) => console.error(`image: ${m}`),
    });
    members.push(`templates/${t}/${built.digest}`);
  }
  const key = createHash('sha256')
    .update(`${kernel.package}\n${members.join('\n')}`)
    .digest('hex');
  const tar = join(cache, `assets-${key.slice(0, 16)}.tar`);
  if (!existsSync(tar)) {
    console.error(`image: packing ${members.join(', ')}`);
    execFileSync('tar', [
      '--sort=name',
      '--mtime=@0',
      '--numeric-owner',
      '-C',
      root,
      '-cf',
      `${tar}.tmp`,
      ...members,
    ]);
    await rename(`${tar}.tmp`, tar);
  }
  await link(tar, join(out, 'assets.tar')).catch(() => copyFile(tar, join(out, 'assets.tar')));
  return kernel.package;
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  const { values } = parseArgs({
    options: {
      cache: { type: 'string' },
      out: { type: 'string' },
      offline: { type: 'boolean', default: process.env['SPACE_IMAGE_OFFLINE'] === '1' },
      require: { type: 'string', default: '' },
      kernel: { type: 'string' },
      templates: {
        type: 'string',
        default: process.env['SPACE_IMAGE_TEMPLATES'] || DEFAULT_IMAGE_TEMPLATES.join(','),
      },
    },
  });
  try {
    if (values.kernel) {
      const k = await prepareGuestKernel(values.kernel, { progress: (m) => console.error(m) });
      console.log(`guest kernel ${k.version} (${k.package}) in ${values.kernel}`);
      process.exit(0);
    }
    if (!values.cache || !values.out)
      throw new Error('usage: image-assets.ts --cache <dir> --out <dir> [--offline]');
    const kernelPackage = await assetsStep(
      values.cache,
      values.out,
      values.templates.split(',').filter(Boolean),
    );
    const vmms = imageVmms(await vmmStep(values.cache, values.out, values.offline));
    const required = values.require.split(',').filter(Boolean);
    const lacking = required.filter((d) => !(vmms as string[]).includes(d));
    if (lacking.length)
      throw new Error(
        `the image must carry ${lacking.join(', ')} (--require / space:imageVmms) but has ${vmms.join(', ')}${values.offline ? ' (offline build)' : ''}`,
      );
    const labels = [
      `dev.space.vmms=${vmms.join(',')}`,
      `dev.space.offline=${values.offline}`,
      `dev.space.guest-kernel=${kernelPackage}`,
    ];
    await writeFile(join(values.out, 'labels'), `${labels.join('\n')}\n`);
    console.error(`image: ${labels.join(' ')}`);
  } catch (err) {
    console.error(`image: ${(err as Error).message}`);
    process.exit(1);
  }
}
