import { execFileSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { chmodSync, mkdtempSync, openSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { request as httpRequest } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it, onTestFinished, vi } from 'vitest';
import { FrameDecoder } from './output.ts';
import { AUTH, call, type Guest, q, readOutput, run, startGuest } from './test-harness.ts';

const sha = (b: Buffer) => createHash('sha256').update(b).digest('hex');
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function rssKiB(pid: number): number {
  const m = /VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return Number(m![1]);
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return !/^\d+ \(.*\) Z/.test(stat);
  } catch {
    return false;
  }
}

let g: Guest;
beforeAll(async () => {
  g = await startGuest();
});
afterAll(async () => {
  await g?.stop();
});

describe('guest health and init', () => {
  it('answers /health', async () => {
    const r = await call(g, 'GET', '/health');
    expect(r.status).toBe(200);
    const body = r.json() as { ok: boolean; version: string; uptimeMs: number };
    expect(body.ok).toBe(true);
    expect(typeof body.version).toBe('string');
    expect(body.uptimeMs).toBeGreaterThanOrEqual(0);
  });

  it('unknown routes and pids are coded 404s', async () => {
    const r = await call(g, 'GET', '/nope');
    expect(r.status).toBe(404);
    expect((r.json() as { error: { code: string } }).error.code).toBe('NOT_FOUND');
    const p = await call(g, 'GET', '/processes/99999999');
    expect(p.status).toBe(404);
    expect((p.json() as { error: { code: string } }).error.code).toBe('COMMAND_NOT_FOUND');
  });

  it('rejects bad start requests with 400 BAD_REQUEST', async () => {
    for (const body of [{}, { cmd: 1 }, { cmd: 'ls', args: [1] }, { cmd: 'ls', user: 'bob' }, 'nope']) {
      const r = await call(g, 'POST', '/processes', body);
      expect(r.status).toBe(400);
      expect((r.json() as { error: { code: string } }).error.code).toBe('BAD_REQUEST');
    }
    const bad = await call(g, 'POST', '/processes', '{not json');
    expect(bad.status).toBe(400);
  });

  it('init env sits under the process env; PATH, HOME and USER have defaults', async () => {
    expect((await call(g, 'POST', '/init', { env: { A: 'sandbox', B: 'sandbox' } })).status).toBe(204);
    const p = await run(g, { cmd: 'echo "$A $B $HOME $USER $PATH"; pwd', shell: true, env: { B: 'own' } });
    const out = await readOutput(g, p.pid);
    const [line1, line2] = out.stdout.toString().trim().split('\n');
    expect(line1).toBe(
      `sandbox own ${g.home} user /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin`,
    );
    expect(line2).toBe(g.home);
    expect(out.exit).toEqual({ exitCode: 0, signal: null, timedOut: false });
    await call(g, 'POST', '/init', { env: {} });
  });
});

