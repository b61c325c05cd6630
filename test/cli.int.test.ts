/**
 * The "done when", through the real CLI as processes: `space up` runs the stack in the
 * foreground; `space sandbox create --template base --json`; `space exec <id> -- sh -c 'echo
 * hello; exit 3'` prints hello and exits 3; Ctrl-C (SIGINT) stops everything and leaves no
 * sandbox, namespace, cgroup or process behind.
 */
import { execFile } from 'node:child_process';
import { once } from 'node:events';
import { mkdtemp, readdir, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { SPACE, type SpaceUp, startSpaceUp } from './space-up.ts';

const run = promisify(execFile);

describe('space CLI against `space up`', () => {
  let home: string;
  let up: SpaceUp;
  let env: NodeJS.ProcessEnv;
  let routerPort = 0;
  const pool = `10.${100 + Math.floor(Math.random() * 100)}.0.0/16`;

  beforeAll(async () => {
    home = await mkdtemp(join(tmpdir(), 'space-cli-'));
    env = { ...process.env, SPACE_HOME: home, SPACE_NETWORK_POOL: pool, SPACE_WARM_POOL_SIZE: '1' };
    up = await startSpaceUp(env, inject('redisUrl'));
    routerPort = up.routerPort;
  });

  afterAll(async () => {
    await up?.stop(); // never SIGKILL: the stack must get to destroy its sandboxes
    await rm(home, { recursive: true, force: true });
  });

  it('creates, execs with the exit code, and stops cleanly on SIGINT', async () => {
    const created = await run(
      process.execPath,
      [SPACE, 'sandbox', 'create', '--template', 'base', '--json'],
      { env },
    );
    const sandbox = JSON.parse(created.stdout) as { id: string; state: string };
    expect(sandbox.state).toBe('running');

    const exec = await run(
      process.execPath,
      [SPACE, 'exec', sandbox.id, '--', 'sh', '-c', 'echo hello; exit 3'],
      {
        env,
      },
    ).catch((err: { code: number; stdout: string }) => err);
    expect(exec).toMatchObject({ code: 3, stdout: 'hello\n' });

    // the command's output came through the router `space up` started (the API hands out its URL)
    const local = JSON.parse(await readFile(join(home, 'local.json'), 'utf8')) as { routerUrl?: string };
    expect(local.routerUrl).toBe(`http://127.0.0.1:${routerPort}`);
    const metrics = await (await fetch(`${local.routerUrl}/metrics`)).text();
    expect(metrics).toMatch(/space_router_requests_total\{route="command\.events",status="200"\} [1-9]/);

    // r16-cli-exit-codes: the CLI's own failures exit 125, never a code the command could return
    const fail = (args: string[], extra: NodeJS.ProcessEnv = {}) =>
      run(process.execPath, [SPACE, ...args], { env: { ...env, ...extra } }).then(
        () => ({ code: 0, stderr: '' }),
        (e: { code: number; stderr: string }) => e,
      );
    const unknown = await fail(['exec', 'sbx_doesnotexist0000000000', '--', 'true']);
    expect([unknown.code, unknown.stderr]).toEqual([125, expect.stringMatching(/SANDBOX_NOT_FOUND/)]);
    const badKey = await fail(['exec', sandbox.id, '--', 'true'], { SPACE_API_KEY: 'space_wrong' });
    expect([badKey.code, badKey.stderr]).toEqual([125, expect.stringMatching(/UNAUTHENTICATED/)]);
    const down = await fail(['--api-url', 'http://127.0.0.1:9', 'exec', sandbox.id, '--', 'true']);
    expect(down.code).toBe(125);
    const badFlag = await fail(['exec', '--no-such-flag', sandbox.id, '--', 'true']);
    expect(badFlag.code).toBe(125);

    // r17-json-keeps-bytes: --json carries bytes that are not UTF-8 exactly
    const raw = await run(
      process.execPath,
      [SPACE, '--json', 'exec', sandbox.id, '--', 'printf', '\\377\\376A'],
      {
        env,
      },
    );
    const j = JSON.parse(raw.stdout) as { stdout: string; stdoutEncoding: string; exitCode: number };
    expect(j.stdoutEncoding).toBe('base64');
    expect([...Buffer.from(j.stdout, 'base64')]).toEqual([0xff, 0xfe, 0x41]);

    // a reader that goes away (`| head -1`) is a broken pipe for the command in the sandbox too
    const piped = await run(
      'sh',
      ['-c', `"${process.execPath}" "${SPACE}" exec ${sandbox.id} -- yes | head -1`],
      {
        env,
      },
    );
    expect(piped.stdout).toBe('y\n');
    let left = '';
    for (let i = 0; i < 50; i++) {
      left = (
        await run(process.execPath, [SPACE, 'exec', sandbox.id, '--', 'sh', '-c', 'pgrep -x yes || true'], {
          env,
        })
      ).stdout;
      if (left === '') break;
      await new Promise((r) => setTimeout(r, 200));
    }
    expect(left).toBe('');

    // a sandbox that ends under a running command: the CLI says so instead of a bare 137
    const doomed = JSON.parse(
      (await run(process.execPath, [SPACE, 'sandbox', 'create', '--template', 'base', '--json'], { env }))
        .stdout,
    ) as { id: string };
    const long = run(process.execPath, [SPACE, 'exec', doomed.id, '--', 'sleep', '60'], { env }).then(
      () => ({ code: 0, stderr: '' }),
      (e: { code: number; stderr: string }) => e,
    );
    await new Promise((r) => setTimeout(r, 1500));
    await run(process.execPath, [SPACE, 'sandbox', 'rm', doomed.id], { env });
    const ended = await long;
    expect(ended.code).toBe(137);
    expect(ended.stderr).toMatch(/the sandbox ended/);

    const listed = JSON.parse(
      (await run(process.execPath, [SPACE, 'sandbox', 'ls', '--json'], { env })).stdout,
    ) as {
      sandboxes: { id: string }[];
    };
    expect(listed.sandboxes.map((x) => x.id)).toContain(sandbox.id);

    up.proc.kill('SIGINT');
    const [code] = (await once(up.proc, 'exit')) as [number];
    expect(code).toBe(0);
    const prefix = `${pool.split('.').slice(0, 2).join('.')}.`;
    const addrs = JSON.parse((await run('ip', ['-j', '-4', 'addr', 'show'])).stdout) as {
      addr_info?: { local?: string }[];
    }[];
    expect(addrs.filter((l) => l.addr_info?.some((a) => a.local?.startsWith(prefix)))).toEqual([]);
    const runsc = await run('pgrep', ['-f', `runsc.*${home}`]).catch(() => ({ stdout: '' }));
    expect(runsc.stdout).toBe('');
    const instances = await readdir(join(home, 'agent', 'driver', 'instances')).catch(() => [] as string[]);
    expect(instances).toEqual([]);
    const cgroups = await readdir('/sys/fs/cgroup/memory/space').catch(() => [] as string[]);
    expect(cgroups.filter((c) => c.startsWith('i_') && up.output().includes(c))).toEqual([]);
  });
});

describe('space doctor', () => {
  it('reports what this node supports and the driver the agent would pick, as JSON', async () => {
    const { stdout } = await run(process.execPath, [SPACE, 'doctor', '--json'], {
      env: { ...process.env, SPACE_DRIVER: 'auto' },
    });
    const report = JSON.parse(stdout) as {
      checks: { id: string; ok: boolean; detail: string; neededBy: string[] }[];
      driver: { name: string | null; reason: string };
      ready: boolean;
    };
    const ids = report.checks.map((c) => c.id);
    for (const id of [
      'kvm',
      'qemu',
      'firecracker',
      'cloud-hypervisor',
      'runsc',
      'nftables',
      'cgroups',
      'tun',
      'vsock',
    ]) {
      expect(ids).toContain(id);
    }
    // this CI machine: runsc and nftables are installed by scripts/host-deps.sh
    expect(report.checks.find((c) => c.id === 'runsc')?.ok).toBe(true);
    expect(report.checks.find((c) => c.id === 'nftables')?.ok).toBe(true);
    expect(['gvisor', 'qemu', 'firecracker', 'cloud-hypervisor']).toContain(report.driver.name);
    expect(report.ready).toBe(true);
  }, 120_000);

  it('refuses a VMM driver that needs KVM where KVM is off, and says why (exit 1)', async () => {
    const err = (await run(process.execPath, [SPACE, 'doctor'], {
      env: { ...process.env, SPACE_DRIVER: 'firecracker', SPACE_KVM: 'off' },
    }).catch((e: unknown) => e)) as { code: number; stdout: string };
    expect(err.code).toBe(1);
    expect(err.stdout).toMatch(/driver: none \(SPACE_DRIVER=firecracker needs usable KVM/);
    expect(err.stdout).toMatch(/not ready/);
  }, 60_000);
});
