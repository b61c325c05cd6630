/**
 * Guest images: what a driver boots for a template. A built template (`templates.ts`, a Debian tree
 * from debootstrap) is paired with the *guest layer* — the guest daemon's source, the Node runtime
 * it runs on and tini as PID 1, under `/opt/space` — so a sandbox's root filesystem holds everything
 * the guest needs and nothing is mounted from the host.
 *
 * Cache layout (per node, content-addressed, rebuilt only when an input changes):
 * ```
 * <cacheDir>/guest/<digest>/layer/opt/space/bin/{node,tini}
 * <cacheDir>/guest/<digest>/layer/opt/space/runtime/guest/main.cjs   the guest daemon, one file
 * <cacheDir>/guest/<digest>/complete
 * ```
 * The guest layer's digest covers the bytes of every file in it, so a changed guest daemon or a new
 * Node gives a new layer without rebuilding the (slow, debootstrap) template.
 *
 * The guest daemon goes in as one CommonJS file bundled by esbuild from `runtime/guest/main.ts` and
 * the modules it imports. Run from its TypeScript sources, every sandbox's Node would load its type
 * stripper (a WebAssembly module) and the ES-module loader at start and keep both: an idle gVisor
 * sandbox held 63 MiB by its memory cgroup that way against 34 MiB as plain ES modules and ~28 MiB
 * as one CommonJS file (`space bench density`; a bare `sleep` in a sandbox holds ~12 MiB).
 */
import { createHash, randomBytes } from 'node:crypto';
import { createReadStream, existsSync } from 'node:fs';
import { chmod, copyFile, mkdir, readFile, rename, rm, writeFile } from 'node:fs/promises';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { build as esbuild, version as esbuildVersion } from 'esbuild';
import { SpaceError } from '../../core/errors.ts';
import type { TemplateImage } from '../drivers/driver.ts';
import { loadTemplateDefinition, resolveTemplate, templateStart } from './templates.ts';

/** Bump when the guest layer's layout changes. */
export const GUEST_LAYER_VERSION = 'space-guest-layer/2';

/** The repository's `runtime/` folder (the guest's sources are taken from here). */
export const RUNTIME_DIR = fileURLToPath(new URL('../../', import.meta.url));

/** Where the guest layer puts things inside the sandbox. */
export const GUEST_PATHS = {
  node: '/opt/space/bin/node',
  tini: '/opt/space/bin/tini',
  main: '/opt/space/runtime/guest/main.cjs',
  /** The per-instance secret (root-only, deleted by the guest once read). */
  token: '/opt/space/guest-token',
} as const;

/**
 * V8 flags of the guest daemon's Node: an idle daemon holds less memory (issue 9's density target,
 * ≤ 30 MiB per idle gVisor sandbox). `--jitless --lite-mode` run JavaScript in the interpreter only
 * (no optimising compiler, no executable memory); `--single-threaded` and `--v8-pool-size=0` keep
 * V8 from starting background threads (0: sized from the CPUs the guest sees); a 1 MiB young
 * generation touches fewer pages. Measured in one session, A B A B, `npm run bench -- density`
 * (8 idle sandboxes, cgroup usage p50) then `npm run bench -- exec`, each on its own stack:
 * without the flags 31.2 / 31.1 MiB, exec round trip p50 211 / 170 ms, stdout stream 5.7 / 5.7 MiB/s;
 * with them 29.1 / 29.4 MiB, 179 / 162 ms, 5.7 / 5.9 MiB/s. The daemon only relays bytes and
 * spawns processes; the sandbox's own programs run with their own settings.
 */
export const GUEST_NODE_FLAGS = [
  '--jitless',
  '--lite-mode',
  '--single-threaded',
  '--v8-pool-size=0',
  '--max-semi-space-size=1',
] as const;

/** The guest daemon's argv as every driver starts it (tini as PID 1 of the sandbox's processes). */
export const GUEST_ARGV = [GUEST_PATHS.tini, '--', GUEST_PATHS.node, ...GUEST_NODE_FLAGS, GUEST_PATHS.main];

/** Inputs of the guest layer. */
export interface GuestLayerInputs {
  /** Node ≥ 24 binary copied into the guest (default: the agent's own). */
  nodeBinary: string;
  /** Statically linked tini (default /usr/bin/tini-static). */
  tiniBinary: string;
  /** The guest's entry module (default `<RUNTIME_DIR>/guest/main.ts`). */
  entry?: string;
}

