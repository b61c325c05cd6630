/**
 * Template definitions with a start command, a ready check, copied files and a `from` template
 * (image/templates.ts): what a definition may say, what its digest covers (a changed start or a
 * changed copied file is another image, so old snapshots are not restored onto it) and what a
 * derived template resolves to.
 */
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import {
  adoptBakedTemplates,
  DEFAULT_TEMPLATES_DIR,
  loadTemplateDefinition,
  resolveTemplate,
  templateBuildDir,
  templateStart,
} from './templates.ts';

const full = {
  name: 'base',
  suite: 'bookworm',
  mirror: 'http://deb.debian.org/debian',
  packages: [],
  user: { name: 'user', uid: 1000, gid: 1000, home: '/home/user' },
};

describe('template definitions: start, ready, copy, from', () => {
  let defs: string;
  beforeEach(async () => {
    defs = await mkdtemp(join(tmpdir(), 'space-defs-'));
    await writeFile(join(defs, 'base.json'), JSON.stringify(full));
  });
  afterEach(() => rm(defs, { recursive: true, force: true }));
  const put = (name: string, d: unknown) => writeFile(join(defs, `${name}.json`), JSON.stringify(d));
  const codeOf = (p: Promise<unknown>) =>
    p.then(
      () => 'ok',
      (e: { code?: string; message?: string }) => e.code,
    );
  const messageOf = (p: Promise<unknown>) =>
    p.then(
      () => 'ok',
      (e: Error) => e.message,
    );

  it('templateStart: readyCmd as given, readyPort as a TCP check, none as started, defaults', () => {
    expect(templateStart({})).toBeUndefined();
    expect(templateStart({ startCmd: 's', readyCmd: 'r', startUser: 'root', readyTimeoutSec: 5 })).toEqual({
      cmd: 's',
      user: 'root',
      readyCmd: 'r',
      readyTimeoutMs: 5000,
    });
    expect(templateStart({ startCmd: 's', readyPort: 49999 })).toEqual({
      cmd: 's',
      user: 'user',
      readyCmd: "bash -c ': </dev/tcp/127.0.0.1/49999'",
      readyTimeoutMs: 60_000,
    });
    expect(templateStart({ startCmd: 's' })?.readyCmd).toBe('true');
  });

  it('refuses start settings that cannot work, naming the key', async () => {
    const bad: [Record<string, unknown>, string][] = [
      [{ startCmd: '' }, '"startCmd"'],
      [{ startCmd: 7 }, '"startCmd"'],
      [{ startCmd: 's', readyCmd: 'r', readyPort: 80 }, 'exclude each other'],
      [{ startCmd: 's', readyPort: 0 }, '"readyPort"'],
      [{ startCmd: 's', readyPort: 70000 }, '"readyPort"'],
      [{ startCmd: 's', readyPort: 8.5 }, '"readyPort"'],
      [{ startCmd: 's', startUser: 'admin' }, '"startUser"'],
      [{ startCmd: 's', readyTimeoutSec: 0 }, '"readyTimeoutSec"'],
      [{ startCmd: 's', readyTimeoutSec: 601 }, '"readyTimeoutSec"'],
      [{ readyPort: 80 }, 'needs "startCmd"'],
      [{ readyCmd: 'r' }, 'needs "startCmd"'],
    ];
    for (const [extra, why] of bad) {
      await put('t', { ...full, name: 't', ...extra });
      expect(await codeOf(loadTemplateDefinition('t', defs))).toBe('BAD_REQUEST');
      expect(await messageOf(loadTemplateDefinition('t', defs))).toContain(why);
      await put('d', { name: 'd', from: 'base', ...extra });
      expect(await messageOf(loadTemplateDefinition('d', defs))).toContain(why);
    }
  });

  it('the digest covers the start and the bytes of copied files; base without them keeps its digest', async () => {
    const plain = (await loadTemplateDefinition('base', defs)).digest;
    await put('base', { ...full, startCmd: 'a' });
    const withStart = (await loadTemplateDefinition('base', defs)).digest;
    expect(withStart).not.toBe(plain);
    await mkdir(join(defs, 'srv'));
    await writeFile(join(defs, 'srv', 'server.py'), 'one');
    await put('base', { ...full, copy: { '/opt/server.py': 'srv/server.py' } });
    const one = (await loadTemplateDefinition('base', defs)).digest;
    await writeFile(join(defs, 'srv', 'server.py'), 'two');
    expect((await loadTemplateDefinition('base', defs)).digest).not.toBe(one);
    for (const copy of [
      { '/opt/x': '../etc/passwd' },
      { '/opt/x': '/etc/passwd' },
      { 'opt/x': 'srv/server.py' },
    ]) {
      await put('base', { ...full, copy });
      expect(await messageOf(loadTemplateDefinition('base', defs))).toContain('"copy"');
    }
    await put('base', { ...full, copy: { '/opt/x': 'srv/missing.py' } });
    expect(await messageOf(loadTemplateDefinition('base', defs))).toContain('is not a file');
  });

  it('a derived template: only start settings of its own, its parent must be a full definition', async () => {
    await put('served', { name: 'served', from: 'base', startCmd: 's', readyPort: 8000 });
    const served = await loadTemplateDefinition('served', defs);
    expect(templateStart(served.definition)?.readyCmd).toContain('/dev/tcp/127.0.0.1/8000');
    expect(served.digest).not.toBe((await loadTemplateDefinition('base', defs)).digest);
    await put('base', { ...full, packages: ['curl'] });
    expect((await loadTemplateDefinition('served', defs)).digest).not.toBe(served.digest);
    await put('x', { name: 'x', from: 'base', packages: ['curl'] });
    expect(await messageOf(loadTemplateDefinition('x', defs))).toContain('"packages"');
    await put('x', { name: 'x', from: 'served' });
    expect(await messageOf(loadTemplateDefinition('x', defs))).toContain('itself derived');
    await put('x', { name: 'x', from: 'x' });
    expect(await messageOf(loadTemplateDefinition('x', defs))).toContain('"from"');
    await put('x', { name: 'x', from: 'nope' });
    expect(await codeOf(loadTemplateDefinition('x', defs))).toBe('TEMPLATE_NOT_FOUND');
  });

  it("a derived template resolves to its parent's build and is never baked itself", async () => {
    await put('served', { name: 'served', from: 'base', startCmd: 's' });
    const cache = join(defs, 'cache');
    expect(await codeOf(resolveTemplate('served', cache, defs))).toBe('TEMPLATE_NOT_READY');
    const { digest } = await loadTemplateDefinition('base', defs);
    const built = templateBuildDir(cache, 'base', digest);
    await mkdir(join(built, 'rootfs'), { recursive: true });
    await writeFile(join(built, 'complete'), '{}');
    expect(await resolveTemplate('served', cache, defs)).toBe(await resolveTemplate('base', cache, defs));
    expect(await adoptBakedTemplates(join(defs, 'assets'), cache, defs)).toEqual([]);
  });

  it("the repo's templates load, and code-interpreter-v1 serves port 49999 from its copied server", async () => {
    const { definition } = await loadTemplateDefinition('code-interpreter-v1', DEFAULT_TEMPLATES_DIR);
    expect(templateStart(definition)?.readyCmd).toContain('/dev/tcp/127.0.0.1/49999');
    expect('copy' in definition && definition.copy).toEqual({
      '/opt/space-code-interpreter/server.py': 'code-interpreter/server.py',
    });
  });

  it('code-interpreter-v1 is base plus its own: every package, tarball, file and the user of base', async () => {
    // a definition cannot extend another's packages, so the two files must not drift apart (the
    // interpreter kept Debian's Node 18 and lost sudo once base moved on)
    const base = (await loadTemplateDefinition('base', DEFAULT_TEMPLATES_DIR)).definition;
    const ci = (await loadTemplateDefinition('code-interpreter-v1', DEFAULT_TEMPLATES_DIR)).definition;
    if (!('packages' in base) || !('packages' in ci)) throw new Error('both must be full definitions');
    const { name: _b, description: _bd, ...baseRest } = base;
    for (const [key, value] of Object.entries(baseRest)) {
      const mine = (ci as unknown as Record<string, unknown>)[key];
      if (Array.isArray(value)) expect(mine, key).toEqual(expect.arrayContaining(value as unknown[]));
      else if (key === 'files') expect(mine, key).toMatchObject(value as object);
      else expect(mine, key).toEqual(value);
    }
  });
});
