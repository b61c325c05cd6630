/**
 * What this node supports, checked by trying (not by guessing from files): usable KVM, the VMM
 * binaries and their versions, runsc and its platforms, nftables, cgroups, tun, vsock, network
 * namespaces, the image tools — and which driver the agent would pick, with a remedy for each
 * missing piece. `space doctor` prints it; the agent logs the same choice at start.
 */
import { execFile } from 'node:child_process';
import { constants, existsSync } from 'node:fs';
import { access, readFile } from 'node:fs/promises';
import { dirname } from 'node:path';
import { promisify } from 'node:util';
import type { DriverName } from '../core/drivers.ts';
import { chooseDriver } from './drivers/index.ts';
import { type DiskReserve, floorBytes, gib, headroom, underPressure } from './host/disk-headroom.ts';
import { probeKvm } from './host/kvm.ts';

const run = promisify(execFile);

/** One finding. `ok: false` with `needed: true` means the chosen driver cannot run. */
export interface Check {
  /** Short stable id, e.g. `kvm`, `runsc`, `nftables`. */
  id: string;
  ok: boolean;
  /** What was found (a version, a path, an error). */
  detail: string;
  /** What to do about it when not ok. */
  remedy?: string;
  /** Drivers that need this check to pass. */
  neededBy: DriverName[];
  /** A feature (not a driver) that needs it, e.g. `CIDR egress rules`: listed, never blocking. */
  feature?: string;
}

/** The whole report. */
export interface DoctorReport {
  checks: Check[];
  /** What the agent would run with the given configuration. */
  driver: { name: DriverName | null; reason: string; kvm: boolean };
  /** True when every check the chosen driver needs passed. */
  ready: boolean;
}

/** The subset of agent settings {@link diagnose} reads. */
export type DoctorConfig = Parameters<typeof chooseDriver>[0];

/** First line of `bin args…` (stdout, else stderr), or the error. Never throws. */
async function firstLine(bin: string, args: string[]): Promise<{ ok: boolean; text: string }> {
  try {
    const { stdout, stderr } = await run(bin, args, { timeout: 10_000 });
    return { ok: true, text: (stdout || stderr).trim().split('\n')[0] ?? '' };
  } catch (err) {
    const e = err as { code?: string; message: string };
    return { ok: false, text: e.code === 'ENOENT' ? `${bin} not found` : e.message.split('\n')[0]! };
  }
}

/**
 * runsc's release date from `runsc --version` (upstream: `runsc version release-20240729.0`;
 * Debian: `runsc version 0.0~20240729.0`), or null. Pure.
 */
export function runscReleaseDate(versionText: string): string | null {
  const m = /(?:release-|~)(20\d{2})(\d{2})(\d{2})/.exec(versionText);
  return m ? `${m[1]}-${m[2]}-${m[3]}` : null;
}

/**
 * gVisor's `systrap` platform arrived in mid-2023 releases, and checkpoint of sandboxes with live
 * TCP endpoints was rejected by the 2022 releases (measured here: runsc 2022-12-19). Pure.
 */
export function runscFeatures(date: string | null): { systrap: boolean; modern: boolean } {
  const modern = date !== null && date >= '2023-06-01';
  return { systrap: modern, modern };
}

/** Cgroup layout: `v2`, `v1` (hybrid) with its controllers. */
async function cgroups(): Promise<{ ok: boolean; detail: string }> {
  const mounts = await readFile('/proc/self/mounts', 'utf8').catch(() => '');
  const v2root = mounts
    .split('\n')
    .some((l) => l.split(' ')[1] === '/sys/fs/cgroup' && l.split(' ')[2] === 'cgroup2');
  if (v2root) {
    const ctrl = await readFile('/sys/fs/cgroup/cgroup.controllers', 'utf8').catch(() => '');
    const have = ctrl.trim().split(/\s+/);
    const missing = ['cpu', 'memory', 'pids'].filter((c) => !have.includes(c));
    return {
      ok: missing.length === 0,
      detail: `v2 (${have.join(' ')})${missing.length ? `; missing ${missing}` : ''}`,
    };
  }
  const missing = ['cpu', 'memory', 'pids', 'freezer'].filter((c) => !existsSync(`/sys/fs/cgroup/${c}`));
  return {
    ok: missing.length === 0,
    detail: `v1${missing.length ? `; missing ${missing.join(', ')}` : ' (cpu, memory, pids, freezer)'}`,
  };
}

/** The sysctl that turns IPv4 forwarding on for every interface (`net.ipv4.conf.all.forwarding`). */
export const IPV4_FORWARD_SYSCTL = 'net.ipv4.ip_forward';

/** One interface a default route leaves by, and whether it forwards IPv4. */
export interface Uplink {
  ifname: string;
  forwarding: boolean;
}

/**
 * The interfaces of the node's IPv4 default routes (main table) with their
 * `/proc/sys/net/ipv4/conf/<if>/forwarding`. Empty when there is no default route.
 * @throws Error when `ip` cannot be run.
 */
