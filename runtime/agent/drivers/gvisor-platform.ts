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
 * slower on systrap.
 *
 * systrap is the default all the same, because only systrap bounds the host tasks a sandbox's
 * processes cost (case R19: a fork bomb run by the sandbox user must not end the sandbox). Under
 * ptrace every address space has a stub process with a host thread for each sentry thread that ever
 * ran it, and stubs are pooled, so a fork loop that churns processes grows the host tasks without
 * bound while the guest's own count stays at its limit. Measured with `bomb(){ bomb|bomb & };
 * bomb` as uid 1000 in a 512 MiB sandbox (256 guest tasks allowed), host pids limit lifted:
 * ptrace reached 11,806 host tasks after 35 s (1,531 at 2 s, ~350 a second) and then 480 MiB and an
 * OOM end; systrap levelled at 552 host tasks (518 host processes) within 9 s and stayed there for
 * the whole 40 s, the sandbox answering after it. Killing the bomb's processes does not help under
 * ptrace: four rounds of `runsc kill` of every uid-1000 process took the host tasks from 3,493 to
 * 10,603, then the sandbox ran out of memory.
 *
 * What systrap costs: CPU while idle. 8 idle sandboxes used 252 ms of CPU a second under systrap
 * against 22 ms under ptrace (their cpuacct cgroups over 10 s; a bare `runsc do sleep` 44 against
 * 6), so this 2-core VM cannot hold 100 idle systrap sandboxes (the R8 burst runs on ptrace for
 * that reason: test/lifecycle.int.test.ts). A node that only runs trusted, process-heavy work may
 * set SPACE_GVISOR_PLATFORM=ptrace, knowing a fork bomb then ends its sandbox (`killReason: pids`).
 */
export const DEFAULT_GVISOR_PLATFORM: 'ptrace' | 'systrap' = 'systrap';
