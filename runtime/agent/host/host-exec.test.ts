import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { type HostExecError, HostExecutor } from './host-exec.ts';

const failure = (p: Promise<unknown>) =>
  p.then(
    () => {
      throw new Error('expected the command to fail');
    },
    (err: HostExecError) => err,
  );

describe('HostExecutor (real processes, through the helper)', () => {
  let x: HostExecutor;
  afterEach(() => x?.close());

  it('spawns from the helper, not from this process', async () => {
    x = new HostExecutor();
    const { stdout } = await x.run('sh', ['-c', 'echo $PPID']);
    expect(x.helperPid).toBeGreaterThan(0);
    expect(Number(stdout.trim())).toBe(x.helperPid);
    expect(Number(stdout.trim())).not.toBe(process.pid);
  });

  it('returns stdout and stderr; feeds input to stdin', async () => {
    x = new HostExecutor();
    expect(await x.run('sh', ['-c', 'echo out; echo err >&2'])).toEqual({ stdout: 'out\n', stderr: 'err\n' });
    expect((await x.run('cat', [], { input: 'line 1\nline 2\n' })).stdout).toBe('line 1\nline 2\n');
    // no input: stdin is at its end, so a reader does not hang
    expect((await x.run('cat', [])).stdout).toBe('');
  });

  it('fails like execFile: exit status, missing binary, timeout, output past the limit', async () => {
    x = new HostExecutor();
    const exit = await failure(x.run('sh', ['-c', 'echo partial; echo broken >&2; exit 3']));
    expect(exit.code).toBe(3);
    expect(exit.stdout).toBe('partial\n');
    expect(exit.stderr).toBe('broken\n');
    expect(exit.message).toContain('Command failed: sh -c');
    const missing = await failure(x.run('space-no-such-binary', []));
    expect(missing.code).toBe('ENOENT');
    const slow = await failure(x.run('sleep', ['5'], { timeout: 100, killSignal: 'SIGKILL' }));
    expect(slow.killed).toBe(true);
    expect(slow.signal).toBe('SIGKILL');
    const big = await failure(x.run('head', ['-c', '5000', '/dev/zero'], { maxBuffer: 1000 }));
    expect(big.code).toBe('ERR_CHILD_PROCESS_STDIO_MAXBUFFER');
  });

  it('runs commands side by side: a quick one is not held behind a slow one', async () => {
    x = new HostExecutor();
    const order: string[] = [];
    const slow = x.run('sh', ['-c', 'sleep 1; echo slow']).then(() => order.push('slow'));
    const quick = x.run('echo', ['quick']).then(() => order.push('quick'));
    await Promise.all([slow, quick]);
    expect(order).toEqual(['quick', 'slow']);
  });

  it('appends output to a file when asked, and passes the environment given', async () => {
    x = new HostExecutor();
    const dir = mkdtempSync(join(tmpdir(), 'space-host-exec-'));
    try {
      const file = join(dir, 'console.log');
      await x.run('sh', ['-c', 'echo first'], { outputFile: file });
      const r = await x.run('sh', ['-c', 'echo "$SPACE_X"; echo to-stderr >&2'], {
        outputFile: file,
        env: { PATH: process.env.PATH, SPACE_X: 'second' },
      });
      expect(r).toEqual({ stdout: '', stderr: '' });
      expect(readFileSync(file, 'utf8')).toBe('first\nsecond\nto-stderr\n');
      const bad = await failure(x.run('sh', ['-c', 'exit 4'], { outputFile: file }));
      expect(bad.code).toBe(4);
      const noDir = await failure(x.run('true', [], { outputFile: join(dir, 'missing', 'x.log') }));
      expect(noDir.code).toBe('ENOENT');
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('a helper that dies fails its commands (EHELPER) and the next command gets a new helper', async () => {
    x = new HostExecutor();
    await x.run('true', []);
    const first = x.helperPid!;
    const pending = failure(x.run('sleep', ['5']));
    process.kill(first, 'SIGKILL');
    const err = await pending;
    expect(err.code).toBe('EHELPER');
    expect(err.message).toContain('helper exited');
    const { stdout } = await x.run('sh', ['-c', 'echo $PPID']);
    expect(x.helperPid).not.toBe(first);
    expect(Number(stdout.trim())).toBe(x.helperPid);
  });
});
