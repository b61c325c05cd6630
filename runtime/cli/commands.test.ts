import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { commandBody } from './exec.ts';
import { localTarget } from './files.ts';
import { wantsJson } from './program.ts';
import { createBody, parseStates, sandboxRows } from './sandbox.ts';
import { missingPrerequisites, portInUse, searchPath } from './up-host.ts';
import { childPids, logTail, signalName } from './up-supervise.ts';
import { parseSince, usageRows } from './usage.ts';

describe('exec request body', () => {
  it('sends argv as cmd + args', () => {
    expect(commandBody(['sh', '-c', 'echo hello; exit 3'], {})).toEqual({
      cmd: 'sh',
      args: ['-c', 'echo hello; exit 3'],
    });
  });
  it('maps options', () => {
    expect(
      commandBody(['ls', '-la'], {
        env: { A: '1' },
        cwd: '/tmp',
        root: true,
        timeout: 500,
        interactive: true,
      }),
    ).toEqual({
      cmd: 'ls',
      args: ['-la'],
      env: { A: '1' },
      cwd: '/tmp',
      user: 'root',
      timeoutMs: 500,
      stdin: true,
    });
    expect(commandBody(['echo', '$HOME'], { shell: true })).toEqual({ cmd: 'echo $HOME', shell: true });
  });
  it('needs a command', () => {
    expect(() => commandBody([], {})).toThrow(/after --/);
  });
});

describe('sandbox', () => {
  it('builds the create body', () => {
    expect(createBody({ template: 'base', wait: true })).toEqual({ template: 'base' });
    expect(
      createBody({
        template: 'base',
        vcpus: 0.5,
        memory: 256,
        timeout: 60,
        metadata: { a: 'b' },
        env: { X: '1' },
        wait: true,
      }),
    ).toEqual({
      template: 'base',
      vcpus: 0.5,
      memoryMiB: 256,
      timeoutSec: 60,
      metadata: { a: 'b' },
      env: { X: '1' },
    });
  });
  it('validates --state', () => {
    expect(parseStates('running, paused')).toBe('running,paused');
    expect(() => parseStates('running,nope')).toThrow(/--state/);
  });
  it('renders list rows', () => {
    const now = Date.parse('2025-01-01T00:00:00Z');
    const rows = sandboxRows(
      [
        {
          id: 'sbx_1',
          template: 'base',
          state: 'running',
          vcpus: 1,
          memoryMiB: 512,
          timeoutSec: 300,
          autoPauseSec: 0,
          onTimeout: 'kill',
          autoResume: true,
          pause: null,
          metadata: { team: 'a' },
          nodeId: 'local',
          fromWarmPool: true,
          createdFrom: 'warm',
          sessionId: 'ses_1',
          createdAt: '2024-12-31T23:59:50Z',
          updatedAt: '2024-12-31T23:59:50Z',
          expiresAt: '2025-01-01T00:05:00Z',
          endedAt: null,
          killReason: null,
          endMessage: null,
          egress: { mode: 'allow-list', allow: [], deny: [], cidrs: [] },
          ports: { public: true, trafficToken: null },
          credentials: [],
        },
      ],
      now,
    );
    expect(rows).toEqual([['sbx_1', 'base', 'running', '1', '512M', 'local', '10s ago', 'in 5m', 'team=a']]);
  });
});

describe('files', () => {
  it('derives the local name of a download', () => {
    expect(localTarget('/home/user/out.json', undefined)).toBe('out.json');
    expect(localTarget('/home/user/out.json', '-')).toBe('-');
    expect(localTarget('/a/dir/', undefined)).toBe('dir');
    expect(() => localTarget('/', undefined)).toThrow(/local file name/);
  });
});

describe('space', () => {
  it('finds --json before --', () => {
    expect(wantsJson(['sandbox', 'ls', '--json'])).toBe(true);
    expect(wantsJson(['exec', 'sbx_1', '--', 'jq', '--json'])).toBe(false);
  });
});