export async function readUplinks(): Promise<Uplink[]> {
  const { stdout } = await run('ip', ['-j', '-4', 'route', 'show', 'default'], { timeout: 10_000 });
  const devs = [
    ...new Set((JSON.parse(stdout.trim() || '[]') as { dev?: string }[]).flatMap((r) => r.dev ?? [])),
  ];
  return Promise.all(
    devs.map(async (ifname) => ({
      ifname,
      forwarding:
        (await readFile(`/proc/sys/net/ipv4/conf/${ifname}/forwarding`, 'utf8').catch(() => '0')).trim() ===
        '1',
    })),
  );
}

/**
 * The doctor's finding on IPv4 forwarding (R24's third part). A sandbox's CIDR-rule connection is
 * forwarded out and masqueraded; its replies come in on the uplink and must be forwarded back to
 * the sandbox's veth, which the kernel does only when the interface they arrive on forwards
 * (`net.ipv4.conf.<uplink>.forwarding`). Without it the CIDR rules are accepted and every
 * connection they allow hangs. Needed by no driver: the agent runs without it, minus CIDR rules.
 * Pure. `uplinks` null: they could not be read (`error` says why).
 */
export function forwardingFinding(uplinks: Uplink[] | null, error = ''): Check {
  const base = {
    id: 'ipv4-forwarding',
    neededBy: [] as DriverName[],
    feature: 'CIDR egress rules',
    remedy: `sysctl -w ${IPV4_FORWARD_SYSCTL}=1, and keep it across reboots with a line "${IPV4_FORWARD_SYSCTL} = 1" in /etc/sysctl.d/60-space.conf (space up and the deployments set it); replies to CIDR-rule connections come in on the uplink and are dropped while it does not forward`,
  };
  if (uplinks === null) return { ...base, ok: false, detail: `uplinks unreadable: ${error}` };
  if (uplinks.length === 0)
    return { ...base, ok: false, detail: 'no IPv4 default route: CIDR rules reach nothing beyond the node' };
  const off = uplinks.filter((u) => !u.forwarding).map((u) => u.ifname);
  return off.length === 0
    ? { ...base, ok: true, detail: `forwarding on ${uplinks.map((u) => u.ifname).join(', ')}` }
    : {
        ...base,
        ok: false,
        detail: `net.ipv4.conf.${off[0]}.forwarding = 0${off.length > 1 ? ` (also ${off.slice(1).join(', ')})` : ''}: ${IPV4_FORWARD_SYSCTL} is off`,
      };
}

/**
 * The state disk's headroom as a finding: free and total bytes of the file system holding
 * `stateDir` (the nearest existing parent when it is not made yet) against the floor under which
 * the agent takes no new sandboxes. Listed, never blocking (it is not a driver's need).
 */
export async function stateDiskFinding(stateDir: string, reserve: DiskReserve): Promise<Check> {
  const base = {
    id: 'state-disk',
    neededBy: [] as DriverName[],
    feature: 'new sandboxes on this node',
    remedy: `free space on the file system of ${stateDir} (or lower SPACE_DISK_RESERVE_BYTES / SPACE_DISK_RESERVE_PERCENT)`,
  };
  let path = stateDir;
  while (!existsSync(path) && dirname(path) !== path) path = dirname(path);
  try {
    const h = await headroom(path);
    const floor = floorBytes(h.totalBytes, reserve);
    return {
      ...base,
      ok: !underPressure(h, reserve),
      detail: `${gib(h.freeBytes)} free of ${gib(h.totalBytes)} at ${stateDir} (floor ${gib(floor)})`,
    };
  } catch (err) {
    return { ...base, ok: false, detail: `${stateDir}: ${(err as Error).message}` };
  }
}

/**
 * Runs every check for configuration `c` (the agent's settings, from the environment), and the
 * state disk's headroom when `disk` says where it is. Never throws: a failed probe is a finding.
 */