describe('guest processes', () => {
  it('runs a command with args, cwd, and reports stdout, stderr and exit code', async () => {
    const p = await run(g, {
      cmd: 'sh',
      args: ['-c', 'echo out; echo err >&2; pwd; exit 3'],
      cwd: '/tmp',
      tag: 't1',
    });
    expect(p.tag).toBe('t1');
    expect(p.running).toBe(true);
    const out = await readOutput(g, p.pid);
    expect(out.stdout.toString()).toBe('out\n/tmp\n');
    expect(out.stderr.toString()).toBe('err\n');
    expect(out.exit).toEqual({ exitCode: 3, signal: null, timedOut: false });
    expect(out.frames.at(-1)!.type).toBe(3);
    const info = (await call(g, 'GET', `/processes/${p.pid}`)).json() as Record<string, unknown>;
    expect(info.running).toBe(false);
    expect(info.exit).toEqual({ exitCode: 3, signal: null, timedOut: false });
    const list = (await call(g, 'GET', '/processes')).json() as { processes: { pid: number }[] };
    expect(list.processes.some((x) => x.pid === p.pid)).toBe(true);
  });

  it('a missing binary is a process that exits 127 with an error, at once', async () => {
    const p = await run(g, { cmd: 'no-such-binary-xyz' });
    expect(p.running).toBe(false);
    const out = await readOutput(g, p.pid);
    expect(out.frames.map((f) => f.type)).toEqual([2, 3]);
    expect(out.stderr.toString()).toContain('no-such-binary-xyz');
    expect(out.exit).toMatchObject({ exitCode: 127, signal: null, timedOut: false });
    expect(typeof out.exit!.error).toBe('string');
  });

  it('running a directory exits 126 with an error; a missing cwd fails too', async () => {
    const p = await run(g, { cmd: '/tmp' });
    const out = await readOutput(g, p.pid);
    expect(out.exit).toMatchObject({ exitCode: 126, signal: null });
    expect(typeof out.exit!.error).toBe('string');
    const c = await run(g, { cmd: 'ls', cwd: '/no/such/dir' });
    const cout = await readOutput(g, c.pid);
    expect(cout.exit!.exitCode).toBe(127);
    expect(cout.stderr.toString()).toContain('/no/such/dir');
  });

  it("sh -c 'no-such-binary' exits 127 from the shell", async () => {
    const p = await run(g, { cmd: 'no-such-binary-xyz', shell: true });
    const out = await readOutput(g, p.pid);
    expect(out.exit).toEqual({ exitCode: 127, signal: null, timedOut: false });
  });

  it('signals reach the group; a signal death has exitCode null and the signal name', async () => {
    const p = await run(g, { cmd: 'sleep 30 & echo $!; wait', shell: true });
    const outP = readOutput(g, p.pid);
    await sleep(200);
    const bad = await call(g, 'POST', `/processes/${p.pid}/signal`, { signal: 'SIGNOPE' });
    expect(bad.status).toBe(400);
    expect((bad.json() as { error: { code: string } }).error.code).toBe('BAD_REQUEST');
    expect((await call(g, 'POST', `/processes/${p.pid}/signal`, { signal: 'SIGTERM' })).status).toBe(204);
    const out = await outP;
    const child = Number(out.stdout.toString().trim());
    expect(out.exit).toEqual({ exitCode: null, signal: 'SIGTERM', timedOut: false });
    await sleep(50);
    expect(alive(child)).toBe(false);
    const after = await call(g, 'POST', `/processes/${p.pid}/signal`, { signal: 'SIGTERM' });
    expect(after.status).toBe(409);
    expect((after.json() as { error: { code: string } }).error.code).toBe('PROCESS_EXITED');
  });

  it('timeoutMs kills the group and reports timedOut', async () => {
    const t0 = Date.now();
    const p = await run(g, { cmd: 'sleep', args: ['30'], timeoutMs: 300 });
    const out = await readOutput(g, p.pid);
    expect(out.exit).toEqual({ exitCode: null, signal: 'SIGKILL', timedOut: true });
    expect(Date.now() - t0).toBeLessThan(3000);
  });

  it('r11-kill-means-everything-the-command-started: a timeout and a SIGKILL end setsid, setpgid and double-forked processes too', async () => {
    // fractional sleeps make the processes of this run unique on a shared host
    const tag = `${Date.now() % 1000}${Math.floor(Math.random() * 1000)}`;
    const cmd = [
      `sleep 1011.${tag} &`,
      `setsid sleep 1012.${tag} &`,
      `python3 -c "import os,time; os.setpgid(0,0); time.sleep(1013.${tag})" &`,
      `(nohup sleep 1014.${tag} >/dev/null 2>&1 &) &`, // double fork: reparented to PID 1
      `setsid sh -c 'sleep 1015.${tag} & wait' &`,
      'wait',
    ].join(' ');
    const ours = () =>
      readdirSync('/proc')
        .filter((n) => /^\d+$/.test(n))
        .filter((n) => {
          try {
            const argv = readFileSync(`/proc/${n}/cmdline`, 'utf8').split('\0');
            // the sleeps and python, not the shells whose scripts name them
            return !argv[0]!.endsWith('sh') && argv.join(' ').includes(`.${tag}`) && alive(Number(n));
          } catch {
            return false;
          }
        });
    onTestFinished(() => {
      for (const pid of ours()) process.kill(Number(pid), 'SIGKILL'); // what a failed run leaves
    });
    for (const how of ['timeout', 'SIGKILL'] as const) {
      // the timeout must not fire before all five have started (python3 alone can take seconds to
      // start on a loaded CI machine: 1.5 s made this flaky)
      const p = await run(g, { cmd, shell: true, ...(how === 'timeout' ? { timeoutMs: 8000 } : {}) });
      const outP = readOutput(g, p.pid);
      for (let i = 0; i < 150 && ours().length < 5; i++) await sleep(50);
      expect(ours().length).toBe(5);
      if (how === 'SIGKILL') {
        expect((await call(g, 'POST', `/processes/${p.pid}/signal`, { signal: 'SIGKILL' })).status).toBe(204);
      }
      const out = await outP;
      expect(out.exit).toEqual({ exitCode: null, signal: 'SIGKILL', timedOut: how === 'timeout' });
      // (the kill itself is immediate; a loaded host can take a while to reap and show it)
      for (let i = 0; i < 100 && ours().length > 0; i++) await sleep(50);
      expect(ours()).toEqual([]);
    }
  }, 60_000);

  it('r12-background-survives: a leader exiting while a child holds the pipes ends the stream; the child keeps running', async () => {
    const t0 = Date.now();
    // the background child keeps writing to the inherited pipe after the command is over
    const p = await run(g, {
      cmd: '(sleep 0.5; while :; do echo tick; sleep 0.05; done) & echo $!; echo hi',
      shell: true,
    });
    const out = await readOutput(g, p.pid);
    // (on a loaded machine a tick may still reach the stream before it ends: not what is checked)
    const [bg, hi] = out.stdout
      .toString()
      .trim()
      .split('\n')
      .filter((l) => l !== 'tick');
    expect(hi).toBe('hi');
    expect(out.exit).toEqual({ exitCode: 0, signal: null, timedOut: false });
    expect(Date.now() - t0).toBeLessThan(2000);
    try {
      await sleep(1200); // it has been writing into the drained pipe for a while by now
      // alive, not blocked on a full pipe nor killed by a broken one
      expect(alive(Number(bg))).toBe(true);
      const state = readFileSync(`/proc/${bg}/stat`, 'utf8').split(') ')[1]![0];
      expect(['S', 'R']).toContain(state);
    } finally {
      process.kill(-Number(p.pid), 'SIGKILL');
    }
  });

  it('4 MiB of binary to stdout then stderr arrives intact', async () => {
    const data = randomBytes(4_194_304);
    const file = join(g.home, 'blob.bin');
    writeFileSync(file, data);
    const p = await run(g, { cmd: `cat ${file}; cat ${file} >&2`, shell: true });
    const out = await readOutput(g, p.pid);
    expect(out.stdout.length).toBe(data.length);
    expect(sha(out.stdout)).toBe(sha(data));
    expect(sha(out.stderr)).toBe(sha(data));
    expect(out.exit!.exitCode).toBe(0);
  }, 30_000);
});

