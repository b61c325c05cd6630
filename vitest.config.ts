import { defineConfig } from 'vitest/config';

// Two projects: `unit` (fast, needs only a real Redis) and `int` (real runsc, namespaces,
// nftables; runs as root). Both get a throwaway redis-server from test/global-setup.ts.
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
          include: ['runtime/**/*.int.test.ts', 'test/**/*.int.test.ts', 'providers/**/*.int.test.ts'],
          testTimeout: 120_000,
          hookTimeout: 600_000,
        },
      },
    ],
  },
});
