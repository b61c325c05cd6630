import { describe, expect, it } from 'vitest';
import { type KeptOutput, outputsToReclaim, READ_GRACE_MS, type SpoolRetention } from './retention.ts';

const R: SpoolRetention = { maxCommands: 3, maxBytes: 1000, maxAgeMs: 60_000 };
const NOW = 1_000_000;

function out(id: string, o: Partial<KeptOutput> = {}): KeptOutput {
  return { id, endedAt: NOW - 1000, readToEndAt: null, readers: 0, bytes: 10, ...o };
}

describe('command output retention', () => {
  it('a finished output read to its end goes once the read grace passed, not before', () => {
    const justRead = out('a', { readToEndAt: NOW - READ_GRACE_MS + 1 });
    const readLongAgo = out('b', { readToEndAt: NOW - READ_GRACE_MS });
    expect(outputsToReclaim([justRead, readLongAgo], R, NOW)).toEqual(['b']);
  });

  it('a finished output nobody read goes once it aged out', () => {
    expect(
      outputsToReclaim([out('a', { endedAt: NOW - 60_000 }), out('b', { endedAt: NOW - 59_999 })], R, NOW),
    ).toEqual(['a']);
  });

  it('over the count, the oldest finished outputs go first; running ones and ones being read never', () => {
    const kept = [
      out('run', { endedAt: null }),
      out('old', { endedAt: NOW - 5000 }),
      out('reading', { endedAt: NOW - 9000, readers: 1 }),
      out('mid', { endedAt: NOW - 3000 }),
      out('new', { endedAt: NOW - 100 }),
    ];
    // 5 kept, bound 3: two go, oldest finished first, skipping the one being read
    expect(outputsToReclaim(kept, R, NOW)).toEqual(['old', 'mid']);
  });

  it('over the bytes, finished outputs go until the rest fits', () => {
    const kept = [
      out('a', { endedAt: NOW - 3, bytes: 600 }),
      out('b', { endedAt: NOW - 2, bytes: 600 }),
      out('c', { endedAt: null, bytes: 300 }),
    ];
    expect(outputsToReclaim(kept, R, NOW)).toEqual(['a']);
  });

  it('only running outputs: nothing goes, whatever the bounds', () => {
    const kept = Array.from({ length: 10 }, (_, i) => out(`r${i}`, { endedAt: null, bytes: 500 }));
    expect(outputsToReclaim(kept, R, NOW)).toEqual([]);
  });
});
