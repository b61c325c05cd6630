/**
 * The published `e2b` SDK (2.51.0), unchanged, against a real local stack (API, agent, gVisor
 * sandboxes, Redis, a router process) for issue 45's lifecycle and client-behaviour cases: E2B's
 * `lifecycle` options, list paging, routes SPACE does not serve, memory-less pauses, what `base`
 * carries, and the error a command sees when its sandbox is killed under it.
 */

import {
  AuthenticationError,
  type CommandExitError,
  Sandbox,
  SandboxError,
  SandboxNotFoundError,
  TimeoutError,
} from 'e2b';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { type E2bStack, startE2bStack } from './e2b-stack.ts';
import { leftovers, NO_LEFTOVERS, type Stack } from './stack.ts';

let s: Stack;
let e2b: E2bStack;

beforeAll(async () => {
  // a short reaper interval: lifetimes of a few seconds end on time
  e2b = await startE2bStack({ SPACE_REAPER_INTERVAL_MS: '200' });
  s = e2b.s;
});
afterAll(async () => {
  await e2b?.stopRouter();
  if (!s) return;
  await s.stop();
  expect(await leftovers(s)).toEqual(NO_LEFTOVERS);
});

/** Waits (bounded) until the sandbox's state is `state`. */
const untilState = (sbx: Sandbox, state: string) =>
  vi.waitFor(async () => expect((await sbx.getInfo()).state).toBe(state), { timeout: 30_000, interval: 250 });

describe('e2b SDK: lifecycle', () => {
  it("onTimeout 'pause' pauses at the deadline (files and processes kept), connect resumes; autoResume false keeps traffic from resuming it", async () => {
    const sbx = await Sandbox.create({
      timeoutMs: 4_000,
      lifecycle: { onTimeout: 'pause' },
      metadata: { suite: 'life' },
    });
    try {
      expect((await sbx.getInfo()).lifecycle).toEqual({ onTimeout: 'pause', autoResume: true });
      await sbx.files.write('/home/user/kept.txt', 'kept');
      const bg = await sbx.commands.run('sleep 600', { background: true });
      await untilState(sbx, 'paused');
      // traffic resumes it (autoResume unset: SPACE's default), memory and files intact
      expect((await sbx.commands.run('cat /home/user/kept.txt')).stdout).toBe('kept');
      expect((await sbx.getInfo()).state).toBe('running');
      expect((await sbx.commands.list()).map((p) => p.pid)).toContain(bg.pid);
      // the resume gave it a whole new lifetime: the deadline pauses it again
      await untilState(sbx, 'paused');
      const again = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 60_000 });
      expect((await again.getInfo()).state).toBe('running');
      expect(await again.files.read('/home/user/kept.txt')).toBe('kept');
    } finally {
      await Sandbox.kill(sbx.sandboxId);
    }

    const off = await Sandbox.create({
      timeoutMs: 4_000,
      lifecycle: { onTimeout: 'pause', autoResume: false },
    });
    try {
      expect((await off.getInfo()).lifecycle).toEqual({ onTimeout: 'pause', autoResume: false });
      await untilState(off, 'paused');
      // traffic does not resume it: the call fails and it stays paused
      await expect(off.commands.run('true')).rejects.toThrow();
      expect((await off.getInfo()).state).toBe('paused');
      await Sandbox.connect(off.sandboxId, { timeoutMs: 60_000 });
      expect((await off.commands.run('echo back')).stdout).toBe('back\n');
    } finally {
      await Sandbox.kill(off.sandboxId);
    }
  });

  it("onTimeout 'kill' stays the default: the deadline ends the sandbox", async () => {
    const sbx = await Sandbox.create({ timeoutMs: 3_000 });
    expect((await sbx.getInfo()).lifecycle).toEqual({ onTimeout: 'kill', autoResume: true });
    await vi.waitFor(
      async () =>
        expect(await Sandbox.getInfo(sbx.sandboxId).catch((e: unknown) => e)).toBeInstanceOf(
          SandboxNotFoundError,
        ),
      {
        timeout: 30_000,
        interval: 500,
      },
    );
  });

  it('refuses what SPACE does not do (keepMemory: false) instead of doing a memory pause', async () => {
    await expect(
      Sandbox.create({ lifecycle: { onTimeout: { action: 'pause', keepMemory: false } } }),
    ).rejects.toThrow(/not served by this SPACE server/);
    const sbx = await Sandbox.create();
    try {
      const refused = await sbx.pause({ keepMemory: false }).catch((e: unknown) => e);
      expect(refused).toBeInstanceOf(SandboxError);
      expect((refused as Error).message).toMatch(/^501: .*keepMemory: false/);
      expect((await sbx.getInfo()).state).toBe('running');
      expect(await sbx.pause()).toBe(true);
      await expect(Sandbox.connect(sbx.sandboxId, { onResume: 'reboot' })).rejects.toThrow(/501/);
      expect((await sbx.getInfo()).state).toBe('paused');
    } finally {
      await Sandbox.kill(sbx.sandboxId);
    }
  });
});

