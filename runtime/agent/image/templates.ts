/**
 * Template builder: turns a definition in `templates/<name>.json` into a read-only root filesystem
 * directory that drivers use as the lower layer of every sandbox's writable root.
 *
 * Cache layout (per node):
 * ```
 * <cacheDir>/templates/<name>/<digest>/rootfs     the built tree
 * <cacheDir>/templates/<name>/<digest>/complete   completion marker (JSON: name, digest, builtAt)
 * <cacheDir>/templates/<name>/.build-<digest>-*   in-progress build (never used; removed on retry)
 * ```
 * A build happens in a temporary directory that is renamed into place only once complete, so an
 * interrupted build is never mistaken for a finished one.
 */
import { spawn } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import {
  appendFile,
  chmod,
  chown,
  copyFile,
  cp,
  lstat,
  mkdir,
  readdir,
  readFile,
  readlink,
  realpath,
  rename,
  rm,
  symlink,
  writeFile,
} from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { SpaceError } from '../../core/errors.ts';
import { SUDO_GROUP, sudoShim } from '../../core/sudo.ts';
import { installNpmTarballs, type NpmTarball, npmTarballProblem } from './npm-tarballs.ts';

import { type TemplateStartFields, validateStart } from './template-start.ts';

export {
  READY_POLL_MS,
  READY_TIMEOUT_SEC,
  START_LOG,
  type TemplateStart,
  type TemplateStartFields,
  templateStart,
} from './template-start.ts';

/** Bump when the build steps change, so every cached template is rebuilt. */
export const TEMPLATE_BUILDER_VERSION = 'space-template-builder/3';

/** Folder holding the repo's template definitions. */
export const DEFAULT_TEMPLATES_DIR = fileURLToPath(new URL('../../../templates/', import.meta.url));

/** The non-root user every template gets. */
export interface TemplateUser {
  name: string;
  uid: number;
  gid: number;
  home: string;
  shell?: string;
  /** Passwordless `sudo` for the user (`/etc/sudoers.d/<name>`, mode 0440); needs the `sudo` package. */
  sudo?: boolean;
}

/**
 * A template made of another's built root filesystem as is, plus its own start command: no build
 * of its own (`from` must name a template with a Debian definition).
 */
export interface DerivedTemplateDefinition extends TemplateStartFields {
  name: string;
  description?: string;
  /** The template whose root filesystem this one uses. */
  from: string;
}

/** Shape of `templates/<name>.json`. */
export interface TemplateDefinition extends TemplateStartFields {
  name: string;
  description?: string;
  /** Debian suite, e.g. `bookworm`. */
  suite: string;
  /** debootstrap variant, e.g. `minbase`. */
  variant?: string;
  /** Debian mirror; the env var `SPACE_DEBIAN_MIRROR` overrides it (not part of the digest). */
  mirror: string;
  /** Extra Debian packages (debootstrap `--include`). */
  packages: string[];
  /**
   * Packages installed after debootstrap with `apt-get install --no-install-recommends` in a chroot
   * (apt resolves alternatives and virtual packages, which debootstrap's `--include` does not:
   * `npm` and its ~300 `node-*` dependencies fail to configure there).
   */
  aptPackages?: string[];
  user: TemplateUser;
  /** Written to /etc/hostname (default `sandbox`). */
  hostname?: string;
  /**
   * Commands served by busybox applets linked into /usr/local/bin (ahead of /usr/bin on PATH),
   * leaving Debian's files untouched. Needs the `busybox` package. Used for `ls` and `stat`:
   * coreutils 9.1 calls statx with AT_NO_AUTOMOUNT, which runsc 2022-12 rejects with EINVAL.
   */
  busyboxApplets?: string[];
  /**
   * Files written into the tree after the packages (absolute path → UTF-8 content; root-owned,
   * mode 0644; parents made), e.g. `/etc/pip.conf`. They override the builder's own files.
   */
  files?: Record<string, string>;
  /**
   * Files copied into the tree after `files` (absolute path → path relative to the definitions'
   * folder, e.g. `code-interpreter/server.py`; root-owned, mode 0644). Their bytes are part of the
   * digest, so changing one rebuilds the template.
   */
  copy?: Record<string, string>;
  /**
   * Packages from the npm registry, pinned by version and integrity, copied into the tree after
   * the Debian packages (npm-tarballs.ts): e.g. a current Node LTS and npm.
   */
  npmTarballs?: NpmTarball[];
}

