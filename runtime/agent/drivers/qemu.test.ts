import { describe, expect, it } from 'vitest';
import { moduleDepends, moduleLoadOrder } from '../image/guest-kernel.ts';
import { GUEST_ARGV } from '../image/images.ts';
import { BOOT_MARKER, initScript, shQuote } from '../image/vm-image.ts';
import { GUEST_NET } from './driver.ts';
import { guestClockArgs, inNetns, mapQmpStatus, qemuArgv } from './qemu-argv.ts';
import { vmKernelCmdline } from './vm-common.ts';

const base = {
  name: 'i-abc',
  kvm: false,
  vcpus: 1.5,
  memoryMiB: 512,
  kernel: '/k/vmlinuz',
  initrd: '/k/initrd.cpio.gz',
  cmdline: 'console=ttyS0',
  console: '/s/console.log',
};

describe('qemuArgv', () => {
  it('builds a TCG microvm with the template read-only first, the instance disk second, tap NIC, QMP, daemonized', () => {
    const a = qemuArgv({
      ...base,
      rootfsImage: '/img/rootfs.ext4',
      disk: '/s/disk.img',
      tap: { name: 'tap0', mac: GUEST_NET.guestMac },
      qmpSocket: '/s/qmp.sock',
      pidFile: '/s/qemu.pid',
    });
    const at = (flag: string) => a[a.indexOf(flag) + 1];
    expect(at('-M')).toBe('microvm,accel=tcg');
    expect(at('-cpu')).toBe('max');
    expect(at('-smp')).toBe('2'); // rounded up
    expect(at('-m')).toBe('512M');
    expect(at('-serial')).toBe('file:/s/console.log');
    expect(at('-append')).toBe('console=ttyS0');
    const drives = a.filter((_, i) => a[i - 1] === '-drive');
    expect(drives[0]).toMatch(/^id=rootfs,file=\/img\/rootfs.ext4,.*readonly=on/);
    expect(drives[1]).toMatch(/^id=disk,file=\/s\/disk.img,/);
    expect(drives[1]).not.toContain('readonly');
    expect(a).toContain(`virtio-net-device,netdev=net0,mac=${GUEST_NET.guestMac}`);
    expect(at('-netdev')).toBe('tap,id=net0,ifname=tap0,script=no,downscript=no');
    expect(at('-qmp')).toBe('unix:/s/qmp.sock,server=on,wait=off');
    expect(a).toContain('-daemonize');
    expect(a).toContain('-no-reboot');
    expect(a).not.toContain('-incoming');
  });

  it('uses KVM with the host CPU, and waits for a migration on restore', () => {
    const a = qemuArgv({ ...base, kvm: true, vcpus: 0.5, incoming: true, console: 'stdio' });
    expect(a[a.indexOf('-M') + 1]).toBe('microvm,accel=kvm');
    expect(a[a.indexOf('-cpu') + 1]).toBe('host');
    expect(a[a.indexOf('-smp') + 1]).toBe('1');
    expect(a[a.indexOf('-serial') + 1]).toBe('stdio');
    expect(a.slice(-3)).toEqual(['-S', '-incoming', 'defer']);
    expect(a).not.toContain('-drive');
  });

  it('runs inside the sandbox namespace', () => {
    expect(inNetns('sp-x', 'qemu-system-x86_64', ['-M', 'microvm'])).toEqual({
      cmd: 'nsenter',
      args: ['--net=/var/run/netns/sp-x', '--', 'qemu-system-x86_64', '-M', 'microvm'],
    });
  });
});

