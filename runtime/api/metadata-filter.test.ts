import { describe, expect, it } from 'vitest';
import { parseMetadataFilter } from './e2b/shapes.ts';
import { metadataFilter, parseV1MetadataQuery } from './metadata-filter.ts';

const codeOf = (f: () => unknown) => {
  try {
    f();
  } catch (err) {
    return (err as { code?: string }).code;
  }
  return 'none';
};

describe('r26 metadata filters mean what they say', () => {
  it('keeps every pair of different keys, one value query or many', () => {
    expect(parseV1MetadataQuery('role=a&team=x')).toEqual({ role: 'a', team: 'x' });
    expect(parseV1MetadataQuery(['role=a', 'team=x'])).toEqual({ role: 'a', team: 'x' });
    expect(
      metadataFilter([
        ['k', 'v'],
        ['k', 'v'],
      ]),
    ).toEqual({ k: 'v' });
  });
  it('refuses a key given twice with two values, in one query value, in repeated ones, and in E2B’s', () => {
    expect(codeOf(() => parseV1MetadataQuery('role=a&role=b'))).toBe('BAD_REQUEST');
    expect(codeOf(() => parseV1MetadataQuery(['role=a', 'role=b']))).toBe('BAD_REQUEST');
    expect(codeOf(() => parseMetadataFilter(encodeURIComponent('role=a&role=b')))).toBe('BAD_REQUEST');
    expect(parseMetadataFilter(encodeURIComponent('role=a&team=b'))).toEqual({ role: 'a', team: 'b' });
  });
});