/** Either kind of definition file. */
export type AnyTemplateDefinition = TemplateDefinition | DerivedTemplateDefinition;

/** A template ready to use. */
export interface BuiltTemplate {
  name: string;
  /** Absolute path of the read-only root filesystem directory. */
  rootfs: string;
  /** Hex SHA-256 of definition + builder version. */
  digest: string;
  /** True when an existing build was reused. */
  cached: boolean;
}

/** Options of {@link buildTemplate}. */
export interface BuildOptions {
  /** Node-local cache root (templates go under `<cacheDir>/templates`). */
  cacheDir: string;
  /** Where definitions live (default {@link DEFAULT_TEMPLATES_DIR}). */
  templatesDir?: string;
  /** Every line the build prints (debootstrap stdout/stderr and builder steps). */
  log?: (line: string) => void;
  /** Progress lines for a CLI: debootstrap's `I: Retrieving …` lines and builder steps. */
  onProgress?: (line: string) => void;
}

const NAME_RE = /^[a-z0-9][a-z0-9_-]{0,62}$/;

/** Names of all definitions in `templatesDir` (sorted). */
export async function listTemplateDefinitions(templatesDir = DEFAULT_TEMPLATES_DIR): Promise<string[]> {
  const entries = await readdir(templatesDir).catch(() => [] as string[]);
  return entries
    .filter((f) => f.endsWith('.json'))
    .map((f) => f.slice(0, -5))
    .filter((n) => NAME_RE.test(n))
    .sort();
}

/**
 * Reads and validates one definition.
 * @returns the parsed definition and its digest (hex SHA-256 of builder version + canonical JSON
 *   + the bytes of its `copy` files; a derived template's also covers its `from` template's digest).
 * @throws SpaceError TEMPLATE_NOT_FOUND for an unknown/invalid name, BAD_REQUEST for a malformed file.
 */
export async function loadTemplateDefinition(
  name: string,
  templatesDir = DEFAULT_TEMPLATES_DIR,
): Promise<{ definition: AnyTemplateDefinition; digest: string }> {
  if (!NAME_RE.test(name))
    throw new SpaceError('TEMPLATE_NOT_FOUND', `no template named ${name}`, { template: name });
  let text: string;
  try {
    text = await readFile(join(templatesDir, `${name}.json`), 'utf8');
  } catch {
    throw new SpaceError('TEMPLATE_NOT_FOUND', `no template named ${name}`, { template: name });
  }
  const definition = JSON.parse(text) as AnyTemplateDefinition;
  const bad = (why: string) => new SpaceError('BAD_REQUEST', `template ${name}: ${why}`, { template: name });
  if (typeof definition !== 'object' || definition === null || definition.name !== name)
    throw bad('"name" must match the file name');
  validateStart(definition, bad);
  if ('from' in definition) {
    validateDerived(definition, bad);
    const parent = await loadTemplateDefinition(definition.from, templatesDir);
    if ('from' in parent.definition) throw bad(`"from" names ${definition.from}, itself derived`);
    return { definition, digest: templateDigest(definition, [parent.digest]) };
  }
  validateDefinition(definition, bad);
  const copied: string[] = [];
  for (const [target, source] of Object.entries(definition.copy ?? {})) {
    const bytes = await readFile(join(templatesDir, source)).catch(() => {
      throw bad(`"copy" source ${JSON.stringify(source)} is not a file in ${templatesDir}`);
    });
    copied.push(`${target}\0${createHash('sha256').update(bytes).digest('hex')}`);
  }
  return { definition, digest: templateDigest(definition, copied) };
}

/** Hex SHA-256 of the builder version, the definition's JSON and `extra` (content digests). Pure. */
export function templateDigest(definition: AnyTemplateDefinition, extra: readonly string[] = []): string {
  const h = createHash('sha256')
    .update(TEMPLATE_BUILDER_VERSION)
    .update('\n')
    .update(JSON.stringify(definition));
  for (const e of extra) h.update('\n').update(e);
  return h.digest('hex');
}

type Bad = (why: string) => SpaceError;

