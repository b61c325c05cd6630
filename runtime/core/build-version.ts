/**
 * Which build of SPACE this process is: the image tag it was built or started as (`SPACE_VERSION`,
 * stamped into the image by `scripts/image.sh`), else the package version. Nodes report it in
 * their heartbeat (`GET /v1/nodes` → `version`) and the API and router in `GET /healthz`, so an
 * operator (and the deployment rehearsal) can watch a version bump reach every VM.
 */
import { readFileSync } from 'node:fs';
import { VERSION_TAG } from './redis-keys.ts';

let cached: string | undefined;

/**
 * The build's version string: `SPACE_VERSION` when it is a valid image tag ({@link VERSION_TAG}),
 * else `package.json`'s `version`, else `0.0.0`. Read once per process.
 */
export function buildVersion(env: NodeJS.ProcessEnv = process.env): string {
  if (env === process.env && cached !== undefined) return cached;
  const fromEnv = env['SPACE_VERSION'];
  let v: string;
  if (fromEnv && VERSION_TAG.test(fromEnv)) v = fromEnv;
  else {
    try {
      const pkg = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as {
        version?: unknown;
      };
      v = typeof pkg.version === 'string' ? pkg.version : '0.0.0';
    } catch {
      v = '0.0.0';
    }
  }
  if (env === process.env) cached = v;
  return v;
}
