/** createDriver: the node's settings reach the driver it builds. */
import { describe, expect, it } from 'vitest';
import { DRIVER_NAMES } from '../../core/drivers.ts';
import { createDriver } from './index.ts';

const base = {
  driver: 'auto',
  kvm: 'auto',
  gvisorPlatform: 'systrap',
  gvisorSnapshots: 'off',
  runscBinary: 'runsc',
  qemuBinary: 'qemu-system-x86_64',
  firecrackerBinary: 'firecracker',
  jailerBinary: 'jailer',
  cloudHypervisorBinary: 'cloud-hypervisor',
} as const;

/** The guest wait a built driver holds (private or protected fields, read at run time). */
function guestWaitMs(d: unknown): number {
  const o = d as { cfg?: { healthTimeoutMs: number }; healthTimeoutMs?: number };
  return o.cfg?.healthTimeoutMs ?? o.healthTimeoutMs ?? Number.NaN;
}

describe('createDriver', () => {
  it('SPACE_GUEST_READY_TIMEOUT_MS reaches every driver; 0 keeps each driver’s own default', () => {
    const deps = { stateDir: '/nonexistent/space-driver-test' };
    for (const name of DRIVER_NAMES) {
      expect(
        guestWaitMs(createDriver(name, { ...base, guestReadyTimeoutMs: 240_000 }, deps, true)),
        name,
      ).toBe(240_000);
      const own = guestWaitMs(createDriver(name, { ...base, guestReadyTimeoutMs: 0 }, deps, true));
      expect(own, name).toBe(30_000);
    }
    // QEMU without KVM boots under software emulation: its own default is longer
    expect(guestWaitMs(createDriver('qemu', { ...base, guestReadyTimeoutMs: 0 }, deps, false))).toBe(180_000);
  });
});