const DERIVED_KEYS: ReadonlySet<string> = new Set([
  'name',
  'description',
  'from',
  'startCmd',
  'startUser',
  'readyCmd',
  'readyPort',
  'readyTimeoutSec',
]);

function validateDerived(d: DerivedTemplateDefinition, bad: Bad): void {
  if (typeof d.from !== 'string' || !NAME_RE.test(d.from) || d.from === d.name)
    throw bad('"from" must name another template');
  const extra = Object.keys(d).filter((k) => !DERIVED_KEYS.has(k));
  if (extra.length) throw bad(`a template "from" another has no ${extra.map((k) => `"${k}"`).join(', ')}`);
}

function validateDefinition(d: TemplateDefinition, bad: Bad): void {
  if (typeof d.suite !== 'string' || !/^[a-z]+$/.test(d.suite))
    throw bad('"suite" must be a Debian suite name');
  if (typeof d.mirror !== 'string' || !/^https?:\/\//.test(d.mirror))
    throw bad('"mirror" must be an http(s) URL');
  if (!Array.isArray(d.packages) || !d.packages.every((p) => /^[a-z0-9][a-z0-9.+-]*$/.test(p))) {
    throw bad('"packages" must be Debian package names');
  }
  if (
    d.aptPackages !== undefined &&
    (!Array.isArray(d.aptPackages) || !d.aptPackages.every((p) => /^[a-z0-9][a-z0-9.+-]*$/.test(p)))
  ) {
    throw bad('"aptPackages" must be Debian package names');
  }
  if (d.busyboxApplets !== undefined) {
    if (
      !Array.isArray(d.busyboxApplets) ||
      !d.busyboxApplets.every((a) => /^[a-z0-9][a-z0-9_.-]*$/.test(a))
    ) {
      throw bad('"busyboxApplets" must be command names');
    }
    if (!d.packages.includes('busybox')) throw bad('"busyboxApplets" needs the "busybox" package');
  }
  if (d.files !== undefined) {
    if (typeof d.files !== 'object' || d.files === null || Array.isArray(d.files))
      throw bad('"files" must map absolute paths to text');
    for (const [path, text] of Object.entries(d.files)) {
      if (
        !path.startsWith('/') ||
        path.split('/').includes('..') ||
        path.includes('\0') ||
        typeof text !== 'string'
      )
        throw bad(`"files" entry ${JSON.stringify(path)} must be an absolute path (no "..") with text`);
    }
  }
  if (d.copy !== undefined) {
    if (typeof d.copy !== 'object' || d.copy === null || Array.isArray(d.copy))
      throw bad('"copy" must map absolute paths to files beside the definition');
    for (const [path, source] of Object.entries(d.copy)) {
      const relativeOk =
        typeof source === 'string' &&
        source !== '' &&
        !source.startsWith('/') &&
        !source.split('/').includes('..');
      if (!path.startsWith('/') || path.split('/').includes('..') || path.includes('\0') || !relativeOk)
        throw bad(
          `"copy" entry ${JSON.stringify(path)} must be an absolute path (no "..") from a relative one`,
        );
    }
  }
  const u = d.user;
  if (!u || !/^[a-z_][a-z0-9_-]*$/.test(u.name) || !Number.isInteger(u.uid) || !Number.isInteger(u.gid)) {
    throw bad('"user" needs name, uid, gid, home');
  }
  if (u.sudo !== undefined && typeof u.sudo !== 'boolean') throw bad('"user.sudo" must be true or false');
  if (u.sudo && !d.packages.includes('sudo') && !d.aptPackages?.includes('sudo')) {
    throw bad('"user.sudo" needs the "sudo" package');
  }
  if (d.npmTarballs !== undefined) {
    if (!Array.isArray(d.npmTarballs)) throw bad('"npmTarballs" must be a list');
    for (const t of d.npmTarballs) {
      const problem = npmTarballProblem(t);
      if (problem) throw bad(`"npmTarballs" entry ${JSON.stringify(t?.name)}: ${problem}`);
    }
  }
}

/** `<cacheDir>/templates/<name>/<digest>` — pure. */
export function templateBuildDir(cacheDir: string, name: string, digest: string): string {
  return join(cacheDir, 'templates', name, digest);
}

/**
 * The built rootfs of `name` for its current definition (a derived template's is its `from`'s).
 * @returns absolute rootfs path.
 * @throws SpaceError TEMPLATE_NOT_FOUND (no definition), TEMPLATE_NOT_READY (not built on this node).
 */
export async function resolveTemplate(
  name: string,
  cacheDir: string,
  templatesDir = DEFAULT_TEMPLATES_DIR,
): Promise<string> {
  const { definition, digest } = await loadTemplateDefinition(name, templatesDir);
  if ('from' in definition) return resolveTemplate(definition.from, cacheDir, templatesDir);
  const dir = templateBuildDir(cacheDir, name, digest);
  if (!existsSync(join(dir, 'complete'))) {
    throw new SpaceError('TEMPLATE_NOT_READY', `template ${name} is not built on this node`, {
      template: name,
      digest,
    });
  }
  // a baked build is linked in (adoptBakedTemplates): drivers get the real path
  return realpath(join(dir, 'rootfs'));
}

/**
 * Makes the templates the runtime image baked (`<assetsDir>/templates/<name>/<digest>`, laid out
 * as a cache's; see assets.ts) the node's builds: for each baked `<name>/<digest>` that is complete and is the
 * current digest of its definition in `templatesDir`, `<cacheDir>/templates/<name>/<digest>` becomes
 * a symbolic link to it (read-only, as every template is used). Links to baked builds the image no
 * longer has (after an upgrade) are removed, so the template is rebuilt or baked anew. A node's own
 * complete build of the same digest is left alone. Returns the names linked. Never throws for a
 * missing `assetsDir` (a host without the image).
 */
export async function adoptBakedTemplates(
  assetsDir: string,
  cacheDir: string,
  templatesDir = DEFAULT_TEMPLATES_DIR,
): Promise<string[]> {
  const linked: string[] = [];
  for (const name of await listTemplateDefinitions(templatesDir)) {
    const parent = join(cacheDir, 'templates', name);
    for (const entry of await readdir(parent).catch(() => [] as string[])) {
      const p = join(parent, entry);
      if ((await lstat(p)).isSymbolicLink() && !existsSync(join(p, 'complete'))) await rm(p, { force: true });
    }
    let digest: string;
    try {
      const loaded = await loadTemplateDefinition(name, templatesDir);
      if ('from' in loaded.definition) continue; // nothing of its own to bake
      digest = loaded.digest;
    } catch {
      continue;
    }
    const baked = templateBuildDir(assetsDir, name, digest);
    if (!existsSync(join(baked, 'complete'))) continue;
    const dir = templateBuildDir(cacheDir, name, digest);
    const current = await readlink(dir).catch(() => null);
    if (current === baked) {
      linked.push(name);
      continue;
    }
    if (existsSync(join(dir, 'complete'))) continue;
    await mkdir(parent, { recursive: true });
    await rm(dir, { recursive: true, force: true });
    await symlink(baked, dir);
    linked.push(name);
  }
  return linked;
}

/**
 * Which of `names` this node can serve: each is resolved (built already); one that is not is built
 * when it is in `build` (the agent's start with `SPACE_BUILD_TEMPLATES=warm`), else reported with
 * `warn`. A build that fails is reported and leaves the template not ready (creates answer
 * TEMPLATE_NOT_READY), never stops the agent. Returns the ready names, in `names` order.
 */
export async function ensureTemplates(
  names: readonly string[],
  deps: {
    resolve(name: string): Promise<unknown>;
    build(name: string): Promise<unknown>;
    /** Templates to build when they are not built. */
    toBuild: ReadonlySet<string>;
    warn(name: string, message: string, err?: unknown): void;
  },
): Promise<string[]> {
  const ready: string[] = [];
  for (const t of names) {
    try {
      await deps.resolve(t);
      ready.push(t);
      continue;
    } catch {}
    if (!deps.toBuild.has(t)) {
      deps.warn(t, 'template not built on this node; build it with `space template build`');
      continue;
    }
    try {
      await deps.build(t);
      ready.push(t);
    } catch (err) {
      deps.warn(t, 'template build failed', err);
    }
  }
  return ready;
}

const inFlight = new Map<string, Promise<BuiltTemplate>>();

/**
 * Builds `name` (debootstrap + user, /opt/space, hostname, resolv.conf placeholder, apt cleanup), or
 * reuses the cached build for the same digest. Concurrent calls for one template share one build.
 * Needs root (debootstrap, chown).
 * @throws SpaceError TEMPLATE_NOT_FOUND, BAD_REQUEST (bad definition), INTERNAL (build failed; message has
 *   the tail of debootstrap's output).
 */
export async function buildTemplate(name: string, opts: BuildOptions): Promise<BuiltTemplate> {
  const { definition, digest } = await loadTemplateDefinition(name, opts.templatesDir);
  if ('from' in definition) {
    const parent = await buildTemplate(definition.from, opts);
    return { name, rootfs: parent.rootfs, digest, cached: parent.cached };
  }
  const dir = templateBuildDir(opts.cacheDir, name, digest);
  if (existsSync(join(dir, 'complete'))) return { name, rootfs: join(dir, 'rootfs'), digest, cached: true };
  const key = dir;
  let p = inFlight.get(key);
  if (!p) {
    p = buildFresh(definition, digest, dir, opts).finally(() => inFlight.delete(key));
    inFlight.set(key, p);
  }
  return p;
}

async function buildFresh(
  def: TemplateDefinition,
  digest: string,
  dir: string,
  opts: BuildOptions,
): Promise<BuiltTemplate> {
  const say = (line: string) => {
    opts.log?.(line);
    opts.onProgress?.(line);
  };
  const parent = join(opts.cacheDir, 'templates', def.name);
  await mkdir(parent, { recursive: true });
  await removeStaleBuilds(parent, digest);
  // incomplete leftovers, or a link to a baked build the image no longer carries
  await rm(dir, { recursive: true, force: true });
  const tmp = join(parent, `.build-${digest}-${process.pid}-${randomBytes(4).toString('hex')}`);
  const rootfs = join(tmp, 'rootfs');
  await mkdir(rootfs, { recursive: true });
  try {
    const started = Date.now();
    say(`template ${def.name}: debootstrap ${def.suite} (${def.packages.join(', ')})`);
    await runDebootstrap(def, rootfs, opts);
    if (def.aptPackages?.length) {
      say(`template ${def.name}: apt-get install ${def.aptPackages.join(', ')}`);
      await aptInstall(rootfs, def.aptPackages, opts);
    }
    if (def.npmTarballs?.length) {
      const done = await installNpmTarballs(rootfs, def.npmTarballs, { log: opts.log });
      say(`template ${def.name}: from the npm registry: ${done.join(', ') || 'nothing for this arch'}`);
    }
    say(`template ${def.name}: configuring`);
    await configureRootfs(def, rootfs, opts.templatesDir ?? DEFAULT_TEMPLATES_DIR);
    await writeFile(
      join(tmp, 'complete'),
      JSON.stringify({
        name: def.name,
        digest,
        builder: TEMPLATE_BUILDER_VERSION,
        builtAt: new Date().toISOString(),
      }),
    );
    await rename(tmp, dir);
    say(`template ${def.name}: built in ${((Date.now() - started) / 1000).toFixed(1)} s`);
    return { name: def.name, rootfs: join(dir, 'rootfs'), digest, cached: false };
  } catch (err) {
    await rm(tmp, { recursive: true, force: true }).catch(() => {});
    if (err instanceof SpaceError) throw err;
    throw new SpaceError(
      'INTERNAL',
      `template ${def.name} build failed: ${(err as Error).message}`,
      {
        template: def.name,
      },
      { cause: err },
    );
  }
}

/** Removes in-progress dirs of this digest left by a dead process (same-process builds are deduped). */
async function removeStaleBuilds(parent: string, digest: string): Promise<void> {
  for (const entry of await readdir(parent)) {
    if (entry.startsWith(`.build-${digest}-`))
      await rm(join(parent, entry), { recursive: true, force: true });
  }
}

/** Runs debootstrap, streaming `I: Retrieving` lines to onProgress. Rejects with the output tail. */
function runDebootstrap(def: TemplateDefinition, rootfs: string, opts: BuildOptions): Promise<void> {
  const mirror = process.env['SPACE_DEBIAN_MIRROR'] || def.mirror;
  const args = [
    `--variant=${def.variant ?? 'minbase'}`,
    ...(def.packages.length ? [`--include=${def.packages.join(',')}`] : []),
    def.suite,
    rootfs,
    mirror,
  ];
  return new Promise((resolve, reject) => {
    const child = spawn('debootstrap', args, { stdio: ['ignore', 'pipe', 'pipe'] });
    const tail: string[] = [];
    const onLine = (line: string) => {
      opts.log?.(line);
      if (line.startsWith('I: Retrieving')) opts.onProgress?.(line);
      tail.push(line);
      if (tail.length > 20) tail.shift();
    };
    createInterface({ input: child.stdout }).on('line', onLine);
    createInterface({ input: child.stderr }).on('line', onLine);
    child.on('error', reject);
    child.on('close', (code) => {
      if (code === 0) resolve();
      else reject(new Error(`debootstrap exited with ${code}: ${tail.join(' | ')}`));
    });
  });
}

/**
 * `apt-get install -y --no-install-recommends <packages>` chrooted into `rootfs` (with /proc mounted
 * for the maintainer scripts, unmounted again). Rejects with the output tail.
 */
async function aptInstall(rootfs: string, packages: string[], opts: BuildOptions): Promise<void> {
  const proc = join(rootfs, 'proc');
  await mkdir(proc, { recursive: true });
  await runLogged('mount', ['-t', 'proc', 'proc', proc], opts);
  try {
    const env = { ...process.env, DEBIAN_FRONTEND: 'noninteractive', LC_ALL: 'C' };
    await runLogged('chroot', [rootfs, 'apt-get', 'update', '-q'], opts, env);
    await runLogged(
      'chroot',
      [rootfs, 'apt-get', 'install', '-y', '-q', '--no-install-recommends', ...packages],
      opts,
      env,
    );
  } finally {
    await runLogged('umount', ['-l', proc], opts).catch(() => {});
  }
}

/** Runs a command, its output lines to `opts.log`; rejects with the last 20 lines. */
function runLogged(cmd: string, args: string[], opts: BuildOptions, env?: NodeJS.ProcessEnv): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'], ...(env ? { env } : {}) });
    const tail: string[] = [];
    const onLine = (line: string) => {
      opts.log?.(line);
      tail.push(line);
      if (tail.length > 20) tail.shift();
    };
    createInterface({ input: child.stdout }).on('line', onLine);
    createInterface({ input: child.stderr }).on('line', onLine);
    child.on('error', reject);
    child.on('close', (code) => {
      if (code === 0) resolve();
      else reject(new Error(`${cmd} ${args.slice(0, 3).join(' ')} exited with ${code}: ${tail.join(' | ')}`));
    });
  });
}

