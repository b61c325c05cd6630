import { describe, expect, it } from 'vitest';
import { endCauseFromCounters, fileCacheBytes } from './gvisor-limits.ts';

describe('fileCacheBytes', () => {
  it('adds the file LRU lists of memory.stat (v1 local counters, v2 alike), not the hierarchical totals', () => {
    const v1 =
      'cache 20062208\nrss 12283904\nshmem 17846272\ninactive_anon 27140096\nactive_anon 2990080\ninactive_file 880640\nactive_file 1335296\ntotal_inactive_file 880640\ntotal_active_file 1335296\n';
    expect(fileCacheBytes(v1)).toBe(880640 + 1335296);
    expect(fileCacheBytes('anon 100\nfile 900\nactive_file 300\ninactive_file 600\n')).toBe(900);
    expect(fileCacheBytes('')).toBe(0);
  });
});

describe('endCauseFromCounters', () => {
  it('names memory for an OOM kill, processes for a refused fork, nothing for clean counters', () => {
    const v1mem = (n: number) => `oom_kill_disable 0\nunder_oom 0\noom_kill ${n}\n`;
    expect(endCauseFromCounters(v1mem(1), 'max 0\n')).toBe('memory');
    expect(endCauseFromCounters(v1mem(0), 'max 3\n')).toBe('processes');
    expect(endCauseFromCounters(v1mem(2), 'max 3\n')).toBe('memory');
    expect(endCauseFromCounters(v1mem(0), 'max 0\n')).toBeUndefined();
    // v2 memory.events: oom_kill among other counters; no files at all reads as unknown
    expect(endCauseFromCounters('low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\n', '')).toBe('memory');
    expect(endCauseFromCounters('', '')).toBeUndefined();
  });
});