describe('guest output backpressure and replay', () => {
  it('a process printing 1,000,000 lines with no reader blocks; memory stays bounded', async () => {
    const daemonPid = g.child.pid!;
    const before = rssKiB(daemonPid);
    const p = await run(g, { cmd: 'seq', args: ['1', '1000000'] });
    const y = await run(g, { cmd: 'yes' });
    await sleep(1500);
    const info = (await call(g, 'GET', `/processes/${p.pid}`)).json() as { running: boolean };
    expect(info.running).toBe(true);
    const grown = rssKiB(daemonPid) - before;
    expect(grown).toBeLessThan(40 * 1024);
    await sleep(1000);
    expect(rssKiB(daemonPid) - before).toBeLessThan(40 * 1024);
    const out = await readOutput(g, p.pid);
    const lines = out.stdout.toString().split('\n');
    expect(lines.length).toBe(1_000_001);
    expect(lines[999_999]).toBe('1000000');
    expect(out.exit!.exitCode).toBe(0);
    await call(g, 'POST', `/processes/${y.pid}/signal`, { signal: 'SIGKILL' });
    const yout = await readOutput(g, y.pid);
    expect(yout.exit).toMatchObject({ signal: 'SIGKILL' });
  }, 60_000);

  it('a reconnect at offset N continues exactly at byte N (mid-frame too)', async () => {
    // 100,000 lines ≈ 0.6 MB: the whole stream fits the replay window whatever the socket buffers held.
    const p = await run(g, { cmd: 'seq', args: ['1', '100000'] });
    const expected = Array.from({ length: 100_000 }, (_, i) => `${i + 1}\n`).join('');
    const first = await readOutput(g, p.pid, 0, 100_003);
    expect(first.bytes).toBe(100_003);
    const second = await readOutput(g, p.pid, 100_003, 200_000);
    const rest = await readOutput(g, p.pid, 300_003);
    const frames = new FrameDecoder().push(Buffer.concat([first.raw, second.raw, rest.raw]));
    const stdout = Buffer.concat(frames.filter((f) => f.type === 1).map((f) => f.payload)).toString();
    expect(stdout).toBe(expected);
    expect(frames.at(-1)!.type).toBe(3);
    expect(frames.filter((f) => f.type === 3)).toHaveLength(1);
    expect(JSON.parse(frames.at(-1)!.payload.toString())).toEqual({
      exitCode: 0,
      signal: null,
      timedOut: false,
    });
    // After delivery the record stays and replays from any offset in the window.
    const again = await readOutput(g, p.pid, 0);
    expect(again.stdout.toString()).toBe(expected);
  }, 30_000);

  it('an offset outside the replay window gets 409; a bad offset 400', async () => {
    const p = await run(g, { cmd: 'seq', args: ['1', '1000000'] });
    const all = await readOutput(g, p.pid);
    expect(all.exit!.exitCode).toBe(0);
    const stale = await call(g, 'GET', `/processes/${p.pid}/output?offset=0`);
    expect(stale.status).toBe(409);
    expect((stale.json() as { error: { message: string } }).error.message).toMatch(
      /outside the replay window/,
    );
    const ahead = await call(g, 'GET', `/processes/${p.pid}/output?offset=${all.bytes + 1}`);
    expect(ahead.status).toBe(409);
    const tail = await readOutput(g, p.pid, all.bytes - 10);
    expect(tail.raw).toEqual(all.raw.subarray(all.bytes - 10));
    const bad = await call(g, 'GET', `/processes/${p.pid}/output?offset=-1`);
    expect(bad.status).toBe(400);
  }, 30_000);

  it('a new consumer replaces the old one', async () => {
    const p = await run(g, { cmd: 'echo start; sleep 1; echo end', shell: true });
    const firstEnded = new Promise<string>((resolve) => {
      const req = httpRequest(
        `${g.base}/processes/${p.pid}/output`,
        { agent: false, headers: AUTH },
        (res) => {
          res.on('data', () => {});
          res.on('end', () => resolve('end'));
          res.on('error', () => resolve('cut'));
          res.on('close', () => resolve('cut'));
        },
      );
      req.on('error', () => resolve('cut'));
      req.end();
    });
    await sleep(200);
    const second = readOutput(g, p.pid, 0);
    expect(await firstEnded).toBe('cut');
    const out = await second;
    expect(out.stdout.toString()).toBe('start\nend\n');
  });
});