/** Post-debootstrap configuration of the tree at `rootfs` (`copy` sources are read from `templatesDir`). */
export async function configureRootfs(
  def: TemplateDefinition,
  rootfs: string,
  templatesDir = DEFAULT_TEMPLATES_DIR,
): Promise<void> {
  await addUser(rootfs, def.user);
  await mkdir(join(rootfs, 'opt/space'), { recursive: true });
  for (const applet of def.busyboxApplets ?? []) {
    const link = join(rootfs, 'usr/local/bin', applet);
    await rm(link, { force: true });
    await symlink('/bin/busybox', link);
  }
  const hostname = def.hostname ?? 'sandbox';
  await writeFile(join(rootfs, 'etc/hostname'), `${hostname}\n`);
  // debootstrap writes no /etc/hosts and neither gVisor nor the VM guests make one: without it
  // `localhost` does not resolve (R14)
  await writeFile(join(rootfs, 'etc/hosts'), hostsFile(hostname));
  if (def.user.sudo) await grantSudo(rootfs, def.user.name);
  await rm(join(rootfs, 'etc/resolv.conf'), { force: true });
  await writeFile(join(rootfs, 'etc/resolv.conf'), '# written by SPACE when the sandbox starts\n');
  for (const [path, text] of Object.entries(def.files ?? {})) {
    const target = join(rootfs, path);
    await mkdir(dirname(target), { recursive: true });
    await rm(target, { force: true }); // never write through a symlink the packages left there
    await writeFile(target, text, { mode: 0o644 });
  }
  for (const [path, source] of Object.entries(def.copy ?? {})) {
    const target = join(rootfs, path);
    await mkdir(dirname(target), { recursive: true });
    await rm(target, { force: true });
    await copyFile(join(templatesDir, source), target);
    await chmod(target, 0o644);
  }
  await cleanApt(rootfs);
}

