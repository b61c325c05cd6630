/**
 * The data-plane router on the control VM: its environment (Redis and the verify key the control
 * VM made, nothing else) and its podman unit (no capabilities).
 */
import { routerEnvironment, SERVICE_COMMANDS, VERIFY_KEY_FILE } from '../runtime-settings.ts';
import type { VmTls } from './api.ts';
import { unit, type VmFile } from './plan.ts';
import { REDIS_UNIT } from './redis.ts';

/** The router's env (`space-router` in the VM configuration). Pure. */
export function routerServiceEnv(): Record<string, string> {
  // SPACE_REDIS_URL: REDIS_ENV_FILE (it carries the password)
  return routerEnvironment();
}

/** The router's podman unit. Pure. */
export function routerUnit(tls: VmTls): VmFile {
  return unit(
    'space-router',
    'SPACE data-plane router',
    SERVICE_COMMANDS.router,
    [
      `-v ${VERIFY_KEY_FILE}:${VERIFY_KEY_FILE}:ro`,
      '--cap-drop all',
      '--security-opt no-new-privileges',
      ...tls.serve,
    ],
    [`After=space-keys.service ${REDIS_UNIT}`, 'Requires=space-keys.service'],
    tls.pre,
  );
}
