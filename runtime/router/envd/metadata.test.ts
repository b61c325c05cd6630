/** File metadata at the edges: envd's header rules (router) and the limits both ends check (core). */
import { describe, expect, it } from 'vitest';
import {
  FILE_METADATA_LIMITS,
  fileMetadataProblem,
  parseFileMetadataHeader,
} from '../../core/guest-protocol.ts';
import { entryOf } from './filesystem.ts';
import { metadataOfHeaders } from './service.ts';

describe('metadataOfHeaders: X-Metadata-* as envd reads them', () => {
  it('lowercases keys, keeps the first value of a repeated header, drops an empty key and other headers', () => {
    const raw = [
      'Content-Type',
      'application/octet-stream',
      'X-Metadata-Author',
      'ann',
      'x-metadata-author',
      'second',
      'X-METADATA-Purpose',
      'a run',
      'X-Metadata-',
      'ignored',
      'X-Space-File-Metadata',
      '{"injected":"1"}',
    ];
    expect(metadataOfHeaders(raw)).toEqual({ author: 'ann', purpose: 'a run' });
    expect(metadataOfHeaders([])).toEqual({});
  });

  it('`__proto__` is a key like any other (an own property, not the prototype)', () => {
    const m = metadataOfHeaders(['X-Metadata-__proto__', 'p']);
    expect(Object.keys(m)).toEqual(['__proto__']);
    expect(Object.getPrototypeOf(m)).toBe(Object.prototype);
    expect(JSON.parse(JSON.stringify(m))).toEqual(m);
  });
});

describe('fileMetadataProblem / parseFileMetadataHeader: envd’s limits', () => {
  const { keyBytes, totalBytes, xattrPrefixBytes } = FILE_METADATA_LIMITS;
  it('accepts up to the limits and refuses one byte over each', () => {
    expect(fileMetadataProblem({})).toBeNull();
    expect(fileMetadataProblem({ ['k'.repeat(keyBytes)]: 'v' })).toBeNull();
    expect(fileMetadataProblem({ ['k'.repeat(keyBytes + 1)]: 'v' })).toMatch(/longer than 246 bytes/);
    const value = (n: number) => 'v'.repeat(totalBytes - xattrPrefixBytes - 1 - n);
    expect(fileMetadataProblem({ k: value(0) })).toBeNull();
    expect(fileMetadataProblem({ k: value(-1) })).toMatch(/4097 bytes, more than 4096/);
    // the total counts every entry's prefix
    expect(fileMetadataProblem({ a: 'x'.repeat(2000), b: 'x'.repeat(2000) })).toBeNull();
    expect(fileMetadataProblem({ a: 'x'.repeat(2040), b: 'x'.repeat(2040) })).toMatch(/more than 4096/);
  });

  it('refuses what is not printable ASCII, empty keys and non-strings', () => {
    for (const bad of [{ '': 'v' }, { k: 'tab\t' }, { 'k\n': 'v' }, { k: 'é' }, { k: 1 }, ['a'], null, 'x']) {
      expect(fileMetadataProblem(bad), JSON.stringify(bad)).not.toBeNull();
    }
    expect(fileMetadataProblem({ k: ' ~!"#' })).toBeNull();
  });

  it('parses the header: absent = undefined, bad JSON or bad metadata = BAD_REQUEST', () => {
    expect(parseFileMetadataHeader(undefined)).toBeUndefined();
    expect(parseFileMetadataHeader('{"a":"b"}')).toEqual({ a: 'b' });
    expect(() => parseFileMetadataHeader('{"a":')).toThrow(expect.objectContaining({ code: 'BAD_REQUEST' }));
    expect(() => parseFileMetadataHeader('{"a":1}')).toThrow(
      expect.objectContaining({ code: 'BAD_REQUEST' }),
    );
  });
});

describe('entryOf: metadata', () => {
  it('carries the file’s metadata, and none when it has none', () => {
    const f = { name: 'a', path: '/a', type: 'file', size: 1, mode: 0o644, mtimeMs: 0 } as const;
    expect(entryOf({ ...f, metadata: { k: 'v' } }).metadata).toEqual({ k: 'v' });
    expect(entryOf(f).metadata).toEqual({});
  });
});
