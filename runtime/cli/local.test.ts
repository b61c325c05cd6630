import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { DEFAULT_API_URL, localPaths, resolveEndpoint, spaceHome } from './local.ts';
import { CliError } from './output.ts';

describe('resolveEndpoint', () => {
  const home = mkdtempSync(join(tmpdir(), 'space-home-'));
  const env = { SPACE_HOME: home };
  afterAll(() => rmSync(home, { recursive: true, force: true }));

  it('needs a key from somewhere', () => {
    expect(() => resolveEndpoint({}, env)).toThrowError(CliError);
  });

  it('reads $SPACE_HOME/api-key and local.json', () => {
    writeFileSync(localPaths(home).apiKey, 'sk_file\n');
    expect(resolveEndpoint({}, env)).toMatchObject({ apiUrl: DEFAULT_API_URL, apiKey: 'sk_file' });
    writeFileSync(localPaths(home).localJson, JSON.stringify({ apiUrl: 'http://127.0.0.1:9999/' }));
    expect(resolveEndpoint({}, env)).toMatchObject({ apiUrl: 'http://127.0.0.1:9999', apiKey: 'sk_file' });
  });

  it('prefers environment over files and flags over environment', () => {
    const e = { ...env, SPACE_API_URL: 'http://env:1', SPACE_API_KEY: 'sk_env' };
    expect(resolveEndpoint({}, e)).toMatchObject({ apiUrl: 'http://env:1', apiKey: 'sk_env' });
    expect(resolveEndpoint({ apiUrl: 'http://flag:2', apiKey: 'sk_flag' }, e)).toMatchObject({
      apiUrl: 'http://flag:2',
      apiKey: 'sk_flag',
      source: { apiUrl: '--api-url', apiKey: '--api-key' },
    });
  });

  it('defaults SPACE_HOME to ~/.space', () => {
    expect(spaceHome({})).toMatch(/\.space$/);
    expect(spaceHome({ SPACE_HOME: '/x/y' })).toBe('/x/y');
  });
});
