/**
 * `sudo` where setuid cannot work: gVisor sets no_new_privs on every process of a sandbox (whatever
 * the OCI spec says), so the kernel ignores set-user-ID bits and the real sudo refuses to run. A
 * template whose user has sudo (`user.sudo`, agent/image/templates.ts) gets {@link sudoShim} as
 * `/usr/local/bin/sudo` (ahead of `/usr/bin` on PATH); the guest daemon, which runs as root,
 * listens on {@link SUDO_SOCKET} and hands each connection to {@link SUDO_HANDLER}, a python3
 * one-shot that checks the caller's credentials (SO_PEERCRED: root, or a member of group `sudo`),
 * takes the caller's stdin, stdout and stderr (SCM_RIGHTS), runs the command as the asked user with
 * sudo's environment rules, forwards the signals the shim relays and answers the exit status.
 * Where setuid works (the VM drivers) the shim runs the real sudo.
 *
 * Wire (one Unix stream connection): shim → 8 bytes `SUDO` + JSON length (uint32 big-endian), sent
 * with its fds 0, 1, 2; then the JSON `{argv, user, env, cwd, keepEnv, login, shell}`; then
 * `{"signal": n}` lines. Handler → one line `{"exit": code}` (negative: killed by that signal) or
 * `{"error": text}`.
 */

/** Where the guest daemon listens for sudo requests (in the sandbox). */
export const SUDO_SOCKET = '/run/space-sudo.sock';

/** The group whose members may use sudo through the guest (Debian's `sudo` group). */
export const SUDO_GROUP = 'sudo';

/**
 * Source of the one-shot handler (python3 ≥ 3.9): `python3 -c SUDO_HANDLER <group>`, with the
 * accepted connection as fd 3. Runs as root.
 */
export const SUDO_HANDLER = String.raw`
import grp, json, os, pwd, signal, socket, struct, sys, threading
group = sys.argv[1]
conn = socket.socket(fileno=3)
def reply(o):
    conn.sendall((json.dumps(o) + '\n').encode())
pid, uid, gid = struct.unpack('3i', conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
head, fds, _, _ = socket.recv_fds(conn, 8, 3)
if len(head) != 8 or head[:4] != b'SUDO' or len(fds) != 3:
    reply({'error': 'not a sudo request'}); sys.exit(0)
size = struct.unpack('>I', head[4:])[0]
body = b''
while len(body) < size:
    d = conn.recv(size - len(body))
    if not d: sys.exit(0)
    body += d
req = json.loads(body)
try:
    caller = pwd.getpwuid(uid)
except KeyError:
    reply({'error': 'unknown caller'}); sys.exit(0)
try:
    g = grp.getgrnam(group)
    member = caller.pw_name in g.gr_mem or caller.pw_gid == g.gr_gid
except KeyError:
    member = False
if uid != 0 and not member:
    reply({'error': caller.pw_name + ' is not in the sudoers file (group ' + group + ')'}); sys.exit(0)
try:
    target = pwd.getpwnam(req.get('user') or 'root')
except KeyError:
    reply({'error': 'unknown user ' + str(req.get('user'))}); sys.exit(0)
argv = list(req.get('argv') or [])
shell = target.pw_shell or '/bin/sh'
cwd = req.get('cwd') or '/'
if req.get('login'):
    argv = [shell, '-l'] if not argv else [shell, '-l', '-c', ' '.join(argv)]
    cwd = target.pw_dir
elif req.get('shell'):
    argv = [shell] if not argv else [shell, '-c', ' '.join(argv)]
if not argv:
    reply({'error': 'no command'}); sys.exit(0)
given = req.get('env') or {}
keep = ('TERM', 'LANG', 'LANGUAGE', 'LC_ALL', 'COLORTERM', 'DISPLAY', 'SPACE_COMMAND')
env = dict(given) if req.get('keepEnv') else {k: v for k, v in given.items() if k in keep}
env.update({'HOME': target.pw_dir, 'USER': target.pw_name, 'LOGNAME': target.pw_name, 'SHELL': shell,
            'SUDO_USER': caller.pw_name, 'SUDO_UID': str(uid), 'SUDO_GID': str(gid),
            'SUDO_COMMAND': ' '.join(argv)})
if not req.get('keepEnv') or 'PATH' not in env:
    env['PATH'] = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
child = os.fork()
if child == 0:
    try:
        os.setpgid(0, 0)
        for i, fd in enumerate(fds):
            os.dup2(fd, i)
        os.closerange(3, 65536)
        os.initgroups(target.pw_name, target.pw_gid)
        os.setgid(target.pw_gid)
        os.setuid(target.pw_uid)
        try:
            os.chdir(cwd)
        except OSError:
            os.chdir('/')
        os.execvpe(argv[0], argv, env)
    except OSError as e:
        os.write(2, ('sudo: ' + argv[0] + ': ' + (e.strerror or 'cannot run') + '\n').encode())
        os._exit(126 if isinstance(e, PermissionError) else 127)
    os._exit(127)
for fd in fds:
    os.close(fd)
def relay():
    buf = b''
    while True:
        try:
            d = conn.recv(4096)
        except OSError:
            return
        if not d:
            return
        buf += d
        while b'\n' in buf:
            line, buf = buf.split(b'\n', 1)
            try:
                os.killpg(child, int(json.loads(line)['signal']))
            except (ValueError, KeyError, OSError, TypeError):
                pass
threading.Thread(target=relay, daemon=True).start()
status = os.waitpid(child, 0)[1]
reply({'exit': os.waitstatus_to_exitcode(status)})
`;

