/**
 * Whether KVM is *usable* on this node — not whether `/dev/kvm` exists. On nested machines
 * `/dev/kvm` can open and create VMs while an ordinary guest kernel hangs at boot (seen on
 * the nested cloud VMs SPACE was measured on), so the answer comes from trying.
 */
import { constants } from 'node:fs';
import { access } from 'node:fs/promises';

/** Result of {@link probeKvm}. */
export interface KvmProbe {
  usable: boolean;
  /** Why not (or how it was confirmed). */
  reason: string;
}

/** A boot test: resolves true when a guest booted under KVM within its time limit. */
export type KvmBootTest = () => Promise<{ ok: boolean; detail: string }>;

let bootTest: KvmBootTest | null = null;

/** Installs the boot test (the qemu driver provides one that boots the guest kernel under KVM). */
export function setKvmBootTest(test: KvmBootTest): void {
  bootTest = test;
}

let cached: Promise<KvmProbe> | null = null;

/**
 * Probes KVM once per process: `/dev/kvm` must open read-write, and — when a boot test is
 * installed — a guest must boot under it.
 */
export function probeKvm(): Promise<KvmProbe> {
  cached ??= (async (): Promise<KvmProbe> => {
    try {
      await access('/dev/kvm', constants.R_OK | constants.W_OK);
    } catch {
      return { usable: false, reason: '/dev/kvm is missing or not accessible' };
    }
    if (!bootTest) return { usable: false, reason: '/dev/kvm opens, but no boot test confirmed it works' };
    const r = await bootTest().catch((err: unknown) => ({ ok: false, detail: String(err) }));
    return r.ok
      ? { usable: true, reason: `a guest booted under KVM (${r.detail})` }
      : { usable: false, reason: `/dev/kvm opens but a guest did not boot under it (${r.detail})` };
  })();
  return cached;
}
