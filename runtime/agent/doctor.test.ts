import { describe, expect, it } from 'vitest';
import { runscFeatures, runscReleaseDate } from './doctor.ts';

describe('doctor: runsc versions', () => {
  it('reads upstream and Debian version strings', () => {
    expect(runscReleaseDate('runsc version release-20240729.0')).toBe('2024-07-29');
    expect(runscReleaseDate('runsc version 0.0~20221219.0')).toBe('2022-12-19');
    expect(runscReleaseDate('runsc version unknown')).toBeNull();
  });

  it('knows which releases have systrap and checkpoint of live TCP endpoints', () => {
    expect(runscFeatures('2022-12-19')).toEqual({ systrap: false, modern: false });
    expect(runscFeatures('2024-07-29')).toEqual({ systrap: true, modern: true });
    expect(runscFeatures(null)).toEqual({ systrap: false, modern: false });
  });
});