/**
 * Passwordless sudo for `name`: the sudoers rule (root's, 0440, as sudo wants it) for where setuid
 * works, membership of group `sudo` and `/usr/local/bin/sudo` (core/sudo.ts) for where it does not
 * (gVisor: the guest runs the command).
 */
async function grantSudo(rootfs: string, name: string): Promise<void> {
  const rule = join(rootfs, 'etc/sudoers.d', name);
  await mkdir(dirname(rule), { recursive: true });
  await rm(rule, { force: true });
  await writeFile(rule, `${name} ALL=(ALL:ALL) NOPASSWD: ALL\n`, { mode: 0o440 });
  const groups = join(rootfs, 'etc/group');
  const lines = (await readFile(groups, 'utf8')).split('\n');
  const at = lines.findIndex((l) => l.startsWith(`${SUDO_GROUP}:`));
  if (at < 0) throw new Error(`the tree has no group ${SUDO_GROUP} (is the sudo package installed?)`);
  const members = (lines[at]!.split(':')[3] ?? '').split(',').filter(Boolean);
  if (!members.includes(name))
    lines[at] = `${lines[at]!.split(':').slice(0, 3).join(':')}:${[...members, name].join(',')}`;
  await writeFile(groups, lines.join('\n'));
  const shim = join(rootfs, 'usr/local/bin/sudo');
  await mkdir(dirname(shim), { recursive: true });
  await rm(shim, { force: true });
  await writeFile(shim, sudoShim(), { mode: 0o755 });
}