describe('e2b SDK: list paging and order', () => {
  it('a full last page ends the listing (no extra empty page); order asc lists oldest first', async () => {
    const made: Sandbox[] = [];
    try {
      for (let i = 0; i < 2; i++) made.push(await Sandbox.create({ metadata: { suite: 'paging' } }));
      const query = { metadata: { suite: 'paging' } };
      const pages: string[][] = [];
      const pager = Sandbox.list({ query, limit: 1 });
      for (let guard = 0; guard < 5 && pager.hasNext; guard++) {
        pages.push((await pager.nextItems()).map((x) => x.sandboxId));
      }
      expect(pages).toEqual([[made[1]!.sandboxId], [made[0]!.sandboxId]]);
      const whole = Sandbox.list({ query, limit: 2 });
      expect((await whole.nextItems()).length).toBe(2);
      expect(whole.hasNext).toBe(false);
      const asc = await Sandbox.list({ query, order: 'asc' }).nextItems();
      expect(asc.map((x) => x.sandboxId)).toEqual(made.map((x) => x.sandboxId));
    } finally {
      for (const m of made) await Sandbox.kill(m.sandboxId);
    }
  });
});

describe('e2b SDK: routes SPACE does not serve', () => {
  it('answer "not served" (501), not "check your credentials"', async () => {
    const sbx = await Sandbox.create();
    try {
      for (const call of [
        () => sbx.createSnapshot(),
        () => Sandbox.listSnapshots().nextItems(),
        () => sbx.getMetrics(),
      ]) {
        const err = await call().catch((e: unknown) => e);
        expect(err).not.toBeInstanceOf(AuthenticationError);
        expect((err as Error).message).toMatch(/not served by this SPACE server/);
      }
      // even with a key SPACE does not know
      const wrong = await Sandbox.listSnapshots({ apiKey: 'e2b_0000' })
        .nextItems()
        .catch((e: unknown) => e);
      expect((wrong as Error).message).toMatch(/not served/);
    } finally {
      await sbx.kill();
    }
  });
});

describe('e2b SDK: base template', () => {
  it('has passwordless sudo for user, python beside python3, and a current Node LTS with npm', async () => {
    const sbx = await Sandbox.create();
    try {
      const r = await sbx.commands
        .run(
          'whoami && sudo -n whoami && python --version && node --version && npm --version && npx --version',
        )
        .catch((e: CommandExitError) => e);
      expect([r.exitCode, r.stderr]).toEqual([0, '']);
      const [me, root, python, node, npm, npx] = r.stdout.trim().split('\n');
      expect([me, root]).toEqual(['user', 'root']);
      expect(python).toMatch(/^Python 3\./);
      expect(Number(/^v(\d+)\./.exec(node ?? '')?.[1])).toBeGreaterThanOrEqual(22);
      expect(npm).toMatch(/^\d+\./);
      expect(npx).toBe(npm);
      // npm installs and runs a package's code with that node (from the npm registry: no network
      // here, so a local package)
      const p = await sbx.commands.run(
        'mkdir -p /tmp/p && cd /tmp/p && echo \'{"name":"p","version":"1.0.0","bin":{"p":"p.js"}}\' > package.json && printf "#!/usr/bin/env node\\nconsole.log(process.version)\\n" > p.js && npm exec --yes -- p',
      );
      expect(p.stdout.trim()).toBe(node);
      // sudo as agents use it: a root-only write, stdin through, -u, the command's exit code
      const w = await sbx.commands
        .run(
          "echo ok | sudo tee /etc/space-sudo-check >/dev/null && cat /etc/space-sudo-check && sudo -u user id -un && sudo sh -c 'id -u; exit 3'",
        )
        .catch((e: CommandExitError) => e);
      expect([w.exitCode, w.stdout]).toEqual([3, 'ok\nuser\n0\n']);
    } finally {
      await sbx.kill();
    }
  });
});

describe('e2b SDK: a sandbox killed under a running command', () => {
  it('surfaces the error class E2B gives (TimeoutError: the sandbox ended while the request was in flight)', async () => {
    for (const background of [false, true]) {
      const sbx = await Sandbox.create();
      const handle = await sbx.commands.run('sleep 600', { background: true });
      const waited = (
        background ? handle.wait() : sbx.commands.connect(handle.pid).then((h) => h.wait())
      ).catch((e: unknown) => e);
      await new Promise((r) => setTimeout(r, 500));
      expect(await Sandbox.kill(sbx.sandboxId)).toBe(true);
      const err = await waited;
      expect(err, String(err)).toBeInstanceOf(TimeoutError);
    }
  });
});
