import { spawn } from 'node:child_process';
import { describe, expect, it } from 'vitest';
import { parseStat } from '../core/proc-stat.ts';
import { COMMAND_MARKER_ENV, commandProcesses } from './tree.ts';

describe('parseStat', () => {
  it('reads pid, ppid and state past a name holding ") " and spaces', () => {
    expect(parseStat('42 (a) b (c) S 7 42 42 0 -1')).toEqual({ pid: 42, ppid: 7, zombie: false });
    expect(parseStat('43 (sleep) Z 1 43 43')).toEqual({ pid: 43, ppid: 1, zombie: true });
    expect(parseStat('')).toBeUndefined();
  });
});

describe('commandProcesses', () => {
  it('finds a process by its marker after its parent is gone, and never an unmarked one', async () => {
    const marker = `t${process.pid}${Date.now()}`;
    // a double fork: the sleep is reparented away from the shell that started it
    const sh = spawn('sh', ['-c', '(sleep 30 & echo $!) ; exit 0'], {
      env: { ...process.env, [COMMAND_MARKER_ENV]: marker },
      stdio: ['ignore', 'pipe', 'ignore'],
    });
    const bg = Number(
      await new Promise<string>((r) => sh.stdout.once('data', (d: Buffer) => r(d.toString()))),
    );
    const other = spawn('sleep', ['30'], { stdio: 'ignore' });
    try {
      await new Promise((r) => sh.once('exit', r));
      const found = await commandProcesses(sh.pid!, marker);
      expect(found).toContain(bg);
      expect(found).not.toContain(other.pid);
      expect(found).not.toContain(process.pid);
    } finally {
      process.kill(bg, 'SIGKILL');
      other.kill('SIGKILL');
    }
  });
});
