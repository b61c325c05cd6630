/**
 * The image's baked assets are what a node uses (issue 42 item 2): the guest kernel is read from
 * the image's directory with no apt on PATH (before, the agent asked `apt-cache`, whose lists the
 * image deletes: every VM driver failed on a fresh node), a missing kernel is a DRIVER_FAILED
 * naming the directory, and a baked template becomes the node's build (no debootstrap).
 */
import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, readlink, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { SpaceError } from '../../core/errors.ts';
import { guestKernelDir } from './assets.ts';
import { findGuestKernel } from './guest-kernel.ts';
import {
  adoptBakedTemplates,
  loadTemplateDefinition,
  resolveTemplate,
  templateBuildDir,
} from './templates.ts';

let work: string;
let path: string | undefined;
beforeEach(async () => {
  work = await mkdtemp(join(tmpdir(), 'space-assets-'));
  path = process.env['PATH'];
  // nothing to ask: a lookup that reached for apt-cache or apt-get would fail
  process.env['PATH'] = join(work, 'no-tools');
});
afterEach(async () => {
  process.env['PATH'] = path;
  await rm(work, { recursive: true, force: true });
});

async function fakeKernel(dir: string, version: string): Promise<void> {
  await mkdir(join(dir, 'modules'), { recursive: true });
  for (const f of ['vmlinuz', 'vmlinux']) await writeFile(join(dir, f), f);
  await writeFile(join(dir, 'modules', 'virtio_mmio.ko'), 'ko');
  await writeFile(
    join(dir, 'kernel.json'),
    JSON.stringify({ version, package: `linux-image-${version}_1`, modules: ['virtio_mmio'] }),
  );
  await writeFile(join(dir, 'complete'), 'x');
}

describe('the guest kernel comes from the image, never from apt', () => {
  it('reads the baked directory with no apt on PATH', async () => {
    const assets = join(work, 'assets');
    await fakeKernel(guestKernelDir(assets), '6.1.0-57-cloud-amd64');
    const k = await findGuestKernel(guestKernelDir(assets), join(work, 'cache'));
    expect(k).toMatchObject({
      version: '6.1.0-57-cloud-amd64',
      bzImage: join(guestKernelDir(assets), 'vmlinuz'),
      vmlinux: join(guestKernelDir(assets), 'vmlinux'),
      modules: ['virtio_mmio'],
    });
  });

  it('falls back to a kernel an earlier agent left in the cache; the baked one wins over it', async () => {
    const cache = join(work, 'cache');
    await fakeKernel(join(cache, 'vm', 'kernel', 'linux-image-6.1.0-50-cloud-amd64_6.1.1-1'), '6.1.0-50');
    expect((await findGuestKernel(join(work, 'none'), cache)).version).toBe('6.1.0-50');
    await fakeKernel(join(work, 'baked'), '6.1.0-57');
    expect((await findGuestKernel(join(work, 'baked'), cache)).version).toBe('6.1.0-57');
  });

  it('none anywhere (or one half written): DRIVER_FAILED naming the directory to fill', async () => {
    const dir = join(work, 'assets', 'guest-kernel');
    await mkdir(dir, { recursive: true });
    await writeFile(join(dir, 'vmlinuz'), 'half a copy, no complete marker');
    const err = await findGuestKernel(dir, join(work, 'cache')).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(SpaceError);
    expect(err).toMatchObject({ code: 'DRIVER_FAILED', details: { path: dir } });
    expect((err as Error).message).toContain(`no guest kernel in ${dir}`);
  });
});

describe('baked templates are the node’s builds', () => {
  const def = {
    name: 'base',
    suite: 'bookworm',
    mirror: 'http://deb.debian.org/debian',
    packages: [],
    user: { name: 'user', uid: 1000, gid: 1000, home: '/home/user' },
  };

  it('a current baked build is linked into the cache and resolves to the baked tree; a stale one is not', async () => {
    const defs = join(work, 'defs');
    await mkdir(defs);
    await writeFile(join(defs, 'base.json'), JSON.stringify(def));
    await writeFile(join(defs, 'other.json'), JSON.stringify({ ...def, name: 'other' }));
    const { digest } = await loadTemplateDefinition('base', defs);
    // the layout scripts/image-assets.ts packs under /usr/lib/space
    const baked = join(work, 'assets');
    const bakedBase = join(baked, 'templates', 'base', digest);
    const cache = join(work, 'cache');
    await mkdir(join(bakedBase, 'rootfs'), { recursive: true });
    await writeFile(join(bakedBase, 'complete'), '{}');
    // `other` was baked from an older definition: its digest is not the current one
    await mkdir(join(baked, 'templates', 'other', 'f'.repeat(64), 'rootfs'), { recursive: true });
    await writeFile(join(baked, 'templates', 'other', 'f'.repeat(64), 'complete'), '{}');

    await expect(resolveTemplate('base', cache, defs)).rejects.toMatchObject({ code: 'TEMPLATE_NOT_READY' });
    expect(await adoptBakedTemplates(baked, cache, defs)).toEqual(['base']);
    expect(await resolveTemplate('base', cache, defs)).toBe(
      join(templateBuildDir(baked, 'base', digest), 'rootfs'),
    );
    await expect(resolveTemplate('other', cache, defs)).rejects.toMatchObject({ code: 'TEMPLATE_NOT_READY' });
    // again (the next agent start): nothing changes
    expect(await adoptBakedTemplates(baked, cache, defs)).toEqual(['base']);

    // an upgrade whose image no longer has that build: the dangling link goes, the template is not ready
    await rm(join(work, 'assets'), { recursive: true });
    expect(await adoptBakedTemplates(baked, cache, defs)).toEqual([]);
    expect(existsSync(templateBuildDir(cache, 'base', digest))).toBe(false);
    await expect(readlink(templateBuildDir(cache, 'base', digest))).rejects.toThrow();
    await expect(resolveTemplate('base', cache, defs)).rejects.toMatchObject({ code: 'TEMPLATE_NOT_READY' });
  });

  it('the node’s own complete build of the same digest is kept', async () => {
    const defs = join(work, 'defs');
    await mkdir(defs);
    await writeFile(join(defs, 'base.json'), JSON.stringify(def));
    const { digest } = await loadTemplateDefinition('base', defs);
    const baked = join(work, 'assets');
    const cache = join(work, 'cache');
    for (const root of [baked, cache]) {
      await mkdir(join(templateBuildDir(root, 'base', digest), 'rootfs'), { recursive: true });
      await writeFile(join(templateBuildDir(root, 'base', digest), 'complete'), '{}');
    }
    expect(await adoptBakedTemplates(baked, cache, defs)).toEqual([]);
    expect(await resolveTemplate('base', cache, defs)).toBe(
      join(templateBuildDir(cache, 'base', digest), 'rootfs'),
    );
  });
});
