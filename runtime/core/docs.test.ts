/** The README's generated tables (errors, config) match the code: run `npm run docs` after changing either. */
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { fill, generatedBlocks } from '../../scripts/docs.ts';
import { ERROR_CODES } from './errors.ts';

const readme = readFileSync(new URL('../../README.md', import.meta.url), 'utf8');

describe('README stays in step with the code', () => {
  it('has every generated block, current', () => {
    const blocks = generatedBlocks();
    for (const name of Object.keys(blocks)) {
      expect(readme, `README has the block "${name}"`).toContain(`<!-- generated:${name} -->`);
    }
    expect(fill(readme, blocks)).toBe(readme);
  });

  it('lists every error code exactly once', () => {
    for (const code of Object.keys(ERROR_CODES)) {
      expect(readme.split(`| \`${code}\` |`).length - 1, code).toBe(1);
    }
  });
});