describe('guest stdin', () => {
  it('cat echoes stdin and exits 0 after close; writes after close are 409', async () => {
    const p = await run(g, { cmd: 'cat', stdin: true });
    const outP = readOutput(g, p.pid);
    expect((await call(g, 'POST', `/processes/${p.pid}/stdin`, Buffer.from('123\n'))).status).toBe(204);
    expect((await call(g, 'POST', `/processes/${p.pid}/stdin/close`)).status).toBe(204);
    const late = await call(g, 'POST', `/processes/${p.pid}/stdin`, Buffer.from('x'));
    expect(late.status).toBe(409);
    expect((late.json() as { error: { code: string } }).error.code).toBe('PROCESS_EXITED');
    const out = await outP;
    expect(out.stdout.toString()).toBe('123\n');
    expect(out.exit).toEqual({ exitCode: 0, signal: null, timedOut: false });
    const afterExit = await call(g, 'POST', `/processes/${p.pid}/stdin`, Buffer.from('x'));
    expect(afterExit.status).toBe(409);
  });

  it('without stdin, cat sees EOF at once', async () => {
    const p = await run(g, { cmd: 'cat' });
    const out = await readOutput(g, p.pid);
    expect(out.exit).toEqual({ exitCode: 0, signal: null, timedOut: false });
    const w = await call(g, 'POST', `/processes/${p.pid}/stdin`, Buffer.from('x'));
    expect(w.status).toBe(409);
  });

  it('10 MB of binary stdin round-trips through cat', async () => {
    const data = randomBytes(10_000_000);
    const p = await run(g, { cmd: 'cat', stdin: true });
    const outP = readOutput(g, p.pid);
    for (let i = 0; i < data.length; i += 3_000_000) {
      const r = await call(g, 'POST', `/processes/${p.pid}/stdin`, data.subarray(i, i + 3_000_000));
      expect(r.status).toBe(204);
    }
    await call(g, 'POST', `/processes/${p.pid}/stdin/close`);
    const out = await outP;
    expect(out.stdout.length).toBe(data.length);
    expect(sha(out.stdout)).toBe(sha(data));
    expect(out.exit!.exitCode).toBe(0);
  }, 30_000);
});

