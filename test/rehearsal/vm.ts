/**
 * One rehearsal VM: QEMU under software emulation (TCG; KVM does not boot guests on these hosts)
 * on a tap of the rehearsal bridge, booted from an overlay of a base image and seeded through
 * cloud-init's NoCloud source (an ISO labelled `cidata` with `user-data`, `meta-data` and
 * `network-config`). `user-data` is passed through byte for byte: a `#cloud-config` document or a
 * shell script (cloud-init runs a user-data that starts with `#!`, which is how the Crusoe
 * startup script is rehearsed). The serial console goes to `console.log` in the VM's directory.
 * Source of the NoCloud layout: cloud-init's documentation, "NoCloud" datasource.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { once } from 'node:events';
import { createWriteStream } from 'node:fs';
import { mkdir, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { connect } from 'node:net';
import { join } from 'node:path';
import { stringify } from 'yaml';
import type { BaseImage } from './base-image.ts';
import { REHEARSAL_NET, run } from './host.ts';
import { createTap, inNamespace } from './network.ts';

/** What a VM is made from. */
export interface VmSpec {
  /** Short name: hostname, tap and directory (letters, digits, `-`; at most 12 characters). */
  readonly name: string;
  /** Its address on the private network (inside `REHEARSAL_NET.privateCidr`). */
  readonly address: string;
  /** The user data exactly as the stack renders it. */
  readonly userData: string;
  readonly base: BaseImage;
  /** Guest memory, MiB. */
  readonly memoryMiB: number;
  readonly vcpus: number;
}

/** A running VM. */
export interface Vm {
  readonly spec: VmSpec;
  readonly consoleFile: string;
  /** Resolves with the matching console line once `pattern` appears; throws after `timeoutMs` or if QEMU exits. */
  waitForConsole(pattern: RegExp, timeoutMs: number): Promise<string>;
  /** The console so far. */
  console(): Promise<string>;
  /**
   * Shuts the VM down: an ACPI power-button press through QMP (the guest flushes its journal and
   * disks), then SIGTERM to QEMU after `graceMs` (default 90 s: a TCG guest is slow to stop), then
   * SIGKILL.
   */
  stop(graceMs?: number): Promise<void>;
  /**
   * Pulls the plug: SIGKILL to QEMU, no shutdown inside (the guest's disks and journal stay as they
   * were at that instant). Resolves once QEMU has exited; {@link stop} is then a no-op.
   */
  powerOff(): Promise<void>;
  /**
   * After {@link stop}: the journal of the VM's `space-*` units (and cloud-init's), read from its
   * disk without booting it (`debugfs` dumps `/var/log/journal`, `journalctl --directory` reads
   * it), written to `journal.txt` beside the console. Returns that path. Throws when the disk holds
   * no journal.
   */
  journal(): Promise<string>;
}

/** A stable locally administered MAC for `name`. */
export function macFor(name: string): string {
  const h = createHash('sha256').update(name).digest();
  return ['52', '54', h[0], h[1], h[2], h[3]]
    .map((b) => (typeof b === 'number' ? b.toString(16).padStart(2, '0') : b))
    .join(':');
}

/**
 * NoCloud `network-config` (version 2): one interface, matched by MAC, a static address and a
 * default route through the bridge (as a cloud's VPC gives; the namespace routes only to the host).
 */
export function networkConfig(name: string, address: string): string {
  const { gateway } = REHEARSAL_NET;
  return stringify({
    version: 2,
    ethernets: {
      eth0: {
        match: { macaddress: macFor(name) },
        'set-name': 'eth0',
        addresses: [`${address}/24`],
        // not `routes`: cloud-init 22.4's ifupdown rendering adds routes with net-tools' `route`,
        // which a minimal image lacks; `gateway4` becomes ifupdown's own `gateway` line
        gateway4: gateway,
      },
    },
  });
}

