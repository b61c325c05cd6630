/**
 * Prepares the `app/` part of the image build context (see Containerfile): the runtime's sources
 * and exactly the packages `npm ci --omit=dev` would install, copied from this checkout's
 * node_modules (offline, and the versions the lockfile pins: a mismatch stops the build).
 *
 * The dependency sets are split in package.json: `dependencies` is what the runtime imports (a
 * node or the image installs only these); the Pulumi programs, their packages and the tooling are
 * `devDependencies`. `productionPackages` reads that split from package-lock.json, where npm marks
 * every package reachable only from devDependencies with `"dev": true`.
 *
 * Usage: node scripts/image-context.ts <out-dir>
 */
import { cpSync, existsSync, mkdirSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = fileURLToPath(new URL('..', import.meta.url));

/** One `packages` entry of a v3 package-lock.json. */
interface LockEntry {
  readonly version?: string;
  readonly dev?: boolean;
  readonly optional?: boolean;
  readonly devOptional?: boolean;
  readonly link?: boolean;
}

/**
 * The lockfile paths (`node_modules/…`) `npm ci --omit=dev` installs: every package not marked
 * `dev` nor `devOptional` (npm's own omit rule, npm docs "package-lock.json": `dev`, `optional`,
 * `devOptional` flags). Pure.
 */
export function productionPackages(lock: { packages: Record<string, LockEntry> }): string[] {
  return Object.entries(lock.packages)
    .filter(([path, e]) => path.startsWith('node_modules/') && !e.dev && !e.devOptional && !e.link)
    .map(([path]) => path)
    .sort();
}

/** The package name of an import specifier (`@scope/name/sub` → `@scope/name`), or null for built-ins and paths. */
export function packageOf(specifier: string): string | null {
  if (specifier.startsWith('.') || specifier.startsWith('/') || specifier.startsWith('node:')) return null;
  const parts = specifier.split('/');
  return specifier.startsWith('@') ? parts.slice(0, 2).join('/') : parts[0]!;
}

/** Files under `dir` (relative to ROOT) that the image carries: sources, not tests (`*.test.ts`) nor test fixtures (`test-*.ts`). */
export function runtimeFiles(dir = join(ROOT, 'runtime')): string[] {
  const out: string[] = [];
  for (const name of readdirSync(dir)) {
    const p = join(dir, name);
    if (statSync(p).isDirectory()) out.push(...runtimeFiles(p));
    else if (!/\.test\.ts$|^test-[\w-]+\.ts$/.test(name)) out.push(relative(ROOT, p));
  }
  return out.sort();
}

/** Copies the app into `out/app`: package files, runtime/, templates/, production node_modules. */
export function writeAppContext(out: string): { files: number; packages: number } {
  const app = join(out, 'app');
  mkdirSync(app, { recursive: true });
  for (const f of ['package.json', 'package-lock.json']) cpSync(join(ROOT, f), join(app, f));
  const files = runtimeFiles();
  for (const f of files) {
    mkdirSync(join(app, f, '..'), { recursive: true });
    cpSync(join(ROOT, f), join(app, f));
  }
  cpSync(join(ROOT, 'templates'), join(app, 'templates'), { recursive: true });
  const lock = JSON.parse(readFileSync(join(ROOT, 'package-lock.json'), 'utf8')) as {
    packages: Record<string, LockEntry>;
  };
  const problems: string[] = [];
  let packages = 0;
  for (const path of productionPackages(lock)) {
    const src = join(ROOT, path);
    const entry = lock.packages[path]!;
    if (!existsSync(src)) {
      // an optional package for another platform is absent by design
      if (!entry.optional) problems.push(`${path}: missing (run npm ci)`);
      continue;
    }
    const have = (JSON.parse(readFileSync(join(src, 'package.json'), 'utf8')) as { version: string }).version;
    if (entry.version && have !== entry.version)
      problems.push(`${path}: ${have} installed, lockfile pins ${entry.version} (run npm ci)`);
    // nested node_modules are lockfile entries of their own: copy each package without them
    cpSync(src, join(app, path), {
      recursive: true,
      filter: (s) => !relative(src, s).split('/').includes('node_modules'),
    });
    packages++;
  }
  if (problems.length)
    throw new Error(
      `image context: node_modules does not match package-lock.json:\n  ${problems.join('\n  ')}`,
    );
  return { files: files.length, packages };
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  const out = process.argv[2];
  if (!out) {
    console.error('usage: node scripts/image-context.ts <out-dir>');
    process.exit(2);
  }
  const { files, packages } = writeAppContext(out);
  console.log(`image context: ${files} runtime files, ${packages} production packages in ${out}/app`);
}
