/**
 * The image's VMMs (issue 42 item 2): Firecracker + jailer and Cloud Hypervisor are fetched at
 * build time at pinned versions and kept only when their SHA-256 matches the pin; a pin without a
 * checksum fails the build (verification is never skipped); the image's labels name the drivers
 * it can run. Before, the build took whatever binaries someone passed and the image did not say
 * which VMMs it had.
 */
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, readFileSync, statSync } from 'node:fs';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { DEFAULT_IMAGE_ASSETS_DIR } from '../runtime/agent/image/assets.ts';
import { fetchVmm, imageVmms, readVmmReleases, type VmmRelease } from './image-assets.ts';

let work: string;
beforeEach(async () => {
  work = await mkdtemp(join(tmpdir(), 'space-image-assets-'));
});
afterEach(async () => rm(work, { recursive: true, force: true }));

const sha = (b: Buffer | string) => createHash('sha256').update(b).digest('hex');
/** A stand-in for the download: writes `bytes` and counts calls (no network). */
function serving(bytes: Buffer) {
  const calls: string[] = [];
  return {
    calls,
    fetchTo: async (url: string, dest: string) => {
      calls.push(url);
      await writeFile(dest, bytes);
    },
  };
}

describe('pins', () => {
  it('each VMM pin needs a version, an https URL, its binaries and a 64-hex sha256', async () => {
    const file = join(work, 'pins.json');
    await writeFile(
      file,
      JSON.stringify({
        firecracker: {
          version: '1.13.1',
          url: 'https://example.invalid/fc.tgz',
          sha256: '',
          binaries: { firecracker: 'a/firecracker' },
        },
        'cloud-hypervisor': {
          version: '48.0',
          url: 'http://example.invalid/ch',
          sha256: 'abc',
          binaries: { 'cloud-hypervisor': '' },
        },
      }),
    );
    const { problems } = readVmmReleases(file);
    expect(problems).toEqual([
      'firecracker: binaries lacks jailer',
      expect.stringMatching(/^firecracker 1\.13\.1: no sha256 pinned/),
      'cloud-hypervisor: url must be https://',
      expect.stringMatching(/^cloud-hypervisor 48\.0: no sha256 pinned/),
    ]);
  });

  it('the repository’s pins name Firecracker ≥ 1.7 (ACPI virtio-mmio discovery on x86_64) and both VMMs', () => {
    const { releases, problems } = readVmmReleases();
    // every pin complete, so an online build verifies what it downloads
    expect(problems).toEqual([]);
    const [major, minor] = releases.firecracker!.version.split('.').map(Number) as [number, number];
    expect(major > 1 || (major === 1 && minor >= 7)).toBe(true);
    expect(Object.keys(releases.firecracker!.binaries).sort()).toEqual(['firecracker', 'jailer']);
    expect(Object.keys(releases['cloud-hypervisor']!.binaries)).toEqual(['cloud-hypervisor']);
  });
});

describe('fetchVmm', () => {
  const binary = Buffer.from('#!/bin/sh\necho cloud-hypervisor v48.0\n');
  const rel = (sha256: string): VmmRelease => ({
    version: '48.0',
    url: 'https://example.invalid/cloud-hypervisor-static',
    sha256,
    binaries: { 'cloud-hypervisor': '' },
  });

  it('a download whose checksum differs from the pin is refused and not kept', async () => {
    const s = serving(Buffer.from('something else'));
    await expect(
      fetchVmm('cloud-hypervisor', rel(sha(binary)), join(work, 'cache'), join(work, 'out'), s.fetchTo),
    ).rejects.toThrow(/has sha256 [0-9a-f]{64}, the pin says/);
    expect(existsSync(join(work, 'out', 'cloud-hypervisor'))).toBe(false);
    expect(existsSync(join(work, 'cache', 'vmm', sha(binary)))).toBe(false);
  });

  it('a pin without a checksum downloads nothing and fails', async () => {
    const s = serving(binary);
    await expect(
      fetchVmm('cloud-hypervisor', rel(''), join(work, 'cache'), join(work, 'out'), s.fetchTo),
    ).rejects.toThrow(/no sha256 pinned/);
    expect(s.calls).toEqual([]);
  });

  it('a matching download is installed executable, and cached: the next build does not download', async () => {
    const s = serving(binary);
    const r = rel(sha(binary));
    expect(await fetchVmm('cloud-hypervisor', r, join(work, 'cache'), join(work, 'out'), s.fetchTo)).toEqual([
      'cloud-hypervisor',
    ]);
    expect(readFileSync(join(work, 'out', 'cloud-hypervisor'))).toEqual(binary);
    expect(statSync(join(work, 'out', 'cloud-hypervisor')).mode & 0o777).toBe(0o755);
    await fetchVmm('cloud-hypervisor', r, join(work, 'cache'), join(work, 'out2'), s.fetchTo);
    expect(s.calls).toHaveLength(1);
  });

  it('a release archive: each binary is taken from its path inside the .tgz', async () => {
    const tree = join(work, 'tree', 'release-v1.13.1-x86_64');
    await mkdir(tree, { recursive: true });
    await writeFile(join(tree, 'firecracker-v1.13.1-x86_64'), 'fc');
    await writeFile(join(tree, 'jailer-v1.13.1-x86_64'), 'jailer');
    const tgz = join(work, 'fc.tgz');
    execFileSync('tar', ['-czf', tgz, '-C', join(work, 'tree'), 'release-v1.13.1-x86_64']);
    const bytes = readFileSync(tgz);
    const out = join(work, 'out');
    await fetchVmm(
      'firecracker',
      {
        version: '1.13.1',
        url: 'https://example.invalid/fc.tgz',
        sha256: sha(bytes),
        binaries: {
          firecracker: 'release-v1.13.1-x86_64/firecracker-v1.13.1-x86_64',
          jailer: 'release-v1.13.1-x86_64/jailer-v1.13.1-x86_64',
        },
      },
      join(work, 'cache'),
      out,
      serving(bytes).fetchTo,
    );
    expect(readFileSync(join(out, 'firecracker'), 'utf8')).toBe('fc');
    expect(readFileSync(join(out, 'jailer'), 'utf8')).toBe('jailer');
  });
});

describe('what the image says it can run', () => {
  it('gvisor and qemu always; a VMM only with all its binaries', () => {
    expect(imageVmms(new Set())).toEqual(['gvisor', 'qemu']);
    expect(imageVmms(new Set(['firecracker']))).toEqual(['gvisor', 'qemu']);
    expect(imageVmms(new Set(['firecracker', 'jailer', 'cloud-hypervisor']))).toEqual([
      'gvisor',
      'qemu',
      'firecracker',
      'cloud-hypervisor',
    ]);
  });

  it('the Containerfile unpacks the assets where the agent looks by default', () => {
    const file = readFileSync(new URL('../Containerfile', import.meta.url), 'utf8');
    expect(file).toContain(`ADD assets.tar ${DEFAULT_IMAGE_ASSETS_DIR}/`);
  });
});
