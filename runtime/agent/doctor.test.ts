import { describe, expect, it } from 'vitest';
import { forwardingFinding, readUplinks, runscFeatures, runscReleaseDate } from './doctor.ts';

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

describe('doctor: IPv4 forwarding for CIDR egress rules', () => {
  it('names the uplink that does not forward and the sysctl to set; never blocks a driver', () => {
    const off = forwardingFinding([
      { ifname: 'eth0', forwarding: false },
      { ifname: 'eth1', forwarding: true },
    ]);
    expect(off).toMatchObject({
      id: 'ipv4-forwarding',
      ok: false,
      neededBy: [],
      feature: 'CIDR egress rules',
    });
    expect(off.detail).toMatch(/net\.ipv4\.conf\.eth0\.forwarding = 0/);
    expect(off.remedy).toMatch(/sysctl -w net\.ipv4\.ip_forward=1/);
    expect(forwardingFinding([{ ifname: 'eth0', forwarding: true }])).toMatchObject({ ok: true });
    expect(forwardingFinding([]).ok).toBe(false);
    expect(forwardingFinding(null, 'ip: not found')).toMatchObject({
      ok: false,
      detail: expect.stringMatching(/ip: not found/),
    });
  });

  it("reads this host's default routes and their forwarding from the kernel", async () => {
    const { readFile } = await import('node:fs/promises');
    // the main table's default routes as /proc/net/route has them (destination and mask 0)
    const proc = (await readFile('/proc/net/route', 'utf8'))
      .split('\n')
      .slice(1)
      .map((l) => l.split('\t'))
      .filter((f) => f[1] === '00000000' && f[7] === '00000000')
      .map((f) => f[0]!);
    const uplinks = await readUplinks();
    expect(uplinks.map((u) => u.ifname).sort()).toEqual([...new Set(proc)].sort());
    for (const u of uplinks) {
      const raw = (await readFile(`/proc/sys/net/ipv4/conf/${u.ifname}/forwarding`, 'utf8')).trim();
      expect(u.forwarding).toBe(raw === '1');
    }
  });
});
