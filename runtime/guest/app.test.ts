import { mkdtempSync, rmSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createGuestApp, type GuestApp } from './app.ts';
import { call, type Guest, readOutput, run } from './test-harness.ts';

// In-process: the app is built without listening, and a short record TTL is observable.
let app: GuestApp;
let g: Guest;
beforeAll(async () => {
  const home = mkdtempSync(join(tmpdir(), 'space-guest-app-'));
  const uid = process.getuid!();
  const gid = process.getgid!();
  const self = { name: 'user', uid, gid, home, shell: '/bin/sh' };
  app = createGuestApp({
    token: null,
    user: self,
    root: { ...self, name: 'root', home: '/root' },
    home,
    privileged: false,
    recordTtlMs: 200,
    log: () => {},
  });
  expect(app.server.listening).toBe(false);
  await new Promise<void>((resolve) => app.server.listen(0, '127.0.0.1', resolve));
  const port = (app.server.address() as AddressInfo).port;
  g = { base: `http://127.0.0.1:${port}`, port, home } as Guest;
});
afterAll(async () => {
  await app?.close();
  if (g) rmSync(g.home, { recursive: true, force: true });
});

describe('guest app in-process', () => {
  it('forgets a process record a while after its exit frame was delivered', async () => {
    const p = await run(g, { cmd: 'echo', args: ['hi'] });
    const out = await readOutput(g, p.pid);
    expect(out.stdout.toString()).toBe('hi\n');
    expect((await call(g, 'GET', `/processes/${p.pid}`)).status).toBe(200);
    await new Promise((r) => setTimeout(r, 500));
    expect((await call(g, 'GET', `/processes/${p.pid}`)).status).toBe(404);
  });

  it('keeps an exited record whose output was never read', async () => {
    const p = await run(g, { cmd: 'true' });
    await new Promise((r) => setTimeout(r, 400));
    const info = (await call(g, 'GET', `/processes/${p.pid}`)).json() as { running: boolean };
    expect(info.running).toBe(false);
    const out = await readOutput(g, p.pid);
    expect(out.exit).toEqual({ exitCode: 0, signal: null, timedOut: false });
  });
});
