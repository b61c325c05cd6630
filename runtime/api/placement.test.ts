import { describe, expect, it } from 'vitest';
import { largestShapes } from './placement.ts';

describe('r25 largestShapes: the largest shapes on offer', () => {
  it('keeps each shape no other node beats on both vCPUs and memory, largest memory first', () => {
    const nodes = [
      { vcpus: 4, memoryMiB: 8192 },
      { vcpus: 16, memoryMiB: 4096 },
      { vcpus: 2, memoryMiB: 2048 },
      { vcpus: 4, memoryMiB: 8192 },
    ];
    expect(largestShapes(nodes)).toEqual([
      { vcpus: 4, memoryMiB: 8192 },
      { vcpus: 16, memoryMiB: 4096 },
    ]);
    expect(largestShapes([{ vcpus: 8, memoryMiB: 1024 }])).toEqual([{ vcpus: 8, memoryMiB: 1024 }]);
  });
});