/**
 * Source of the `sudo` a template installs (python3 ≥ 3.9): the real sudo at `real` when this
 * process may gain privileges (no_new_privs clear) and it exists, else a request to the guest on
 * `socket`. Takes the options agents use: `-u user`, `-E`/`--preserve-env`, `-i`, `-s`, `-n`, `-H`,
 * `-S`, `-k`, `-v`, `-V`, `--`, and grouped short flags (`-nE`).
 */
export function sudoShim(o: { socket?: string; real?: string } = {}): string {
  const socketPath = JSON.stringify(o.socket ?? SUDO_SOCKET);
  const real = JSON.stringify(o.real ?? '/usr/bin/sudo');
  return String.raw`#!/usr/bin/python3
# sudo for sandboxes where setuid cannot work (SPACE: runtime/core/sudo.ts)
import ctypes, json, os, signal, socket, struct, sys
SOCK, REAL = ${socketPath}, ${real}
def no_new_privs():
    try:
        return ctypes.CDLL(None).prctl(39, 0, 0, 0, 0) == 1
    except (OSError, AttributeError):
        return False
if os.path.exists(REAL) and not no_new_privs():
    os.execv(REAL, [REAL] + sys.argv[1:])
args, req = sys.argv[1:], {'user': 'root', 'keepEnv': False, 'login': False, 'shell': False}
def usage(text):
    sys.stderr.write('sudo: ' + text + '\n')
    sys.exit(1)
while args and args[0].startswith('-') and args[0] != '-':
    a = args.pop(0)
    if a == '--':
        break
    if a.startswith('--'):
        name, _, value = a.partition('=')
        if name in ('--non-interactive', '--set-home', '--stdin', '--reset-timestamp'):
            continue
        if name == '--preserve-env':
            req['keepEnv'] = True
        elif name == '--user':
            req['user'] = value or (args.pop(0) if args else usage('--user needs a user'))
        elif name == '--login':
            req['login'] = True
        elif name == '--shell':
            req['shell'] = True
        elif name == '--validate':
            sys.exit(0)
        elif name == '--version':
            print('sudo (SPACE sandbox: through the guest, runtime/core/sudo.ts)')
            sys.exit(0)
        else:
            usage('option ' + name + ' is not supported in this sandbox')
        continue
    flags = a[1:]
    while flags:
        f, flags = flags[0], flags[1:]
        if f in 'nHSk':
            continue
        if f == 'E':
            req['keepEnv'] = True
        elif f == 'i':
            req['login'] = True
        elif f == 's':
            req['shell'] = True
        elif f == 'v':
            sys.exit(0)
        elif f == 'V':
            print('sudo (SPACE sandbox: through the guest, runtime/core/sudo.ts)')
            sys.exit(0)
        elif f == 'u':
            req['user'] = flags or (args.pop(0) if args else usage('-u needs a user'))
            flags = ''
        else:
            usage('option -' + f + ' is not supported in this sandbox')
if not args and not req['login'] and not req['shell']:
    usage('usage: sudo [-u user] [-E] [-i | -s] command')
req.update({'argv': args, 'env': dict(os.environ), 'cwd': os.getcwd()})
conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    conn.connect(SOCK)
except OSError as e:
    usage('cannot reach the sandbox guest at ' + SOCK + ': ' + (e.strerror or str(e)))
body = json.dumps(req).encode()
socket.send_fds(conn, [b'SUDO' + struct.pack('>I', len(body))], [0, 1, 2])
conn.sendall(body)
def relay(sig, _frame):
    try:
        conn.sendall((json.dumps({'signal': sig}) + '\n').encode())
    except OSError:
        pass
for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(sig, relay)
buf = b''
while b'\n' not in buf:
    try:
        d = conn.recv(4096)
    except InterruptedError:
        continue
    if not d:
        usage('the sandbox guest ended the request')
    buf += d
answer = json.loads(buf.split(b'\n', 1)[0])
if 'error' in answer:
    usage(answer['error'])
code = answer['exit']
sys.exit(code if code >= 0 else 128 - code)
`;
}
