#!/usr/bin/env node
/** Entry point of the `space` command line (see program.ts; `space --help`). */
import { main } from './program.ts';

await main();