describe('guest users and shutdown', () => {
  it('runs as the configured user by default and as root on request', async () => {
    const u = await startGuest({ SPACE_GUEST_USER: 'nobody' });
    try {
      const p = await run(u, { cmd: 'id -u; id -g; echo $HOME $USER; touch made-by-user; pwd', shell: true });
      const out = await readOutput(u, p.pid);
      expect(out.stdout.toString().split('\n').slice(0, 4)).toEqual([
        '65534',
        '65534',
        `${u.home} nobody`,
        u.home,
      ]);
      expect(out.exit!.exitCode).toBe(0);
      const r = await run(u, { cmd: 'id', args: ['-u'], user: 'root' });
      expect((await readOutput(u, r.pid)).stdout.toString()).toBe('0\n');
      const w = await call(u, 'PUT', `/files?path=${q('new/dir/owned.txt')}`, 'x');
      expect(w.status).toBe(200);
      const owner = await run(u, { cmd: 'stat', args: ['-c', '%u', 'new', 'new/dir/owned.txt'] });
      expect((await readOutput(u, owner.pid)).stdout.toString()).toBe('65534\n65534\n');
    } finally {
      await u.stop();
    }
  });

  it('r15-cwd-with-the-users-rights: a directory the user cannot enter is refused before the command starts', async () => {
    const u = await startGuest({ SPACE_GUEST_USER: 'nobody' });
    const locked = mkdtempSync(join(tmpdir(), 'space-r15-'));
    try {
      chmodSync(locked, 0o700); // root's, like /root
      const p = await run(u, { cmd: 'pwd', cwd: locked });
      const out = await readOutput(u, p.pid);
      expect(out.stdout.toString()).toBe('');
      expect(out.exit).toMatchObject({ exitCode: 126, error: expect.stringMatching(/permission denied/) });
      // root may, and so may the user where the bits allow
      const r = await run(u, { cmd: 'pwd', cwd: locked, user: 'root' });
      expect((await readOutput(u, r.pid)).stdout.toString()).toBe(`${locked}\n`);
      chmodSync(locked, 0o711);
      const ok = await run(u, { cmd: 'pwd', cwd: locked });
      expect((await readOutput(u, ok.pid)).stdout.toString()).toBe(`${locked}\n`);
    } finally {
      rmSync(locked, { recursive: true, force: true });
      await u.stop();
    }
  });

  it('SIGTERM closes the server and kills every process group', async () => {
    const s = await startGuest();
    const p = await run(s, { cmd: 'sleep 300 & echo $!; sleep 300', shell: true });
    const outP = readOutput(s, p.pid).catch(() => null);
    await sleep(200);
    await s.stop();
    await outP;
    await sleep(100);
    expect(alive(p.pid)).toBe(false);
  });
});

