/**
 * Which build of SPACE this process is: the image tag it was built or started as (`SPACE_VERSION`,
 * stamped into the image by `scripts/image.sh`), else the package version. Nodes report it in
 * their heartbeat (`GET /v1/nodes` → `version`) and the API and router in `GET /healthz`, so an
 * operator (and the deployment rehearsal) can watch a version bump reach every VM.
 */
import { readFileSync } from 'node:fs';
import { VERSION_TAG } from './redis-keys.ts';

let cached: string | undefined;

/** `package.json`'s `version` (the CLI's `--version` too), else `0.0.0`. Reads the file. */
export function packageVersion(): string {
  try {
    const pkg = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as {
      version?: unknown;
    };
    return typeof pkg.version === 'string' ? pkg.version : '0.0.0';
  } catch {
    return '0.0.0';
  }
}

/**
 * The build's version string: `SPACE_VERSION` when it is a valid image tag ({@link VERSION_TAG}),
 * else {@link packageVersion}. Read once per process.
 */
export function buildVersion(env: NodeJS.ProcessEnv = process.env): string {
  if (env === process.env && cached !== undefined) return cached;
  const fromEnv = env['SPACE_VERSION'];
  const v = fromEnv && VERSION_TAG.test(fromEnv) ? fromEnv : packageVersion();
  if (env === process.env) cached = v;
  return v;
}