export async function diagnose(
  c: DoctorConfig,
  disk?: { stateDir: string; reserve: DiskReserve },
): Promise<DoctorReport> {
  const checks: Check[] = [];
  const add = (x: Check) => checks.push(x);
  const vmm: DriverName[] = ['qemu', 'firecracker', 'cloud-hypervisor'];
  const all: DriverName[] = ['gvisor', ...vmm];

  add({
    id: 'root',
    ok: process.getuid?.() === 0,
    detail: `uid ${process.getuid?.()}`,
    remedy: 'run the agent (and space doctor) as root',
    neededBy: all,
  });
  const kvm = c.kvm === 'off' ? { usable: false, reason: 'SPACE_KVM=off' } : await probeKvm();
  add({
    id: 'kvm',
    ok: kvm.usable,
    detail: kvm.reason,
    remedy:
      'use an instance type with nested virtualisation or bare metal (see docs/deployment.md); without KVM, qemu runs under software emulation and firecracker/cloud-hypervisor cannot run',
    neededBy: ['firecracker', 'cloud-hypervisor'],
  });
  const qemu = await firstLine(c.qemuBinary, ['--version']);
  add({
    id: 'qemu',
    ok: qemu.ok,
    detail: qemu.text,
    remedy: 'apt-get install qemu-system-x86',
    neededBy: ['qemu'],
  });
  const fc = await firstLine(c.firecrackerBinary, ['--version']);
  add({
    id: 'firecracker',
    ok: fc.ok,
    detail: fc.ok ? fc.text : `${c.firecrackerBinary}: ${fc.text}`,
    remedy: 'install the firecracker release binary at SPACE_FIRECRACKER_BINARY',
    neededBy: ['firecracker'],
  });
  const jailer = await firstLine(c.jailerBinary, ['--version']);
  add({
    id: 'jailer',
    ok: jailer.ok,
    detail: jailer.ok ? jailer.text : `${c.jailerBinary}: ${jailer.text}`,
    remedy: 'install the jailer from the same firecracker release at SPACE_JAILER_BINARY',
    neededBy: ['firecracker'],
  });
  const ch = await firstLine(c.cloudHypervisorBinary, ['--version']);
  add({
    id: 'cloud-hypervisor',
    ok: ch.ok,
    detail: ch.ok ? ch.text : `${c.cloudHypervisorBinary}: ${ch.text}`,
    remedy: 'install the cloud-hypervisor static binary at SPACE_CLOUD_HYPERVISOR_BINARY',
    neededBy: ['cloud-hypervisor'],
  });
  const runsc = await firstLine(c.runscBinary, ['--version']);
  const date = runsc.ok ? runscReleaseDate(runsc.text) : null;
  const feats = runscFeatures(date);
  add({
    id: 'runsc',
    ok: runsc.ok,
    detail: runsc.ok
      ? `${runsc.text}; platforms: ptrace${feats.systrap ? ', systrap' : ''}; checkpoint/restore: ${feats.modern ? 'yes' : 'no (release before 2023)'}`
      : runsc.text,
    remedy: 'bash scripts/host-deps.sh (installs runsc)',
    neededBy: ['gvisor'],
  });
  if (runsc.ok && c.gvisorPlatform === 'systrap' && !feats.systrap) {
    add({
      id: 'runsc-platform',
      ok: false,
      detail: `SPACE_GVISOR_PLATFORM=systrap but runsc ${date ?? '?'} has no systrap`,
      remedy: 'upgrade runsc (scripts/host-deps.sh) or set SPACE_GVISOR_PLATFORM=ptrace',
      neededBy: ['gvisor'],
    });
  }
  const nft = await firstLine('nft', ['--version']);
  add({ id: 'nftables', ok: nft.ok, detail: nft.text, remedy: 'apt-get install nftables', neededBy: all });
  const cg = await cgroups();
  add({
    id: 'cgroups',
    ok: cg.ok,
    detail: cg.detail,
    remedy: 'enable the cpu, memory and pids controllers',
    neededBy: all,
  });
  const tun = await access('/dev/net/tun', constants.R_OK | constants.W_OK).then(
    () => true,
    () => false,
  );
  add({
    id: 'tun',
    ok: tun,
    detail: tun ? '/dev/net/tun' : '/dev/net/tun missing',
    remedy: 'modprobe tun (VM drivers attach a tap per sandbox)',
    neededBy: vmm,
  });
  const vsock = existsSync('/dev/vhost-vsock');
  add({
    id: 'vsock',
    ok: vsock,
    detail: vsock
      ? '/dev/vhost-vsock'
      : 'no /dev/vhost-vsock (the guest link uses TCP over the tap; not needed)',
    remedy: 'modprobe vhost_vsock (optional)',
    neededBy: [],
  });
  const netns = await firstLine('ip', ['netns', 'list']);
  add({
    id: 'netns',
    ok: netns.ok,
    detail: netns.ok ? 'ip netns works' : netns.text,
    remedy: 'apt-get install iproute2',
    neededBy: all,
  });
  const mkfs = await firstLine('mkfs.ext4', ['-V']);
  add({
    id: 'e2fsprogs',
    ok: mkfs.ok,
    detail: mkfs.text,
    remedy: 'apt-get install e2fsprogs (sandbox disks and VM images)',
    neededBy: all,
  });
  add(
    await readUplinks().then(
      (u) => forwardingFinding(u),
      (err: unknown) => forwardingFinding(null, (err as Error).message.split('\n')[0]),
    ),
  );
  if (disk) add(await stateDiskFinding(disk.stateDir, disk.reserve));
  const major = Number(process.versions.node.split('.')[0]);
  add({
    id: 'node',
    ok: major >= 24,
    detail: process.version,
    remedy: 'run through npm run / npx: the project pins Node 24 (the guest runs this same Node)',
    neededBy: all,
  });

  let driver: DoctorReport['driver'];
  try {
    const choice = await chooseDriver(c);
    driver = { name: choice.driver, reason: choice.reason, kvm: choice.kvm };
  } catch (err) {
    driver = { name: null, reason: (err as Error).message, kvm: kvm.usable };
  }
  const name = driver.name;
  const ready = name !== null && checks.every((x) => x.ok || !x.neededBy.includes(name));
  return { checks, driver, ready };
}