describe('small pure helpers', () => {
  it('maps QMP run states', () => {
    expect(mapQmpStatus('running')).toBe('running');
    for (const s of ['paused', 'postmigrate', 'inmigrate', 'prelaunch'])
      expect(mapQmpStatus(s)).toBe('paused');
    for (const s of [undefined, 'shutdown', 'internal-error']) expect(mapQmpStatus(s)).toBe('stopped');
  });

  it('gives a TCG guest its TSC frequency and a KVM guest nothing', () => {
    expect(guestClockArgs(false, 'processor\t: 0\ncpu MHz\t\t: 2596.142\n')).toEqual([
      'tsc_early_khz=2596142',
    ]);
    expect(guestClockArgs(false, '')).toEqual(['tsc_early_khz=2000000']);
    expect(guestClockArgs(true, 'cpu MHz : 3000')).toEqual([]);
  });

  it('kernel command line names the disks and fixed guest addresses, and no secret', () => {
    const c = vmKernelCmdline(['tsc_early_khz=1']);
    expect(c).toContain('rdinit=/init');
    expect(c).toContain('space.rootfs=/dev/vda space.disk=/dev/vdb');
    expect(c).toContain(`space.ip=${GUEST_NET.guestAddress}/30 space.gw=${GUEST_NET.gatewayAddress}`);
    expect(c.endsWith(' tsc_early_khz=1')).toBe(true);
    expect(c).not.toMatch(/token/i);
  });
});

describe('guest initrd', () => {
  it('init loads modules in order, overlays the disks, sets up the network and switch_roots to the guest daemon', () => {
    const s = initScript(['virtio_ring', 'virtio', 'virtio_mmio']);
    expect(s.startsWith('#!/bin/busybox sh\n')).toBe(true);
    expect(s).toContain('for m in virtio_ring virtio virtio_mmio; do insmod');
    expect(s).toContain('mount -t ext4 -o ro "$rootdev" /mnt/lower');
    expect(s).toContain('upperdir=/mnt/disk/upper,workdir=/mnt/disk/work /newroot');
    expect(s).toContain('ip route add default via "$gw"');
    expect(s).toContain('echo "nameserver $gw" > /newroot/etc/resolv.conf');
    expect(s).toContain(`echo "${BOOT_MARKER}"`);
    const last = s.trim().split('\n').pop()!;
    expect(last).toBe(
      `exec env -i PATH='/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' HOME='/root' LANG='C.UTF-8' switch_root /newroot ${GUEST_ARGV.map(shQuote).join(' ')}`,
    );
    // the limits the gVisor driver sets, as a VM's kernel enforces them (R19-R21)
    expect(s).toContain('size=25% shm /newroot/dev/shm');
    expect(s).toContain('echo -1000 > /proc/self/oom_score_adj');
    expect(s).toContain('nproc=$((mem / 2)); [ "$nproc" -lt 256 ] && nproc=256');
    expect(s.indexOf('ulimit -u "$nproc"')).toBeLessThan(s.indexOf('switch_root /newroot'));
    // the probe modes stop before the guest daemon
    expect(s.indexOf('probe" = early')).toBeLessThan(s.indexOf('insmod'));
    expect(s.indexOf('probe" = late')).toBeLessThan(s.indexOf('switch_root'));
  });

  it('reads module dependencies and orders them, skipping built-ins', () => {
    const ko = Buffer.from('\x7fELF....\0license=GPL\0depends=virtio,virtio_ring\0retpoline=Y\0');
    expect(moduleDepends(ko)).toEqual(['virtio', 'virtio_ring']);
    expect(moduleDepends(Buffer.from('\0depends=\0'))).toEqual([]);
    const paths = new Map([
      ['virtio_net', 'kernel/drivers/net/virtio_net.ko'],
      ['net_failover', 'x'],
      ['failover', 'x'],
      ['virtio', 'x'],
      ['virtio_ring', 'x'],
      ['overlay', 'x'],
    ]);
    const deps: Record<string, string[]> = {
      virtio_net: ['net_failover', 'virtio', 'virtio_ring'],
      net_failover: ['failover'],
      virtio: ['virtio_ring'],
    };
    expect(
      moduleLoadOrder(['virtio_net', 'ext4', 'overlay'], paths, new Set(['ext4']), (m) => deps[m] ?? []),
    ).toEqual(['failover', 'net_failover', 'virtio_ring', 'virtio', 'virtio_net', 'overlay']);
    expect(() => moduleLoadOrder(['nope'], paths, new Set(), () => [])).toThrow(/neither built in/);
  });
});
