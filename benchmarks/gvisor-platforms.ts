#!/usr/bin/env node
/**
 * gVisor platforms side by side on this node (root; runsc ≥ 2024-07-29; builds the `base` template
 * into the cache on first use):
 *
 *   npm run bench:gvisor -- [--runs 5] [--platforms ptrace,systrap] [--cache /var/lib/space]
 *
 * For each platform, with the real driver and guest daemon (see benchmarks/gvisor-lib.ts): the
 * floor (`runsc do true`), cold create, snapshot, snapshot-restore create, pause, resume, a syscall
 * loop and a spawn loop. Prints a table of medians (ms) and the raw samples as JSON.
 */
import { existsSync } from 'node:fs';
import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Command } from 'commander';
import { SandboxNetworks } from '../runtime/agent/host/network.ts';
import { directoryImage } from '../runtime/agent/image/images.ts';
import { buildTemplate } from '../runtime/agent/image/templates.ts';
import { TEST_CACHE_DIR } from '../test/cache-dir.ts';
import { formatFigures, type GvisorFigures, measureGvisor } from './gvisor-lib.ts';

interface Opts {
  runs: string;
  platforms: string;
  cache: string;
  runsc: string;
}

const opts = new Command('gvisor-platforms')
  .description('gVisor ptrace vs systrap: floor, create, snapshot/restore, pause/resume, syscall loops')
  .option('--runs <n>', 'samples per figure', '5')
  .option('--platforms <list>', 'comma list of ptrace, systrap', 'ptrace,systrap')
  .option('--cache <dir>', 'template cache', TEST_CACHE_DIR)
  .option('--runsc <path>', 'runsc binary', process.env['SPACE_RUNSC_BINARY'] ?? 'runsc')
  .parse()
  .opts<Opts>();

const platforms = opts.platforms.split(',').map((p) => {
  if (p !== 'ptrace' && p !== 'systrap') throw new Error(`unknown platform ${p}`);
  return p;
});
const nodeBinary = [
  fileURLToPath(new URL('../node_modules/node/bin/node', import.meta.url)),
  process.execPath,
].find((p) => existsSync(p))!;
await buildTemplate('base', { cacheDir: opts.cache });
const image = await directoryImage('base', opts.cache, { nodeBinary, tiniBinary: '/usr/bin/tini-static' });
const nets = new SandboxNetworks({ pool: '10.79.2.0/24' });
const all: GvisorFigures[] = [];
for (const platform of platforms) {
  const stateDir = await mkdtemp(join(tmpdir(), `space-bench-${platform}-`));
  all.push(
    await measureGvisor({
      platform,
      runs: Number(opts.runs),
      stateDir,
      image,
      nets,
      runscBinary: opts.runsc,
    }),
  );
}
console.log(formatFigures(all));
console.log(JSON.stringify(all));
