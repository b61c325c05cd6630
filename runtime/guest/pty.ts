/**
 * Pseudo-terminals for processes (E2B's `pty.create`), through a small python3 helper that the
 * guest starts in the process's place:
 *
 *   python3 -c PTY_HELPER <cols> <rows> <file> <args…>
 *
 * The helper opens a PTY pair (`pty.fork`: the child gets a new session with the terminal as its
 * controlling tty and stdin/stdout/stderr), sets the size before exec'ing the command, then copies
 * terminal output to its stdout and its stdin to the terminal. Resizes arrive as
 * `"<cols> <rows> <seq>\n"` lines on fd 3 (a socket pair: both ways) and become TIOCSWINSZ on the
 * terminal, which signals SIGWINCH to its foreground process group; once the size is set the
 * helper answers `"<seq> ok\n"` (or `"<seq> error\n"`) on fd 3, so a resize returns only after
 * the new size applies. It exits as the command did (same code, or the same signal).
 *
 * Why a helper and not a native PTY module (node-pty and its prebuilt forks): the guest layer is
 * our sources plus the node binary (agent/image/images.ts), with no native addons to build per Node ABI
 * and libc; Node itself cannot make a PTY (no grantpt/unlockpt/TIOCSWINSZ). gVisor implements
 * /dev/ptmx and devpts, and python3 is in the `base` template. `script(1)` was the other candidate:
 * it cannot be resized from outside without finding its terminal and running `stty` against it.
 * A template without python3 gets a clear start failure (exit 127, see process-start.ts).
 */

import { SpaceError } from '../core/errors.ts';
import { isObject } from './http.ts';

/** The interpreter that runs {@link PTY_HELPER}. */
export const PTY_PYTHON = 'python3';

/** Source of the helper (argv: cols rows file args…). Written for Python ≥ 3.9. */
export const PTY_HELPER = String.raw`
import fcntl, os, pty, select, signal, struct, sys, termios
cols, rows, argv = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
def size(fd, c, r):
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack('HHHH', r, c, 0, 0))
def put(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
pid, master = pty.fork()
if pid == 0:
    try:
        size(0, cols, rows)
        os.execvp(argv[0], argv)
    except OSError as e:
        os.write(2, (argv[0] + ': ' + (e.strerror or 'cannot execute') + '\n').encode())
        os._exit(127)
fds, ctl = [master, 0, 3], b''
while True:
    try:
        ready = select.select(fds, [], [])[0]
    except InterruptedError:
        continue
    if master in ready:
        try:
            data = os.read(master, 65536)
        except OSError:
            data = b''
        if not data:
            break
        put(1, data)
    if 0 in ready:
        data = os.read(0, 65536)
        if data:
            put(master, data)
        else:
            fds.remove(0)
    if 3 in ready:
        data = os.read(3, 4096)
        if not data:
            fds.remove(3)
        ctl += data
        while b'\n' in ctl:
            line, ctl = ctl.split(b'\n', 1)
            parts = line.split()
            try:
                size(master, int(parts[0]), int(parts[1]))
                ack = b' ok\n'
            except (ValueError, OSError, IndexError):
                ack = b' error\n'
            if len(parts) > 2:
                try:
                    put(3, parts[2] + ack)
                except OSError:
                    pass
status = os.waitpid(pid, 0)[1]
if os.WIFSIGNALED(status):
    signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
    os.kill(os.getpid(), os.WTERMSIG(status))
sys.exit(os.waitstatus_to_exitcode(status))
`;

/**
 * A terminal size from a request body: `{ cols, rows }`, integers from 1 to 1000.
 * @throws SpaceError BAD_REQUEST otherwise.
 */
export function parsePtySize(value: unknown): { cols: number; rows: number } {
  const ok = (n: unknown) => typeof n === 'number' && Number.isInteger(n) && n >= 1 && n <= 1000;
  if (!isObject(value) || !ok(value.cols) || !ok(value.rows)) {
    throw new SpaceError('BAD_REQUEST', 'a terminal size is { cols, rows }: integers from 1 to 1000');
  }
  return { cols: value.cols as number, rows: value.rows as number };
}

/** The helper's argv for running `file args…` on a `cols`×`rows` terminal. Pure. */
export function ptyArgv(cols: number, rows: number, file: string, args: string[]): string[] {
  return ['-c', PTY_HELPER, String(cols), String(rows), file, ...args];
}

/** The control line that resizes the terminal to `cols`×`rows`, answered with `seq`. Pure. */
export function resizeLine(cols: number, rows: number, seq: number): string {
  return `${cols} ${rows} ${seq}\n`;
}

/**
 * The helper's answer to a resize line: its `seq` and whether the size was set; null for a line
 * that is not one. Pure.
 */
export function parseResizeAck(line: string): { seq: number; ok: boolean } | null {
  const m = /^(\d{1,15}) (ok|error)$/.exec(line.trim());
  return m ? { seq: Number(m[1]), ok: m[2] === 'ok' } : null;
}