/** `/etc/hosts` of a template: localhost (IPv4 and IPv6) and the sandbox's host name. Pure. */
export function hostsFile(hostname: string): string {
  return [
    '127.0.0.1\tlocalhost',
    `127.0.1.1\t${hostname}`,
    '::1\tlocalhost ip6-localhost ip6-loopback',
    '',
  ].join('\n');
}

/** Appends passwd/group/shadow lines (if absent) and makes the home directory from /etc/skel. */
async function addUser(rootfs: string, u: TemplateUser): Promise<void> {
  const shell = u.shell ?? '/bin/bash';
  const addLine = async (file: string, line: string) => {
    const path = join(rootfs, 'etc', file);
    const text = await readFile(path, 'utf8').catch(() => '');
    if (text.split('\n').some((l) => l.startsWith(`${u.name}:`))) return;
    await appendFile(path, `${text.endsWith('\n') || text === '' ? '' : '\n'}${line}\n`);
  };
  await addLine('passwd', `${u.name}:x:${u.uid}:${u.gid}::${u.home}:${shell}`);
  await addLine('group', `${u.name}:x:${u.gid}:`);
  await addLine('shadow', `${u.name}:*:19000:0:99999:7:::`);
  const home = join(rootfs, u.home);
  await mkdir(home, { recursive: true });
  const skel = join(rootfs, 'etc/skel');
  if (existsSync(skel)) await cp(skel, home, { recursive: true });
  await chownTree(home, u.uid, u.gid);
  await chmod(home, 0o755);
}

async function chownTree(path: string, uid: number, gid: number): Promise<void> {
  await chown(path, uid, gid);
  for (const e of await readdir(path, { withFileTypes: true })) {
    const p = join(path, e.name);
    if (e.isDirectory()) await chownTree(p, uid, gid);
    else await chown(p, uid, gid);
  }
}

async function cleanApt(rootfs: string): Promise<void> {
  const clearDir = async (rel: string, keep: string[] = []) => {
    const d = join(rootfs, rel);
    for (const e of await readdir(d).catch(() => [] as string[])) {
      if (!keep.includes(e)) await rm(join(d, e), { recursive: true, force: true });
    }
  };
  await clearDir('var/cache/apt/archives', ['partial', 'lock']);
  await clearDir('var/lib/apt/lists', ['partial', 'lock']);
  for (const f of ['pkgcache.bin', 'srcpkgcache.bin'])
    await rm(join(rootfs, 'var/cache/apt', f), { force: true });
}
