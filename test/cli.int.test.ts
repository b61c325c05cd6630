/**
 * The "done when", through the real CLI as processes: `space up` runs the stack in the
 * foreground; `space sandbox create --template base --json`; `space exec <id> -- sh -c 'echo
 * hello; exit 3'` prints hello and exits 3; Ctrl-C (SIGINT) stops everything and leaves no
 * sandbox, namespace, cgroup or process behind.
 */
import { type ChildProcess, execFile } from 'node:child_process';
import { once } from 'node:events';
import { mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { parseStat } from '../runtime/core/proc-stat.ts';
import { keys } from '../runtime/core/redis-keys.ts';
import { DEFAULT_TEAM } from '../runtime/core/tenancy.ts';
import { SPACE, startSpaceUp } from './space-up.ts';

const run = promisify(execFile);

describe('space CLI against `space up`', () => {
  let home: string;
  let up: ChildProcess;
  let output: () => string = () => '';
  let env: NodeJS.ProcessEnv;
  let routerPort = 0;
  const pool = `10.${100 + Math.floor(Math.random() * 100)}.0.0/16`;

  beforeAll(async () => {
    home = await mkdtemp(join(tmpdir(), 'space-cli-'));
    env = { ...process.env, SPACE_HOME: home, SPACE_NETWORK_POOL: pool, SPACE_WARM_POOL_SIZE: '1' };
    const started = await startSpaceUp(env, inject('redisUrl'));
    up = started.proc;
    routerPort = started.routerPort;
    output = started.output;
  });

  afterAll(async () => {
    if (up && up.exitCode === null) {
      up.kill('SIGINT'); // never SIGKILL: the stack must get to destroy its sandboxes
      await once(up, 'exit');
    }
    await rm(home, { recursive: true, force: true });
  });

  it("issue 13's done-when: `space keys create --team other` gives a key that cannot see, touch or bill against the first team's sandboxes, nor touch credentials", async () => {
    const cli = (args: string[], key?: string) =>
      run(process.execPath, [SPACE, ...args], { env: key ? { ...env, SPACE_API_KEY: key } : env }).then(
        (r) => ({ code: 0, stdout: r.stdout, stderr: r.stderr }),
        (e: { code: number; stdout: string; stderr: string }) => e,
      );
    // the first team (the bootstrap key's): a sandbox, a command run in it, a credential
    const mine = JSON.parse((await cli(['sandbox', 'create', '--template', 'base', '--json'])).stdout) as {
      id: string;
    };
    expect((await cli(['exec', mine.id, '--', 'true'])).code).toBe(0);
    const local = JSON.parse(await readFile(join(home, 'local.json'), 'utf8')) as { apiUrl: string };
    const bootstrap = (await readFile(join(home, 'api-key'), 'utf8')).trim();
    const api = async (key: string, method: string, path: string, body?: unknown) => {
      const res = await fetch(new URL(path, local.apiUrl), {
        method,
        headers: {
          authorization: `Bearer ${key}`,
          ...(body === undefined ? {} : { 'content-type': 'application/json' }),
        },
        body: body === undefined ? undefined : JSON.stringify(body),
      });
      const text = await res.text();
      return {
        status: res.status,
        body: (text ? JSON.parse(text) : {}) as { error?: { code: string }; domains?: string[] },
      };
    };
    expect(
      (
        await api(bootstrap, 'PUT', '/v1/credentials/openai', {
          domains: ['api.openai.com'],
          value: 'sk-first-team',
        })
      ).status,
    ).toBe(200);

    // the other team and its key, through the CLI
    expect((await cli(['teams', 'create', 'other'])).code).toBe(0);
    const made = await cli(['keys', 'create', '--name', 'agent', '--team', 'other']);
    expect(made.code, made.stderr).toBe(0);
    const other = made.stdout.trim();
    expect(other).toMatch(/^\S+$/);
    expect(made.stderr).toMatch(/of team other/);

    // see: not in its list, not found by id, not in its usage
    const listed = JSON.parse((await cli(['sandbox', 'ls', '--json'], other)).stdout) as {
      sandboxes: { id: string }[];
    };
    expect(listed.sandboxes.map((x) => x.id)).not.toContain(mine.id);
    const notFound = expect.stringMatching(/SANDBOX_NOT_FOUND/);
    // touch: read, exec, lifetime, pause, delete, files, its usage — each as for a sandbox that does not exist
    for (const args of [
      ['sandbox', 'get', mine.id],
      ['exec', mine.id, '--', 'true'],
      ['sandbox', 'timeout', mine.id, '600'],
      ['sandbox', 'pause', mine.id],
      ['sandbox', 'rm', mine.id],
      ['files', 'ls', mine.id, '/tmp'],
      ['sandbox', 'usage', mine.id],
    ]) {
      const r = await cli(args, other);
      expect([args.join(' '), r.code, r.stderr]).toEqual([args.join(' '), 125, notFound]);
    }
    // bill: nothing of the first team's in the other team's usage; the first team's still has it
    const usageOther = await cli(['--json', 'usage', '--group-by', 'sandbox', '--since', '1h'], other);
    expect(usageOther.code, usageOther.stderr).toBe(0);
    expect(usageOther.stdout).not.toContain(mine.id);
    const usageMine = await cli(['--json', 'usage', '--group-by', 'sandbox', '--since', '1h']);
    expect(usageMine.stdout).toContain(mine.id);

    // credentials: cannot register, replace, delete, read or grant the first team's
    expect(
      (await api(other, 'PUT', '/v1/credentials/openai', { domains: ['api.openai.com'], value: 'sk-theirs' }))
        .body.error?.code,
    ).toBe('SCOPE_DENIED');
    expect((await api(other, 'DELETE', '/v1/credentials/openai')).body.error?.code).toBe('SCOPE_DENIED');
    expect((await api(other, 'GET', '/v1/credentials/openai')).body.error?.code).toBe('CREDENTIAL_NOT_FOUND');
    expect(JSON.stringify((await api(other, 'GET', '/v1/credentials')).body)).not.toContain('openai');
    const grant = await api(other, 'POST', '/v1/sandboxes', { template: 'base', credentials: ['openai'] });
    expect(grant.body.error?.code).toBe('CREDENTIAL_NOT_FOUND');

    // even the other team's credentials admin registers its own `openai`, never the first team's
    const admin = (
      await cli([
        'keys',
        'create',
        '--name',
        'creds',
        '--team',
        'other',
        '--scope',
        'credentials:admin,credentials:read',
      ])
    ).stdout.trim();
    expect(
      (await api(admin, 'PUT', '/v1/credentials/openai', { domains: ['api.openai.com'], value: 'sk-theirs' }))
        .status,
    ).toBe(200);
    expect((await api(admin, 'DELETE', '/v1/credentials/openai')).status).toBe(204);
    const redis = new Redis(inject('redisUrl'));
    try {
      expect(await redis.hget(keys.credential(DEFAULT_TEAM, 'openai'), 'value')).toBe('sk-first-team');
    } finally {
      redis.disconnect();
    }

    // and the first team's sandbox and credential are as they were
    const still = JSON.parse((await cli(['--json', 'sandbox', 'get', mine.id])).stdout) as { state: string };
    expect(still.state).toBe('running');
    const cred = await api(bootstrap, 'GET', '/v1/credentials/openai');
    expect([cred.status, cred.body.domains]).toEqual([200, ['api.openai.com']]);
    expect((await cli(['sandbox', 'rm', mine.id])).code).toBe(0);
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

    // the gateway reads credential values from the stack's Redis (host-side injection): it was once
    // started without SPACE_REDIS_URL and looked for Redis at its default port instead
    const gatewayLog = await readFile(join(home, 'logs', 'gateway.log'), 'utf8');
    expect(gatewayLog).not.toMatch(/credential store unreachable/);

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

    // every command once, against the same stack (--json where it has machine output)
    const space = async (args: string[], input?: string) => {
      const child = run(process.execPath, [SPACE, ...args], { env });
      if (input !== undefined) {
        child.child.stdin?.end(input);
      }
      return (await child).stdout;
    };
    const sj = async <T>(args: string[]) => JSON.parse(await space(['--json', ...args])) as T;
    // files: mkdir, put (from a file and from stdin), stat, ls, get (to a file and to stdout), rm
    await space(['files', 'mkdir', sandbox.id, '/home/user/d/e', '-p']);
    const localIn = join(home, 'in.bin');
    const payload = Buffer.from([0, 1, 2, 255, 10, 65]);
    await writeFile(localIn, payload);
    await space([
      'files',
      'put',
      sandbox.id,
      localIn,
      '/home/user/d/e/f.bin',
      '-m',
      'src=in.bin',
      '-m',
      'n=1',
    ]);
    await space(['files', 'put', sandbox.id, '-', '/home/user/d/stdin.txt'], 'from stdin\n');
    expect(
      await sj<{ size: number; type: string }>(['files', 'stat', sandbox.id, '/home/user/d/e/f.bin']),
    ).toMatchObject({
      size: payload.length,
      metadata: { src: 'in.bin', n: '1' },
    });
    expect(await space(['files', 'stat', sandbox.id, '/home/user/d/e/f.bin'])).toMatch(
      /metadata src=in\.bin/,
    );
    expect(JSON.stringify(await sj(['files', 'ls', sandbox.id, '/home/user/d']))).toMatch(/stdin\.txt/);
    const localOut = join(home, 'out.bin');
    await space(['files', 'get', sandbox.id, '/home/user/d/e/f.bin', localOut]);
    expect(await readFile(localOut)).toEqual(payload);
    expect(await space(['files', 'get', sandbox.id, '/home/user/d/stdin.txt', '-'])).toBe('from stdin\n');
    await space(['files', 'rm', sandbox.id, '/home/user/d', '-r']);
    const gone = await fail(['--json', 'files', 'stat', sandbox.id, '/home/user/d']);
    // --json errors: exit 125 and the JSON error body on stderr
    expect(gone.code).toBe(125);
    expect(JSON.parse(gone.stderr)).toMatchObject({ error: { code: 'FILE_NOT_FOUND' } });
    // sandbox get, timeout, pause, resume, usage
    expect(await sj<{ id: string; state: string }>(['sandbox', 'get', sandbox.id])).toMatchObject({
      id: sandbox.id,
      state: 'running',
    });
    const timed = await sj<{ expiresAt: string }>(['sandbox', 'timeout', sandbox.id, '900']);
    expect(Date.parse(timed.expiresAt) - Date.now()).toBeGreaterThan(800_000);
    expect(await sj<{ state: string }>(['sandbox', 'pause', sandbox.id])).toMatchObject({ state: 'paused' });
    expect(await sj<{ state: string }>(['sandbox', 'resume', sandbox.id])).toMatchObject({
      state: 'running',
    });
    expect(await space(['exec', sandbox.id, '--', 'echo', 'after-resume'])).toBe('after-resume\n');
    expect(await sj<Record<string, unknown>>(['sandbox', 'usage', sandbox.id])).toBeTypeOf('object');
    expect(await sj<Record<string, unknown>>(['usage', '--since', '1h'])).toBeTypeOf('object');
    // ops get (of a delete returned at once), nodes, template ls
    const extra = JSON.parse(
      (await run(process.execPath, [SPACE, 'sandbox', 'create', '--template', 'base', '--json'], { env }))
        .stdout,
    ) as { id: string };
    // the sandboxes' processes, which `runsc run --detach` leaves behind, are re-parented to the
    // agent's reaper (tini as a subreaper), not to the host's init, which may reap them late:
    // `runsc delete` waits for its sandbox process to be reaped
    const sandboxProcs = (await run('pgrep', ['-f', `runsc-sandbox.*${home}`])).stdout
      .split('\n')
      .filter(Boolean);
    const parents: string[][] = [];
    for (const pid of sandboxProcs) {
      const parent = await readFile(`/proc/${pid}/stat`, 'utf8')
        .then((stat) => readFile(`/proc/${parseStat(stat)!.ppid}/cmdline`, 'utf8'))
        .then((cmdline) => cmdline.split('\0'))
        .catch(() => undefined); // gone meanwhile
      // a warm slot still being started (the refill after `extra`) has its runsc as parent
      if (parent && !/(^|\/)(runsc|unshare)$/.test(parent[0]!)) parents.push(parent);
    }
    expect(parents.length).toBeGreaterThanOrEqual(2); // `sandbox` and `extra` at least
    for (const parent of parents) {
      // the agent's own tini (this test may itself run under one: `npm test`)
      expect(parent.slice(0, 3)).toEqual([expect.stringMatching(/\/tini-static$/), '-s', '--']);
      expect(parent).toContain(join(import.meta.dirname, '..', 'runtime', 'agent', 'server.ts'));
    }
    const del = await sj<{ id: string }>(['sandbox', 'rm', extra.id, '--no-wait']);
    expect(await sj<{ state: string }>(['ops', 'get', del.id, '--wait', '60'])).toMatchObject({
      state: 'succeeded',
    });
    // the test Redis is shared with earlier test files, whose (dead) nodes may still be listed
    const nodes = await sj<{ nodes: { id: string; alive: boolean }[] }>(['nodes']);
    expect(nodes.nodes.filter((n) => n.alive).map((n) => n.id)).toEqual(['local']);
    // (… and their templates: the code interpreter's test registers code-interpreter-v1)
    const { templates } = await sj<{ templates: { name: string; ready: boolean }[] }>(['template', 'ls']);
    expect(templates).toContainEqual({ name: 'base', ready: true });

    up.kill('SIGINT');
    const [code] = (await once(up, 'exit')) as [number];
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
    expect(cgroups.filter((c) => c.startsWith('i_') && output().includes(c))).toEqual([]);
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
