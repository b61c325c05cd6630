import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { readFileSync } from 'node:fs';
import { afterEach, describe, expect, it } from 'vitest';
import { processAlive } from './process-alive.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const parents: ReturnType<typeof spawn>[] = [];
afterEach(() => {
  for (const p of parents.splice(0)) p.kill('SIGKILL');
});

describe('processAlive (the warm claim’s check that a slot’s sandbox process still runs)', () => {
  it('is true for a running process and false for a pid that no longer exists', async () => {
    expect(processAlive(process.pid)).toBe(true);
    const child = spawn('true');
    await once(child, 'exit');
    await sleep(50); // reaped by this process
    expect(processAlive(child.pid!)).toBe(false);
  });

  it('is false for a killed process its parent has not reaped (a zombie)', async () => {
    // the shell starts a short child, then becomes a `sleep` that never waits for it
    const parent = spawn('sh', ['-c', 'sleep 0.2 & echo $!; exec sleep 30'], {
      stdio: ['ignore', 'pipe', 'ignore'],
    });
    parents.push(parent);
    const [line] = (await once(parent.stdout!, 'data')) as [Buffer];
    const pid = Number(line.toString().trim());
    expect(processAlive(pid)).toBe(true);
    let state = '';
    for (let i = 0; i < 50 && state !== 'Z'; i++) {
      await sleep(50);
      state = /\) (\S)/.exec(readFileSync(`/proc/${pid}/stat`, 'utf8'))![1]!;
    }
    expect(state).toBe('Z'); // it is a zombie now, and the check says it does not run
    expect(processAlive(pid)).toBe(false);
  });
});
