/**
 * The docs' generated tables (errors in docs/api.md, config in docs/configuration.md) match the
 * code: run `npm run docs` after changing either.
 */
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { fill, GENERATED_PAGES, generatedBlocks } from '../../scripts/docs.ts';
import { ERROR_CODES } from './errors.ts';

const read = (page: string): string => readFileSync(new URL(`../../${page}`, import.meta.url), 'utf8');

describe('the docs stay in step with the code', () => {
  it('every generated block sits in its page, current', () => {
    const blocks = generatedBlocks();
    const placed = Object.values(GENERATED_PAGES).flat();
    expect(placed.toSorted(), 'each block has one page').toEqual(Object.keys(blocks).toSorted());
    for (const [page, names] of Object.entries(GENERATED_PAGES)) {
      const text = read(page);
      for (const name of names) {
        expect(text, `${page} has the block "${name}"`).toContain(`<!-- generated:${name} -->`);
      }
      expect(fill(text, blocks), `${page} is current (npm run docs)`).toBe(text);
    }
  });

  it('docs/api.md lists every error code exactly once', () => {
    const api = read('docs/api.md');
    for (const code of Object.keys(ERROR_CODES)) {
      expect(api.split(`| \`${code}\` |`).length - 1, code).toBe(1);
    }
  });
});
