import { defineConfig } from 'vitest/config';

// Two projects: `unit` (fast, needs only a real Redis) and `int` (real runsc, namespaces,
// nftables; runs as root). Both get a throwaway redis-server from test/global-setup.ts.
/** The fault suite and the upgrade rehearsal (see the `slow` project). */
const SLOW = ['test/faults.int.test.ts', 'test/upgrade.int.test.ts'];

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
          ],
          exclude: ['**/*.int.test.ts', 'node_modules/**'],
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
          testTimeout: 120_000,
          hookTimeout: 600_000,
        },
      },
      {
        extends: true,
        test: {
          // whole-system suites that run every service as its own process (minutes each): their
          // own CI steps (`npm run test:slow`), so the default `npm test` stays well under 15 min
          name: 'slow',
          include: SLOW,
          testTimeout: 300_000,
          hookTimeout: 600_000,
        },
      },
    ],
  },
});
