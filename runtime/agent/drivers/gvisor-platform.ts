/**
 * The gVisor platform a node uses unless SPACE_GVISOR_PLATFORM says otherwise.
 *
 * Chosen from `npm run bench:gvisor -- --runs 5` (benchmarks/gvisor-platforms.ts), runsc 2024-07-29
 * on a 2-core Debian 12 VM without usable KVM; medians in ms, ptrace / systrap, both platforms in one
 * run each time:
 *
 * | | quiet machine | machine busy with other VMs |
 * |---|---|---|
 * | floor `runsc do true` | 154 / 162 | 295 / 308 |
 * | cold create (real guest) | 751 / 844 | 1166 / 875 |
 * | snapshot-restore create | 261 / 280 | 291 / 346 |
 * | pause; resume to /health | 29, 33 / 30, 27 | 74, 60 / 67, 71 |
 * | 200 000 syscalls (`dd bs=1`) | 10 719 / 1 216 | 4 021 / 5 650 |
 * | 100 spawns of /bin/true | 376 / 945 | 760 / 837 |
 *
 * Starts are equal within noise: the floor and the guest's own start dominate, not the platform.
 * Syscall-heavy work (package installs, compilers, file I/O) is ~9× faster on systrap when a core
 * is free and ~1.4× slower when none is (its stub threads spin for one); process spawns are ~2.5×
 * slower on systrap. A node full of sandboxes has no free core, and there systrap loses: the
 * 100-concurrent-create test (`r8-bursts-of-creates`) took 70 s on ptrace and was cut off at its
 * 120 s limit on systrap, in two runs of the full suite on this machine. So ptrace is the default; a node that keeps cores
 * spare for syscall-heavy sandboxes should set SPACE_GVISOR_PLATFORM=systrap.
 */
export const DEFAULT_GVISOR_PLATFORM: 'ptrace' | 'systrap' = 'ptrace';
