import { readFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { faultMessage } from './vmm-api.ts';
import { killAndWait, mapVmmState, pidAlive, processRssBytes, spawnLauncher } from './vmm-common.ts';

describe('vmm-common', () => {
  let dir: string;
  beforeEach(async () => {
    dir = await mkdtemp(join(tmpdir(), 'vmm-common-'));
  });
  afterEach(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it('reads fault_message bodies and plain-text errors', () => {
    expect(
      faultMessage(
        '{"fault_message":"The requested operation is not supported after starting the microVM."}',
      ),
    ).toBe('The requested operation is not supported after starting the microVM.');
    expect(faultMessage('Error from API: The VM could not be restored\n')).toBe(
      'Error from API: The VM could not be restored',
    );
    expect(mapVmmState('Not started')).toBe('stopped');
  });

  it('the real launcher starts a detached process with its output in the log, and killAndWait ends it', async () => {
    const logFile = join(dir, 'console.log');
    const { pid } = await spawnLauncher({
      cmd: '/bin/sh',
      args: ['-c', 'echo booted; exec sleep 30'],
      logFile,
      apiSocket: join(dir, 'api.sock'),
    });
    expect(pidAlive(pid)).toBe(true);
    expect(await processRssBytes(pid, 'i-1')).toBeGreaterThan(0);
    await new Promise((r) => setTimeout(r, 100));
    expect(readFileSync(logFile, 'utf8')).toContain('booted');
    await killAndWait(pid);
    await new Promise((r) => setTimeout(r, 50));
    expect(pidAlive(pid)).toBe(false);
    await expect(processRssBytes(pid, 'i-1')).rejects.toMatchObject({ code: 'DRIVER_FAILED' });
  });
});
