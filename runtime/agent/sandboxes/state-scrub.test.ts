import { mkdir, mkdtemp, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { scrubCredentialValues } from './state-scrub.ts';

const dirs: string[] = [];
afterAll(async () => {
  for (const d of dirs) await rm(d, { recursive: true, force: true });
});

describe('scrubCredentialValues', () => {
  it('removes values an earlier version wrote, keeps the rest, and leaves the file 0600', async () => {
    const root = await mkdtemp(join(tmpdir(), 'scrub-'));
    dirs.push(root);
    const grant = {
      name: 'gh',
      placeholder: 'space_ph_x',
      domains: ['api.github.com'],
      header: 'authorization',
    };
    await mkdir(join(root, 'old'));
    await writeFile(
      join(root, 'old', 'sandbox.json'),
      JSON.stringify({ req: { sandboxId: 'old', credentials: [{ ...grant, value: 'ghp_SECRETVALUE' }] } }),
      { mode: 0o644 },
    );
    await mkdir(join(root, 'new'));
    await writeFile(join(root, 'new', 'sandbox.json'), JSON.stringify({ req: { credentials: [grant] } }), {
      mode: 0o644,
    });
    expect(await scrubCredentialValues(root)).toBe(1);
    const text = await readFile(join(root, 'old', 'sandbox.json'), 'utf8');
    expect(text).not.toContain('ghp_SECRETVALUE');
    expect(JSON.parse(text)).toEqual({ req: { sandboxId: 'old', credentials: [grant] } });
    for (const id of ['old', 'new'])
      expect((await stat(join(root, id, 'sandbox.json'))).mode & 0o777).toBe(0o600);
    expect(await scrubCredentialValues(root)).toBe(0);
    expect(await scrubCredentialValues(join(root, 'missing'))).toBe(0);
  });
});
