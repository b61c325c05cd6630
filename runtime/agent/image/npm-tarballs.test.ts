/**
 * npm-tarballs: entries are validated, a tarball is served by a loopback registry (a real HTTP
 * server and a real `tar`), checked against its pinned integrity, and copied and linked into a tree.
 */
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import {
  chmodSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  readlinkSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  installNpmTarballs,
  matchesIntegrity,
  type NpmTarball,
  npmTarballProblem,
  tarballUrl,
} from './npm-tarballs.ts';

const sri = (b: Buffer) => `sha512-${createHash('sha512').update(b).digest('base64')}`;

let dir: string;
let server: Server;
let registry: string;
let tgz: Buffer;
const asked: string[] = [];

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'space-npm-tarballs-'));
  // a package as the registry packs it: everything under package/
  const pkg = join(dir, 'src', 'package');
  mkdirSync(join(pkg, 'bin'), { recursive: true });
  mkdirSync(join(pkg, 'lib'), { recursive: true });
  writeFileSync(join(pkg, 'bin', 'tool'), '#!/bin/sh\necho tool\n');
  chmodSync(join(pkg, 'bin', 'tool'), 0o755);
  writeFileSync(join(pkg, 'lib', 'a.js'), 'module.exports = 1;\n');
  execFileSync('tar', ['-czf', join(dir, 'p.tgz'), '-C', join(dir, 'src'), 'package']);
  tgz = readFileSync(join(dir, 'p.tgz'));
  server = createServer((req, res) => {
    asked.push(req.url ?? '');
    if (req.url === '/pkg-x/-/pkg-x-1.2.3.tgz') res.end(tgz);
    else res.writeHead(404).end();
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  registry = `http://127.0.0.1:${(server.address() as AddressInfo).port}/`;
});
afterAll(() => {
  server?.close();
  rmSync(dir, { recursive: true, force: true });
});

const entry = (over: Partial<NpmTarball> = {}): NpmTarball => ({
  name: 'pkg-x',
  version: '1.2.3',
  integrity: sri(tgz),
  copy: { 'bin/tool': '/usr/local/bin/tool', lib: '/usr/local/lib/x' },
  links: { '/usr/local/bin/tool2': 'tool' },
  ...over,
});

describe('npm tarballs', () => {
  it('validates entries and builds the registry URL', () => {
    const ok = entry({ integrity: `sha512-${'A'.repeat(86)}==` });
    expect(npmTarballProblem(ok)).toBeNull();
    expect(npmTarballProblem({ ...ok, version: '^1.2.3' })).toMatch(/exact version/);
    expect(npmTarballProblem({ ...ok, integrity: 'sha1-abc' })).toMatch(/SRI/);
    expect(npmTarballProblem({ ...ok, copy: {} })).toMatch(/at least one/);
    expect(npmTarballProblem({ ...ok, copy: { '../etc': '/x' } })).toMatch(/inside the package/);
    expect(npmTarballProblem({ ...ok, copy: { bin: 'relative' } })).toMatch(/absolute/);
    expect(npmTarballProblem({ ...ok, links: { '/a/../b': 'x' } })).toMatch(/link/);
    expect(tarballUrl('https://r.example/', 'npm', '11.0.0')).toBe('https://r.example/npm/-/npm-11.0.0.tgz');
    expect(tarballUrl('https://r.example', '@s/p', '1.0.0')).toBe('https://r.example/@s/p/-/p-1.0.0.tgz');
    expect(matchesIntegrity(tgz, sri(tgz))).toBe(true);
    expect(matchesIntegrity(Buffer.concat([tgz, Buffer.from('x')]), sri(tgz))).toBe(false);
  });

  it('copies and links the pinned package into the tree; skips other arches', async () => {
    const root = join(mkdtempSync(join(dir, 'build-')), 'rootfs');
    mkdirSync(root);
    const done = await installNpmTarballs(root, [entry(), entry({ name: 'pkg-y', arch: 'other' })], {
      registry,
      arch: 'x64',
    });
    expect(done).toEqual(['pkg-x@1.2.3']);
    expect(readFileSync(join(root, 'usr/local/bin/tool'), 'utf8')).toBe('#!/bin/sh\necho tool\n');
    expect(statSync(join(root, 'usr/local/bin/tool')).mode & 0o777).toBe(0o755);
    expect(readFileSync(join(root, 'usr/local/lib/x/a.js'), 'utf8')).toBe('module.exports = 1;\n');
    expect(readlinkSync(join(root, 'usr/local/bin/tool2'))).toBe('tool');
    expect(asked).not.toContain('/pkg-y/-/pkg-y-1.2.3.tgz');
  });

  it('refuses a tarball whose integrity is not the pinned one, and a missing package', async () => {
    const root = join(mkdtempSync(join(dir, 'build-')), 'rootfs');
    mkdirSync(root);
    const other = sri(Buffer.from('another tarball'));
    await expect(installNpmTarballs(root, [entry({ integrity: other })], { registry })).rejects.toThrow(
      /integrity is not the pinned/,
    );
    await expect(installNpmTarballs(root, [entry({ version: '9.9.9' })], { registry })).rejects.toThrow(
      /404/,
    );
    await expect(
      installNpmTarballs(root, [entry({ copy: { 'bin/none': '/usr/local/bin/none' } })], { registry }),
    ).rejects.toThrow(/has no bin\/none/);
  });
});
