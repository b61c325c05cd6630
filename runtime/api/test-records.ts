/**
 * Test fixture (not shipped: the image leaves out test-*.ts): a new sandbox as the create route
 * hands it to the SandboxStore (`create`, `admit`), so the store's tests build it one way.
 */
import { normalisePolicy } from '../core/egress.ts';
import type { NewSandbox } from './sandbox-store.ts';

/**
 * New sandbox `id`: template `base`, 1 vCPU, 512 MiB, 60 s, team `default`, the default egress
 * policy, no metadata, env or grants; `overrides` replaces any of it.
 */
export function newSandbox(id: string, overrides: Partial<NewSandbox> = {}): NewSandbox {
  return {
    id,
    template: 'base',
    vcpus: 1,
    memoryMiB: 512,
    timeoutSec: 60,
    metadata: {},
    env: {},
    sessionId: 'ses_aaaaaaaaaaaaaaaaaaaa',
    egress: normalisePolicy(undefined),
    grants: [],
    team: 'default',
    ...overrides,
  };
}