/** Boots `spec` under `workDir/<name>`. Throws if the tap, overlay or seed cannot be made. */
export async function bootVm(spec: VmSpec, workDir: string): Promise<Vm> {
  if (!/^[a-z0-9-]{1,12}$/.test(spec.name))
    throw new Error(`VM name ${JSON.stringify(spec.name)} is not [a-z0-9-]{1,12}`);
  const dir = join(workDir, spec.name);
  const seed = join(dir, 'seed');
  await mkdir(seed, { recursive: true });
  await writeFile(join(seed, 'user-data'), spec.userData);
  await writeFile(
    join(seed, 'meta-data'),
    stringify({ 'instance-id': `rehearsal-${spec.name}`, 'local-hostname': spec.name }),
  );
  await writeFile(join(seed, 'network-config'), networkConfig(spec.name, spec.address));
  const seedIso = join(dir, 'seed.iso');
  await run('genisoimage', [
    '-quiet',
    '-output',
    seedIso,
    '-volid',
    'cidata',
    '-joliet',
    '-rock',
    join(seed, 'user-data'),
    join(seed, 'meta-data'),
    join(seed, 'network-config'),
  ]);
  const disk = join(dir, 'disk.qcow2');
  await run('qemu-img', ['create', '-q', '-f', 'qcow2', '-b', spec.base.disk, '-F', 'qcow2', disk]);
  const tap = `rh-${spec.name}`.slice(0, 15);
  await createTap(tap);
  const consoleFile = join(dir, 'console.log');
  const out = createWriteStream(consoleFile);
  const [cmd, args] = inNamespace('qemu-system-x86_64', [
    '-M',
    'q35,accel=tcg',
    '-cpu',
    'max',
    '-smp',
    String(spec.vcpus),
    '-m',
    String(spec.memoryMiB),
    '-nodefaults',
    '-no-user-config',
    '-nographic',
    '-serial',
    'stdio',
    '-kernel',
    spec.base.kernel,
    '-initrd',
    spec.base.initrd,
    '-append',
    'console=ttyS0 root=/dev/vda rw panic=-1 net.ifnames=0',
    '-drive',
    `file=${disk},if=virtio,discard=unmap`,
    '-drive',
    `file=${seedIso},if=virtio,media=cdrom,readonly=on`,
    '-netdev',
    `tap,id=n0,ifname=${tap},script=no,downscript=no`,
    '-device',
    `virtio-net-pci,netdev=n0,mac=${macFor(spec.name)}`,
    '-no-reboot',
    '-qmp',
    `unix:${join(dir, 'qmp.sock')},server=on,wait=off`,
  ]);
  const child: ChildProcess = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  child.stdout?.pipe(out);
  child.stderr?.pipe(out);
  let exited = false;
  child.once('exit', () => {
    exited = true;
  });
  const readConsole = () => readFile(consoleFile, 'utf8').catch(() => '');
  return {
    spec,
    consoleFile,
    console: readConsole,
    async waitForConsole(pattern, timeoutMs) {
      const deadline = Date.now() + timeoutMs;
      for (;;) {
        const text = await readConsole();
        const line = text.split('\n').find((l) => pattern.test(l));
        if (line !== undefined) return line;
        if (exited) throw new Error(`VM ${spec.name} stopped before ${pattern}; console: ${consoleFile}`);
        if (Date.now() > deadline)
          throw new Error(`VM ${spec.name}: no ${pattern} after ${timeoutMs} ms; console: ${consoleFile}`);
        await new Promise((r) => setTimeout(r, 1_000));
      }
    },
    async stop(graceMs = 90_000) {
      if (exited) return;
      const gone = new Promise<void>((resolve) => child.once('exit', () => resolve()));
      await powerButton(join(dir, 'qmp.sock')).catch(() => undefined);
      const term = setTimeout(() => child.kill('SIGTERM'), graceMs);
      const kill = setTimeout(() => child.kill('SIGKILL'), graceMs + 5_000);
      await gone;
      clearTimeout(term);
      clearTimeout(kill);
    },
    async powerOff() {
      if (exited) return;
      const gone = once(child, 'exit');
      child.kill('SIGKILL');
      await gone;
    },
    async journal() {
      const raw = join(dir, 'disk.raw');
      const dump = join(dir, 'journal-dump');
      await rm(dump, { recursive: true, force: true });
      await mkdir(dump, { recursive: true });
      try {
        await run('qemu-img', ['convert', '-O', 'raw', disk, raw], { timeoutMs: 600_000 });
        await run('debugfs', ['-R', `rdump /var/log/journal ${dump}`, raw]);
      } finally {
        await rm(raw, { force: true });
      }
      const text = await run('journalctl', [
        '--directory',
        await journalDir(join(dump, 'journal')),
        '--no-pager',
        '-o',
        'short-monotonic',
        '-u',
        'space-*',
        '-u',
        'cloud-final',
        '-u',
        'podman*',
      ]).catch((err: Error) => `journalctl failed: ${err.message}`);
      const file = join(dir, 'journal.txt');
      await writeFile(file, text);
      return file;
    },
  };
}

/** Presses the VM's power button over QMP (`qmp_capabilities`, then `system_powerdown`). */
async function powerButton(socketPath: string): Promise<void> {
  await new Promise<void>((resolve, reject) => {
    const sock = connect(socketPath);
    let buf = '';
    let step = 0;
    sock.setTimeout(10_000, () => sock.destroy(new Error('QMP: no answer')));
    sock.on('data', (d) => {
      buf += d.toString('utf8');
      // one JSON object per line: the greeting, then one answer per command
      while (buf.includes('\n')) {
        const line = buf.slice(0, buf.indexOf('\n'));
        buf = buf.slice(buf.indexOf('\n') + 1);
        if (!line.includes('"return"') && !line.includes('"QMP"')) continue;
        if (step === 0) sock.write('{"execute":"qmp_capabilities"}\n');
        else if (step === 1) sock.write('{"execute":"system_powerdown"}\n');
        else {
          sock.end();
          resolve();
        }
        step++;
      }
    });
    sock.on('error', reject);
  });
}

/** The machine folder under a dumped `/var/log/journal` (the first machine id's). */
async function journalDir(root: string): Promise<string> {
  const ids = await readdir(root).catch(() => [] as string[]);
  if (ids.length === 0) throw new Error(`no journal under ${root} (not persistent on this base?)`);
  return join(root, ids[0]!);
}
