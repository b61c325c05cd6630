import { execFile } from 'node:child_process';
import { existsSync, statSync } from 'node:fs';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, describe, expect, it } from 'vitest';
import { TEST_CACHE_DIR } from '../../../test/cache-dir.ts';
import { SpaceError } from '../../core/errors.ts';
import {
  buildTemplate,
  DEFAULT_TEMPLATES_DIR,
  listTemplateDefinitions,
  loadTemplateDefinition,
  resolveTemplate,
  templateBuildDir,
} from './templates.ts';

const run = promisify(execFile);

/** Persistent between runs so a rerun reuses the (minutes-long) first build. */
const CACHE = TEST_CACHE_DIR;

const emptyCaches: string[] = [];
afterAll(async () => {
  for (const d of emptyCaches) await rm(d, { recursive: true, force: true });
});

async function codeOf(p: Promise<unknown>): Promise<string | undefined> {
  try {
    await p;
    return undefined;
  } catch (err) {
    return err instanceof SpaceError ? err.code : String(err);
  }
}

describe('templates', () => {
  it('lists definitions and rejects unknown names', async () => {
    expect(await listTemplateDefinitions()).toContain('base');
    expect(await codeOf(loadTemplateDefinition('nope-not-here'))).toBe('TEMPLATE_NOT_FOUND');
    expect(await codeOf(loadTemplateDefinition('../etc/passwd'))).toBe('TEMPLATE_NOT_FOUND');
    expect(await codeOf(buildTemplate('nope-not-here', { cacheDir: '/nonexistent' }))).toBe(
      'TEMPLATE_NOT_FOUND',
    );
  });

  it('reports TEMPLATE_NOT_READY before a build and ignores an unmarked (interrupted) build', async () => {
    const cache = await mkdtemp(join(tmpdir(), 'space-tpl-'));
    emptyCaches.push(cache);
    expect(await codeOf(resolveTemplate('base', cache))).toBe('TEMPLATE_NOT_READY');
    const { digest } = await loadTemplateDefinition('base');
    const { mkdir } = await import('node:fs/promises');
    await mkdir(join(templateBuildDir(cache, 'base', digest), 'rootfs'), { recursive: true });
    expect(await codeOf(resolveTemplate('base', cache))).toBe('TEMPLATE_NOT_READY');
  });

  it('builds base for real (debootstrap), then reuses the cache', { timeout: 20 * 60_000 }, async () => {
    const progress: string[] = [];
    const built = await buildTemplate('base', { cacheDir: CACHE, onProgress: (l) => progress.push(l) });
    if (!built.cached) expect(progress.some((l) => l.startsWith('I: Retrieving'))).toBe(true);
    const r = built.rootfs;
    expect(await resolveTemplate('base', CACHE)).toBe(r);
    for (const bin of [
      'usr/bin/python3',
      'usr/bin/python',
      'usr/bin/sudo',
      'usr/local/bin/node',
      'usr/local/bin/npm',
      'usr/local/bin/npx',
      'usr/bin/ps',
      'etc/ssl/certs/ca-certificates.crt',
    ]) {
      expect(existsSync(join(r, bin)), bin).toBe(true);
    }
    expect(await readFile(join(r, 'etc/passwd'), 'utf8')).toMatch(/^user:x:1000:1000::\/home\/user:/m);
    expect(await readFile(join(r, 'etc/group'), 'utf8')).toMatch(/^user:x:1000:$/m);
    expect(await readFile(join(r, 'etc/shadow'), 'utf8')).toMatch(/^user:\*:/m);
    expect(statSync(join(r, 'home/user')).uid).toBe(1000);
    // a current Node LTS from the pinned npm tarball (Debian's nodejs is 18), and npm beside it
    const { stdout: nodeVersion } = await run(join(r, 'usr/local/bin/node'), ['--version']);
    expect(nodeVersion).toMatch(/^v24\./);
    const { stdout: npmVersion } = await run(join(r, 'usr/local/bin/node'), [
      join(r, 'usr/local/lib/node_modules/npm/bin/npm-cli.js'),
      '--version',
    ]);
    expect(npmVersion).toMatch(/^11\./);
    expect(existsSync(join(r, 'usr/bin/nodejs'))).toBe(false); // no second, older node
    // passwordless sudo for the user, as sudo wants the rule: root's, 0440
    const rule = join(r, 'etc/sudoers.d/user');
    expect(await readFile(rule, 'utf8')).toBe('user ALL=(ALL:ALL) NOPASSWD: ALL\n');
    expect([statSync(rule).uid, statSync(rule).mode & 0o777]).toEqual([0, 0o440]);
    // where setuid cannot work (gVisor), the user's sudo goes through the guest (core/sudo.ts)
    expect(await readFile(join(r, 'etc/group'), 'utf8')).toMatch(/^sudo:x:\d+:(.*,)?user$/m);
    expect(statSync(join(r, 'usr/local/bin/sudo')).mode & 0o777).toBe(0o755);
    expect(statSync(join(r, 'opt/space')).isDirectory()).toBe(true);
    expect((await readFile(join(r, 'etc/hostname'), 'utf8')).trim()).toBe('sandbox');
    expect(existsSync(join(r, 'etc/resolv.conf'))).toBe(true);
    expect(existsSync(join(r, 'var/lib/apt/lists/deb.debian.org_debian_dists_bookworm_InRelease'))).toBe(
      false,
    );

    const again = await buildTemplate('base', { cacheDir: CACHE });
    expect(again).toEqual({ ...built, cached: true });
  });

  it('a changed definition is a new build: the old one is not served for it, the unchanged one is reused', async () => {
    // the real base build (above) is in the cache; a copy of its definition in another folder is the
    // same template, and one changed file in it makes a different one
    const dir = await mkdtemp(join(tmpdir(), 'space-tpldef-'));
    emptyCaches.push(dir);
    const def = JSON.parse(await readFile(join(DEFAULT_TEMPLATES_DIR, 'base.json'), 'utf8')) as {
      files?: Record<string, string>;
    };
    await writeFile(join(dir, 'base.json'), JSON.stringify(def));
    const same = await buildTemplate('base', { cacheDir: CACHE, templatesDir: dir });
    expect(same.cached).toBe(true);
    expect(await resolveTemplate('base', CACHE, dir)).toBe(same.rootfs);
    await writeFile(
      join(dir, 'base.json'),
      JSON.stringify({ ...def, files: { ...def.files, '/etc/space-changed': 'yes\n' } }),
    );
    const changed = await loadTemplateDefinition('base', dir);
    expect(changed.digest).not.toBe(same.digest);
    // the node does not start sandboxes of the changed template from the old build: it needs its own
    expect(await codeOf(resolveTemplate('base', CACHE, dir))).toBe('TEMPLATE_NOT_READY');
    expect(existsSync(templateBuildDir(CACHE, 'base', changed.digest))).toBe(false);
    // and putting the definition back finds the old build again, without building
    await writeFile(join(dir, 'base.json'), JSON.stringify(def));
    expect(await buildTemplate('base', { cacheDir: CACHE, templatesDir: dir })).toEqual(same);
  });
});
