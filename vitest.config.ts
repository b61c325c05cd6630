import { defineConfig } from 'vitest/config';

// Two projects: `unit` (fast, needs only a real Redis) and `int` (real runsc, namespaces,
// nftables; runs as root). Both get a throwaway redis-server from test/global-setup.ts.
/**
 * Minutes-long whole-system suites (see the `slow` project): the fault suite, the upgrade
 * rehearsal, the lifecycle suite (its R8 burst boots 100 sandboxes) and the benchmark commands on
 * a tiny N (each starts a stack of its own).
 */
const SLOW = [
  'test/faults.int.test.ts',
  // round-3 fault cases (F6–F10), one file per kind of fault so each starts its own stack
  'test/faults-*.int.test.ts',
  'test/upgrade.int.test.ts',
  'test/lifecycle.int.test.ts',
  // issue 44: the failover suite (the space up --ha stack under Redis, API and router faults)
  'test/failover.int.test.ts',
  'benchmarks/bench.int.test.ts',
];

export default defineConfig({
  test: {
    globalSetup: ['test/global-setup.ts'],
    // int tests share host resources (address pool, nftables table, runsc root): one file at a time
    fileParallelism: false,
    projects: [
      {
        extends: true,
        test: {
          name: 'unit',
          include: [
            'runtime/**/*.test.ts',
            'benchmarks/**/*.test.ts',
            'providers/**/*.test.ts',
            'stacks/**/*.test.ts',
            'scripts/**/*.test.ts',
            'test/rehearsal/**/*.test.ts',
          ],
          exclude: ['**/*.int.test.ts', 'node_modules/**'],
          sequence: { groupOrder: 0 },
        },
      },
      {
        extends: true,
        test: {
          name: 'int',
          include: [
            'runtime/**/*.int.test.ts',
            'test/**/*.int.test.ts',
            'providers/**/*.int.test.ts',
            'benchmarks/**/*.int.test.ts',
          ],
          exclude: [...SLOW, 'node_modules/**'],
          // after the unit project, not beside it: without a group order vitest runs projects at
          // once, and the unit files' CPU (Pulumi's mock engine, promtool, node per VM document)
          // landed on the int cases that race host timing, e.g. r21, whose memory guard must kill
          // inside a 64 MiB margin (~64 ms at 1 GB/s) before the host's limit ends the sandbox
          sequence: { groupOrder: 1 },
          testTimeout: 120_000,
          hookTimeout: 600_000,
        },
      },
      {
        extends: true,
        test: {
          // whole-system suites of minutes each: their own CI step (`npm run test:slow`), so the
          // default `npm test` stays well under 15 min (~16 min with them, ~12 without)
          name: 'slow',
          include: SLOW,
          sequence: { groupOrder: 2 },
          testTimeout: 300_000,
          hookTimeout: 600_000,
        },
      },
    ],
  },
});
