/**
 * The gVisor platform a node uses unless SPACE_GVISOR_PLATFORM says otherwise.
 *
 * Chosen from `npm run bench:gvisor -- --runs 5` (benchmarks/gvisor-platforms.ts), runsc 2024-07-29 on
 * a 2-core Debian 12 VM without usable KVM, shared with other work; medians in ms, ptrace / systrap:
 * floor `runsc do true` 295 / 308; cold create 1166 / 875; snapshot 304 / 299; snapshot-restore
 * create 291 / 346; pause 74 / 67; resume to /health 60 / 71; 200 000 syscalls (dd bs=1) 4021 / 5650;
 * 100 spawns of /bin/true 760 / 837.
 *
 * Starts are equal within noise (the floor and restore dominate, not the platform); on syscall-heavy
 * work ptrace was ahead here. systrap's stub threads spin for a free core, which a busy 2-core node
 * lacks; on nodes with spare cores systrap (gVisor's own default) may win: re-run the benchmark there
 * and set SPACE_GVISOR_PLATFORM=systrap if it does.
 */
export const DEFAULT_GVISOR_PLATFORM: 'ptrace' | 'systrap' = 'ptrace';
