import { execFile } from 'node:child_process';
import { mkdtemp, readdir, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, describe, expect, it } from 'vitest';
import { buildGuestLayer, bundleGuest, defaultGuestLayerInputs, GUEST_PATHS } from './images.ts';

const run = promisify(execFile);

describe('guest layer', () => {
  const dirs: string[] = [];
  const scratch = async () => {
    const d = await mkdtemp(join(tmpdir(), 'space-guest-layer-'));
    dirs.push(d);
    return d;
  };
  afterAll(async () => {
    for (const d of dirs) await rm(d, { recursive: true, force: true });
  });

  it('bundles the guest daemon into one CommonJS file that Node loads without type stripping', async () => {
    const js = await bundleGuest();
    expect(js).not.toMatch(/^import\s[^;]*\sfrom\s*['"]/m);
    expect(js).toMatch(/require\("node:http"\)/);
    const file = join(await scratch(), 'main.cjs');
    await writeFile(file, js);
    // --check parses the file as the guest's Node will: CommonJS, no TypeScript left in it
    await run(process.execPath, ['--no-experimental-strip-types', '--check', file]);
  });

  it('refuses a guest it cannot bundle with DRIVER_FAILED naming the entry', async () => {
    const entry = join(await scratch(), 'main.ts');
    await writeFile(entry, "import { nothing } from '../missing.ts';\nconsole.log(nothing);\n");
    await expect(bundleGuest(entry)).rejects.toMatchObject({
      code: 'DRIVER_FAILED',
      details: { path: entry },
    });
  });

  it('holds exactly Node, tini and the bundled daemon', async () => {
    const cache = await scratch();
    const layer = await buildGuestLayer(cache, defaultGuestLayerInputs());
    const files = (await readdir(layer, { recursive: true, withFileTypes: true }))
      .filter((e) => e.isFile())
      .map((e) => `/${join(e.parentPath, e.name).slice(layer.length + 1)}`)
      .sort();
    expect(files).toEqual([GUEST_PATHS.node, GUEST_PATHS.tini, GUEST_PATHS.main].sort());
    expect((await stat(join(layer, GUEST_PATHS.node))).mode & 0o777).toBe(0o755);
    expect((await stat(join(layer, GUEST_PATHS.main))).mode & 0o777).toBe(0o644);
  });
});
