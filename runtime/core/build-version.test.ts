import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { buildVersion } from './build-version.ts';

const pkgVersion = (
  JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as { version: string }
).version;

describe('buildVersion', () => {
  it('is the image tag the process was started as', () => {
    expect(buildVersion({ SPACE_VERSION: '0.2.0-rc.1' })).toBe('0.2.0-rc.1');
  });
  it('falls back to the package version when SPACE_VERSION is absent or not an image tag', () => {
    expect(buildVersion({})).toBe(pkgVersion);
    expect(buildVersion({ SPACE_VERSION: 'a b' })).toBe(pkgVersion);
    expect(buildVersion({ SPACE_VERSION: '-x' })).toBe(pkgVersion);
  });
});
