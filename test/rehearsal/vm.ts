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
import { createWriteStream } from 'node:fs';
import { mkdir, readFile, writeFile } from 'node:fs/promises';
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
  /** Powers the VM off (SIGTERM to QEMU, then SIGKILL). */
  stop(): Promise<void>;
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
    stop: () =>
      new Promise<void>((resolve) => {
        if (exited) return resolve();
        child.once('exit', () => resolve());
        child.kill('SIGTERM');
        setTimeout(() => child.kill('SIGKILL'), 5_000).unref();
      }),
  };
}
