/**
 * Test fixtures (left out of the image with every `test-*.ts`): the {@link SandboxManager} options
 * a node of in-memory fakes (drivers/test-fake-driver.ts) runs with, the fakes themselves, and a
 * create request, so the manager's tests build them one way.
 */
import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pino } from 'pino';
import { FakeDriver, FakeGateway, FakeGuests, FakeNetworks } from '../drivers/test-fake-driver.ts';
import type { SandboxManager } from './manager.ts';
import type { CreateSandbox, SandboxManagerOptions } from './types.ts';

/**
 * A node's fakes: a new temp folder (`<tmp>/<prefix>…`), guest daemons listening on loopback, a
 * {@link FakeDriver} over them, {@link FakeNetworks} and a {@link FakeGateway}. The caller closes
 * `guests` and removes `dir`.
 */
export async function fakeParts(prefix: string) {
  const dir = await mkdtemp(join(tmpdir(), prefix));
  const guests = new FakeGuests();
  await guests.listen();
  return {
    dir,
    guests,
    driver: new FakeDriver(guests),
    networks: new FakeNetworks(),
    gateway: new FakeGateway(),
  };
}

/**
 * Options of a {@link SandboxManager} over the fakes, its state in `<dir>/state` and its
 * hibernations in `<dir>/hibernated` (store `test`): no disk limit, 256 kept command outputs,
 * silent logs. `overrides` replaces any of them.
 */
export function fakeManagerOptions(
  parts: { dir: string; driver: FakeDriver; networks: FakeNetworks; gateway: FakeGateway },
  overrides: Partial<SandboxManagerOptions> = {},
): SandboxManagerOptions {
  return {
    stateDir: join(parts.dir, 'state'),
    driver: parts.driver,
    networks: parts.networks,
    templateImage: async (t) => ({ template: t, digest: 'fake', lowerDirs: [] }),
    pidsLimit: 64,
    diskMiB: 0,
    createConcurrency: 4,
    refillConcurrency: 1,
    spoolLimitBytes: 1 << 20,
    spoolRetention: { maxCommands: 256, maxBytes: 1 << 30, maxAgeMs: 3_600_000 },
    gateway: parts.gateway,
    baseEnv: {},
    hibernateDir: join(parts.dir, 'hibernated'),
    hibernateStore: 'test',
    activity: null,
    log: pino({ level: 'silent' }),
    ...overrides,
  };
}

/**
 * A create request for sandbox `id`: template `base`, 1 vCPU and 256 MiB, a minute to live, no
 * env, no egress, no credentials; `overrides` replaces any of it.
 */
export function createRequest(id: string, overrides: Partial<CreateSandbox> = {}): CreateSandbox {
  return {
    sandboxId: id,
    sessionId: 'ses0000000001',
    template: 'base',
    vcpus: 1,
    memoryMiB: 256,
    env: {},
    expiresAtMs: Date.now() + 60_000,
    egress: { mode: 'allow-list', allow: [], deny: [], cidrs: [] },
    credentials: [],
    ...overrides,
  };
}