describe('guest authentication', () => {
  it('serves only the holder of its token; processes never see the token', async () => {
    const g = await startGuest();
    try {
      const open = (path: string, headers: Record<string, string> = {}) =>
        new Promise<number>((resolve, reject) => {
          const req = httpRequest(`${g.base}${path}`, { method: 'POST', agent: false, headers }, (res) => {
            res.resume();
            resolve(res.statusCode!);
          });
          req.on('error', reject);
          req.end(JSON.stringify({ cmd: 'id', user: 'root' }));
        });
      expect(await open('/processes', { 'content-type': 'application/json' })).toBe(401);
      expect(
        await open('/processes', { 'content-type': 'application/json', authorization: 'Bearer wrong' }),
      ).toBe(401);
      expect((await call(g, 'GET', '/health')).status).toBe(200);
      const p = await run(g, {
        cmd: 'sh',
        args: ['-c', 'env; cat /proc/$PPID/environ 2>/dev/null | tr "\\0" "\\n"'],
      });
      const out = await readOutput(g, p.pid);
      expect(out.stdout.toString()).not.toContain('guest-test-token');
    } finally {
      await g.stop();
    }
  });

  it('rotates its token: the old one stops working, the new one works, a bad one is refused', async () => {
    const g = await startGuest();
    try {
      const post = (path: string, auth: string, body: unknown) =>
        new Promise<number>((resolve, reject) => {
          const req = httpRequest(
            `${g.base}${path}`,
            {
              method: 'POST',
              agent: false,
              headers: { 'content-type': 'application/json', authorization: auth },
            },
            (res) => {
              res.resume();
              resolve(res.statusCode!);
            },
          );
          req.on('error', reject);
          req.end(JSON.stringify(body));
        });
      const fresh = 'b'.repeat(64);
      expect(await post('/token', 'Bearer nope', { token: fresh })).toBe(401);
      expect(await post('/token', AUTH.authorization, { token: 'short' })).toBe(400);
      expect(await post('/token', AUTH.authorization, { token: fresh })).toBe(204);
      expect(await post('/init', AUTH.authorization, { env: {} })).toBe(401);
      expect(await post('/init', `Bearer ${fresh}`, { env: {} })).toBe(204);
    } finally {
      await g.stop();
    }
  });
});

describe('PTY resize', () => {
  /** The terminal size of the command a PTY helper (`helper`) runs, as `stty` reads it. */
  function ttySize(helper: number): string {
    const kids = readFileSync(`/proc/${helper}/task/${helper}/children`, 'utf8').trim().split(/\s+/);
    return execFileSync('stty', ['size'], { stdio: [openSync(`/proc/${kids[0]}/fd/0`, 'r'), 'pipe', 'pipe'] })
      .toString()
      .trim();
  }

  it('answers a resize only once the terminal has the new size (held while its helper is stopped)', async () => {
    const p = await run(g, { cmd: 'sleep', args: ['100'], pty: { cols: 80, rows: 24 } });
    onTestFinished(() => void call(g, 'POST', `/processes/${p.pid}/signal`, { signal: 'SIGKILL' }));
    await vi.waitFor(() => expect(ttySize(p.pid)).toBe('24 80'), { timeout: 5_000, interval: 50 });
    process.kill(p.pid, 'SIGSTOP'); // the helper cannot set the size now
    let answered = false;
    const resized = call(g, 'POST', `/processes/${p.pid}/resize`, { cols: 100, rows: 30 }).then((r) => {
      answered = true;
      return r;
    });
    await sleep(300);
    // not set, so not answered
    expect([ttySize(p.pid), answered]).toEqual(['24 80', false]);
    process.kill(p.pid, 'SIGCONT');
    expect((await resized).status).toBe(204);
    expect(ttySize(p.pid)).toBe('30 100');
    // a size the terminal cannot take is refused, not answered 204; a process without one too
    const plain = await run(g, { cmd: 'sleep', args: ['100'] });
    onTestFinished(() => void call(g, 'POST', `/processes/${plain.pid}/signal`, { signal: 'SIGKILL' }));
    const none = await call(g, 'POST', `/processes/${plain.pid}/resize`, { cols: 100, rows: 30 });
    expect(none.status).toBe(400);
  });

  it('a resize waiting on a helper that dies is answered PROCESS_EXITED', async () => {
    const p = await run(g, { cmd: 'sleep', args: ['100'], pty: { cols: 80, rows: 24 } });
    await vi.waitFor(() => expect(ttySize(p.pid)).toBe('24 80'), { timeout: 5_000, interval: 50 });
    process.kill(p.pid, 'SIGSTOP');
    const resized = call(g, 'POST', `/processes/${p.pid}/resize`, { cols: 100, rows: 30 });
    await sleep(100);
    process.kill(p.pid, 'SIGKILL');
    const r = await resized;
    expect([r.status, (r.json() as { error: { code: string } }).error.code]).toEqual([409, 'PROCESS_EXITED']);
  });
});