/** Default {@link GuestLayerInputs}: this process's Node and Debian's tini-static. */
export function defaultGuestLayerInputs(): GuestLayerInputs {
  return { nodeBinary: process.execPath, tiniBinary: '/usr/bin/tini-static' };
}

const IMPORT_RE = /(?:^|\n)\s*(?:import|export)\b[^'"]*?from\s*['"](\.{1,2}\/[^'"]+)['"]/g;

/**
 * The guest's source files: `entry` and every module it reaches through relative imports
 * (type-only imports included: Node's type stripping still resolves nothing for them, but they
 * are tiny and keep the set easy to reason about). Absolute paths, sorted.
 * @throws Error when an imported file does not exist.
 */
export async function guestSources(entry = join(RUNTIME_DIR, 'guest', 'main.ts')): Promise<string[]> {
  const seen = new Set<string>();
  const queue = [resolve(entry)];
  while (queue.length) {
    const file = queue.pop()!;
    if (seen.has(file)) continue;
    if (!existsSync(file)) throw new Error(`guest source ${file} is missing`);
    seen.add(file);
    const text = await readFile(file, 'utf8');
    for (const m of text.matchAll(IMPORT_RE)) queue.push(resolve(dirname(file), m[1]!));
  }
  return [...seen].sort();
}

async function fileDigest(path: string): Promise<string> {
  const h = createHash('sha256');
  for await (const chunk of createReadStream(path)) h.update(chunk as Buffer);
  return h.digest('hex');
}

const digests = new Map<string, Promise<string>>();

/**
 * Digest of a guest layer: builder and esbuild versions, the binaries' and every guest source's
 * content hash. Hashing the Node binary (~120 MiB) costs ~0.3 s, so it is done once per process and
 * set of inputs (an agent picks up a changed guest at its next start).
 */
export function guestLayerDigest(inputs: GuestLayerInputs): Promise<string> {
  const key = JSON.stringify(inputs);
  let p = digests.get(key);
  if (!p) {
    p = (async () => {
      const h = createHash('sha256').update(`${GUEST_LAYER_VERSION} esbuild ${esbuildVersion}`);
      for (const [dest, src] of layerBinaries(inputs)) h.update(`\n${dest}\n${await fileDigest(src)}`);
      const root = resolve(RUNTIME_DIR);
      for (const src of await guestSources(inputs.entry))
        h.update(`\n${relative(root, src)}\n${await fileDigest(src)}`);
      return h.digest('hex');
    })();
    p.catch(() => digests.delete(key));
    digests.set(key, p);
  }
  return p;
}

/** `[path inside the sandbox, host source]` of the layer's executables. Pure. */
function layerBinaries(inputs: GuestLayerInputs): [string, string][] {
  return [
    [GUEST_PATHS.node, inputs.nodeBinary],
    [GUEST_PATHS.tini, inputs.tiniBinary],
  ];
}

/**
 * The guest daemon as one CommonJS file (esbuild: `entry` and every module it imports; Node's
 * built-ins stay `require`s; no minifying, so stack traces stay readable).
 * @returns the file's text.
 * @throws SpaceError DRIVER_FAILED when esbuild cannot bundle it (a syntax error, a missing import).
 */
export async function bundleGuest(entry = join(RUNTIME_DIR, 'guest', 'main.ts')): Promise<string> {
  try {
    const out = await esbuild({
      entryPoints: [entry],
      // module markers in the output (`// runtime/guest/app.ts`) name files from the repository's root
      absWorkingDir: resolve(RUNTIME_DIR, '..'),
      bundle: true,
      platform: 'node',
      format: 'cjs',
      target: 'node24',
      write: false,
      logLevel: 'silent',
      legalComments: 'none',
    });
    return out.outputFiles[0]!.text;
  } catch (err) {
    throw new SpaceError(
      'DRIVER_FAILED',
      `cannot bundle the guest daemon ${entry}: ${(err as Error).message}`,
      {
        path: entry,
      },
    );
  }
}

const layerBuilds = new Map<string, Promise<string>>();

/**
 * The guest layer directory for `inputs` (built once per digest; concurrent callers share a build).
 * @returns absolute path of the layer's root (to stack over a template's rootfs).
 * @throws SpaceError DRIVER_FAILED when a source file (Node, tini, guest module) is missing.
 */
export async function buildGuestLayer(cacheDir: string, inputs: GuestLayerInputs): Promise<string> {
  for (const p of [inputs.nodeBinary, inputs.tiniBinary]) {
    if (!existsSync(p))
      throw new SpaceError('DRIVER_FAILED', `guest layer input ${p} is missing`, { path: p });
  }
  const digest = await guestLayerDigest(inputs);
  const dir = join(cacheDir, 'guest', digest);
  if (existsSync(join(dir, 'complete'))) return join(dir, 'layer');
  let p = layerBuilds.get(dir);
  if (!p) {
    p = (async () => {
      const tmp = `${dir}.tmp-${process.pid}-${randomBytes(4).toString('hex')}`;
      try {
        for (const [dest, src] of layerBinaries(inputs)) {
          const to = join(tmp, 'layer', dest);
          await mkdir(dirname(to), { recursive: true });
          await copyFile(src, to);
          await chmod(to, 0o755);
        }
        const main = join(tmp, 'layer', GUEST_PATHS.main);
        await mkdir(dirname(main), { recursive: true });
        await writeFile(main, await bundleGuest(inputs.entry), { mode: 0o644 });
        await writeFile(join(tmp, 'complete'), JSON.stringify({ digest, builtAt: new Date().toISOString() }));
        await rm(dir, { recursive: true, force: true });
        await rename(tmp, dir);
        return join(dir, 'layer');
      } catch (err) {
        await rm(tmp, { recursive: true, force: true });
        throw err;
      }
    })().finally(() => layerBuilds.delete(dir));
    layerBuilds.set(dir, p);
  }
  return p;
}

/** Hex SHA-256 of a template image made from a template digest and a guest layer digest. Pure. */
export function imageDigest(templateDigest: string, guestDigest: string, extra = ''): string {
  return createHash('sha256').update(`${templateDigest}\n${guestDigest}\n${extra}`).digest('hex');
}

/** Where Debian keeps the system trust bundle. */
const TRUST_BUNDLE = 'etc/ssl/certs/ca-certificates.crt';

/**
 * A one-file layer holding the template's system trust bundle with `caFile` appended (the
 * gateway's per-deployment CA, for credential interception), so every driver's sandboxes trust it
 * from their image. Content-addressed by the resulting bundle.
 * @returns the layer directory and its digest.
 */
export async function buildTrustLayer(
  cacheDir: string,
  rootfs: string,
  caFile: string,
): Promise<{ dir: string; digest: string }> {
  const base = await readFile(join(rootfs, TRUST_BUNDLE), 'utf8').catch(() => '');
  const ca = await readFile(caFile, 'utf8').catch((err: unknown) => {
    throw new SpaceError('DRIVER_FAILED', `cannot read the trusted CA ${caFile}: ${err}`, { path: caFile });
  });
  const bundle = `${base.trimEnd()}\n${ca.trim()}\n`;
  const digest = createHash('sha256').update(bundle).digest('hex');
  const dir = join(cacheDir, 'trust', digest);
  if (!existsSync(join(dir, 'complete'))) {
    const tmp = `${dir}.tmp-${process.pid}-${randomBytes(4).toString('hex')}`;
    await mkdir(join(tmp, 'layer', dirname(TRUST_BUNDLE)), { recursive: true });
    await writeFile(join(tmp, 'layer', TRUST_BUNDLE), bundle, { mode: 0o644 });
    await writeFile(join(tmp, 'complete'), digest);
    await rm(dir, { recursive: true, force: true });
    await rename(tmp, dir);
  }
  return { dir: join(dir, 'layer'), digest };
}

/**
 * A template as a directory-rootfs driver (gVisor) boots it, and the input of every VM image: the
 * guest layer over an optional trust layer (`trustedCaFile`) over the template tree.
 * @throws SpaceError TEMPLATE_NOT_FOUND / TEMPLATE_NOT_READY (template), DRIVER_FAILED (guest layer, CA).
 */
export async function directoryImage(
  template: string,
  cacheDir: string,
  inputs: GuestLayerInputs,
  trustedCaFile?: string,
  templatesDir?: string,
): Promise<TemplateImage> {
  const rootfs = await resolveTemplate(template, cacheDir, templatesDir);
  const { definition, digest: tDigest } = await loadTemplateDefinition(template, templatesDir);
  const start = templateStart(definition);
  const layer = await buildGuestLayer(cacheDir, inputs);
  const gDigest = dirname(layer).split('/').pop()!;
  const trust = trustedCaFile ? await buildTrustLayer(cacheDir, rootfs, trustedCaFile) : null;
  return {
    template,
    digest: imageDigest(tDigest, gDigest, trust?.digest ?? ''),
    lowerDirs: trust ? [layer, trust.dir, rootfs] : [layer, rootfs],
    ...(start ? { start } : {}),
  };
}