describe('up', () => {
  it('adds system dirs to PATH once', () => {
    expect(searchPath('/a:/usr/bin').split(':')).toEqual([
      '/a',
      '/usr/bin',
      '/usr/local/sbin',
      '/usr/local/bin',
      '/usr/sbin',
      '/sbin',
      '/bin',
    ]);
  });
  it('lists every missing prerequisite', () => {
    const have = new Set(['runsc', 'nft']);
    expect(missingPrerequisites(true, 1000, (n) => (have.has(n) ? `/usr/bin/${n}` : null))).toEqual([
      expect.stringMatching(/^root/),
      'redis-server',
      'ip',
      'debootstrap',
      'tini-static',
    ]);
    expect(missingPrerequisites(false, 0, () => '/x')).toEqual([]);
  });
  it('detects a busy port', async () => {
    const { createServer } = await import('node:net');
    const srv = createServer();
    await new Promise<void>((r) => srv.listen(0, '127.0.0.1', () => r()));
    const port = (srv.address() as { port: number }).port;
    expect(await portInUse(port)).toBe(true);
    await new Promise((r) => srv.close(r));
    expect(await portInUse(port)).toBe(false);
  });
  it('finds a process’s children by what their command line holds', async () => {
    const marker = `space-child-${process.pid}-${Date.now()}`;
    // a child whose command line carries the marker (`sh -c <script> <name>`), and one without it
    // its command name holds ') (' as well: the stat line's fields come after the last ')'
    const marked = spawn('sh', ['-c', 'printf "a) b (" > /proc/self/comm; sleep 30; true', marker], {
      stdio: 'ignore',
    });
    const other = spawn('sleep', ['30'], { stdio: 'ignore' });
    try {
      expect(childPids(process.pid, marker)).toEqual([marked.pid]);
      expect(childPids(process.pid, `${marker}-not`)).toEqual([]);
      expect(childPids(undefined, marker)).toEqual([]);
    } finally {
      marked.kill('SIGKILL');
      other.kill('SIGKILL');
      await Promise.all([once(marked, 'exit'), once(other, 'exit')]);
    }
  });
  it('names a signal by its number (a wrapper’s 128 + n)', () => {
    expect(signalName(9)).toBe('SIGKILL');
    expect(signalName(15)).toBe('SIGTERM');
    expect(signalName(0)).toBeUndefined();
  });
  it('tails only what a child wrote this time', () => {
    const dir = mkdtempSync(join(tmpdir(), 'space-log-'));
    const f = join(dir, 'api.log');
    writeFileSync(f, 'old 1\nold 2\n');
    const from = 12;
    writeFileSync(f, 'old 1\nold 2\nnew 1\nnew 2\nnew 3\n');
    expect(logTail(f, from, 2)).toEqual(['new 2', 'new 3']);
    expect(logTail(f, from)).toEqual(['new 1', 'new 2', 'new 3']);
    rmSync(dir, { recursive: true, force: true });
  });
});

describe('usage and pause', () => {
  it('parses --since durations and refuses anything else', () => {
    expect(parseSince('90s')).toBe(90_000);
    expect(parseSince('15m')).toBe(900_000);
    expect(parseSince('2h')).toBe(7_200_000);
    expect(parseSince('7d')).toBe(604_800_000);
    expect(() => parseSince('2 weeks')).toThrow(/--since/);
    expect(() => parseSince('-1h')).toThrow(/--since/);
  });

  it('prints one row per group and a total', () => {
    const f = (a: number) => ({
      seconds: { active: a, idle: 2, paused: 3 },
      vcpuSeconds: { active: a * 2, idle: 4, paused: 6 },
      gibSeconds: { active: a / 2, idle: 1, paused: 1.5 },
    });
    const rows = usageRows({
      from: '',
      to: '',
      groupBy: 'template',
      resolutionSec: 60,
      groups: [
        { key: 'base', ...f(1) },
        { key: '', ...f(2) },
      ],
      total: f(3),
    });
    expect(rows).toEqual([
      ['base', '1.0', '2.0', '3.0', '2.0', '0.5'],
      ['-', '2.0', '2.0', '3.0', '4.0', '1.0'],
      ['TOTAL', '3.0', '2.0', '3.0', '6.0', '1.5'],
    ]);
  });

  it('puts --auto-pause in the create body, 0 included', () => {
    expect(createBody({ template: 'base', autoPause: 0, wait: true })).toEqual({
      template: 'base',
      autoPauseSec: 0,
    });
  });

  it('puts --on-timeout and --no-auto-resume in the create body (the defaults send nothing)', () => {
    expect(createBody({ template: 'base', onTimeout: 'pause', autoResume: false, wait: true })).toEqual({
      template: 'base',
      onTimeout: 'pause',
      autoResume: false,
    });
    expect(createBody({ template: 'base', autoResume: true, wait: true })).toEqual({ template: 'base' });
  });
});
