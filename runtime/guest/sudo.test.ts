/**
 * sudo through the guest (core/sudo.ts, sudo-broker.ts): the real daemon's socket and handler, the
 * shim a template installs run as a real process, as root and as a user outside group `sudo`.
 */
import { spawnSync } from 'node:child_process';
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { sudoShim } from '../core/sudo.ts';
import { type Guest, startGuest } from './test-harness.ts';

let g: Guest;
let dir: string;
let shim: string;
beforeAll(async () => {
  g = await startGuest();
  dir = mkdtempSync(join(tmpdir(), 'space-sudo-shim-'));
  chmodSync(dir, 0o755);
  shim = join(dir, 'sudo');
  // no real sudo at that path: the shim uses the guest, as under gVisor
  writeFileSync(shim, sudoShim({ socket: g.sudoSocket, real: join(dir, 'no-real-sudo') }), { mode: 0o755 });
});
afterAll(async () => {
  await g?.stop();
  rmSync(dir, { recursive: true, force: true });
});

const sudo = (
  args: string[],
  o: { uid?: number; gid?: number; input?: string; env?: Record<string, string> } = {},
) => {
  const r = spawnSync(shim, args, {
    input: o.input ?? '',
    env: { PATH: process.env.PATH ?? '/usr/bin:/bin', ...o.env },
    cwd: dir,
    ...(o.uid !== undefined ? { uid: o.uid, gid: o.gid ?? o.uid } : {}),
    timeout: 20_000,
  });
  return { code: r.status, out: r.stdout.toString(), err: r.stderr.toString() };
};

describe('sudo through the guest', { timeout: 60_000 }, () => {
  it('runs the command as root (or -u user) with the caller’s stdio, exit code and directory', () => {
    expect(sudo(['id', '-u'])).toEqual({ code: 0, out: '0\n', err: '' });
    expect(sudo(['-n', '-u', 'nobody', 'id', '-u']).out).toBe('65534\n');
    expect(sudo(['sh', '-c', 'exit 7']).code).toBe(7);
    expect(sudo(['cat'], { input: 'through stdin\n' }).out).toBe('through stdin\n');
    expect(sudo(['pwd']).out).toBe(`${dir}\n`);
    expect(sudo(['sh', '-c', 'echo oops >&2; exit 3'])).toEqual({ code: 3, out: '', err: 'oops\n' });
    expect(sudo(['no-such-command-here']).code).toBe(127);
  });

  it("keeps sudo's environment rules: reset by default, the caller's with -E; SUDO_USER set", () => {
    const env = { FOO: 'bar' };
    expect(sudo(['sh', '-c', 'echo "[$FOO] $HOME $SUDO_USER"'], { env }).out).toBe('[] /root root\n');
    expect(sudo(['-E', 'sh', '-c', 'echo "[$FOO]"'], { env }).out).toBe('[bar]\n');
    expect(sudo(['-s', 'echo from a shell']).out).toBe('from a shell\n');
  });

  it('refuses a caller outside group sudo, and options it does not take', () => {
    const refused = sudo(['id', '-u'], { uid: 65534 });
    expect([refused.code, refused.out]).toEqual([1, '']);
    expect(refused.err).toMatch(/not in the sudoers file/);
    const bad = sudo(['-X', 'id']);
    expect([bad.code, bad.err]).toEqual([1, expect.stringMatching(/option -X is not supported/)]);
    expect(sudo([]).code).toBe(1);
  });
});
