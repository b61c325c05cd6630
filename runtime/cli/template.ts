/** `space template build [name]` (on this host, as the agent's cache) and `space template ls` (API). */
import type { Command } from 'commander';
import { apiClient, isJson } from './context.ts';
import { CliError, note, printJson, println } from './output.ts';

/** Where the local agent looks for built templates (its SPACE_CACHE_DIR default). */
export const DEFAULT_CACHE_DIR = '/var/lib/space';

export interface BuildResult {
  name: string;
  rootfs: string;
  digest: string;
  cached: boolean;
}

/**
 * Builds (or reuses) template `name` into `cacheDir`, printing progress lines on stderr.
 * The builder is loaded lazily so other commands never load agent code.
 */
export async function buildLocalTemplate(
  name: string,
  cacheDir: string,
  progress: (line: string) => void = note,
): Promise<BuildResult> {
  const { buildTemplate } = await import('../agent/image/templates.ts');
  try {
    return await buildTemplate(name, { cacheDir, onProgress: progress });
  } catch (err) {
    const e = err as { code?: unknown; message?: string; details?: Record<string, unknown> };
    if (typeof e.code === 'string' && typeof e.message === 'string') {
      throw new CliError(e.code, e.message, { details: e.details, cause: err });
    }
    throw err;
  }
}

/**
 * The VM drivers' guest kernel on this host (the runtime image bakes it): the one the agent would
 * find, else prepared once with apt into `<cacheDir>/vm/kernel/` (runtime/agent/image/guest-kernel.ts).
 * @returns its release, e.g. `6.1.0-57-cloud-amd64`. @throws CliError DRIVER_FAILED (apt, unpacking).
 */
export async function prepareLocalGuestKernel(cacheDir: string): Promise<string> {
  const [{ ensureGuestKernel }, { DEFAULT_IMAGE_ASSETS_DIR, guestKernelDir }] = await Promise.all([
    import('../agent/image/guest-kernel.ts'),
    import('../agent/image/assets.ts'),
  ]);
  const assets = process.env['SPACE_IMAGE_ASSETS_DIR'] || DEFAULT_IMAGE_ASSETS_DIR;
  try {
    return (await ensureGuestKernel(guestKernelDir(assets), cacheDir)).version;
  } catch (err) {
    const e = err as { code?: unknown; message?: string; details?: Record<string, unknown> };
    throw new CliError(String(e.code ?? 'DRIVER_FAILED'), e.message ?? String(err), {
      details: e.details,
      cause: err,
    });
  }
}

export function registerTemplate(program: Command): void {
  const template = program.command('template').description('build and list sandbox templates');

  template
    .command('build')
    .description('build a template’s root filesystem on this host (needs root and debootstrap; cached)')
    .argument('[name]', 'template name (templates/<name>.json)', 'base')
    .option('--cache-dir <dir>', 'template cache of the local agent', DEFAULT_CACHE_DIR)
    .addHelpText('after', '\nExamples:\n  space template build\n  space template build base --json')
    .action(async (name: string, o: { cacheDir: string }, cmd: Command) => {
      if (process.getuid?.() !== 0) {
        throw new CliError('PREREQUISITES', 'building a template needs root (debootstrap, chown)');
      }
      const started = Date.now();
      const built = await buildLocalTemplate(name, o.cacheDir);
      if (isJson(cmd)) return printJson(built);
      if (built.cached) note(`template ${name}: already built`);
      else note(`template ${name}: done in ${((Date.now() - started) / 1000).toFixed(1)} s`);
      println(`${built.rootfs}  sha256:${built.digest}`);
    });

  template
    .command('ls')
    .alias('list')
    .description('templates built on the nodes (from the API); "(not ready)" when no live node has it now')
    .action(async (_o: unknown, cmd: Command) => {
      const res = await apiClient(cmd).json<{ templates: { name: string; ready?: boolean }[] }>(
        'GET',
        '/v1/templates',
      );
      if (isJson(cmd)) return printJson(res);
      for (const t of res.templates) println(t.ready === false ? `${t.name} (not ready)` : t.name);
    });
}
