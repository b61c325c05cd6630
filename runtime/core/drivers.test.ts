import { describe, expect, it } from 'vitest';
import { acceptingDrivers, isDriverName, shapeProblem } from './drivers.ts';

describe('driver shape rules', () => {
  it('Firecracker takes 1 or an even number of whole vCPUs, up to 32', () => {
    expect(shapeProblem('firecracker', { vcpus: 1, memoryMiB: 512 })).toBeNull();
    expect(shapeProblem('firecracker', { vcpus: 2, memoryMiB: 512 })).toBeNull();
    expect(shapeProblem('firecracker', { vcpus: 3, memoryMiB: 512 })).toMatch(/1 or an even number/);
    expect(shapeProblem('firecracker', { vcpus: 34, memoryMiB: 512 })).toMatch(/1–32/);
    expect(shapeProblem('firecracker', { vcpus: 0.5, memoryMiB: 512 })).toMatch(/whole number/);
    expect(shapeProblem('firecracker', { vcpus: 2, memoryMiB: 513 })).toMatch(/multiples of 2/);
  });

  it('gVisor takes fractions; the VMMs do not', () => {
    expect(acceptingDrivers({ vcpus: 0.5, memoryMiB: 256 })).toEqual(['gvisor']);
    expect(acceptingDrivers({ vcpus: 3, memoryMiB: 256 })).toEqual(['gvisor', 'qemu', 'cloud-hypervisor']);
    expect(acceptingDrivers({ vcpus: 2, memoryMiB: 100 })).toEqual([]);
  });

  it('knows its driver names', () => {
    expect(isDriverName('qemu')).toBe(true);
    expect(isDriverName('docker')).toBe(false);
  });
});
