/**
 * Entry point of the guest daemon (runs inside each sandbox as root, under tini as PID 1).
 *
 * Env: SPACE_GUEST_HOST (default 0.0.0.0), SPACE_GUEST_PORT (default GUEST_PORT), SPACE_GUEST_HOME
 * (default: the user's home from /etc/passwd, else /home/user), SPACE_GUEST_USER (default `user`),
 * SPACE_GUEST_SUDO_SOCKET (default SUDO_SOCKET; empty: no sudo service; core/sudo.ts).
 */

import { chownSync, mkdirSync, readFileSync, unlinkSync } from 'node:fs';
import { GUEST_PORT } from '../core/guest-protocol.ts';
import { SUDO_SOCKET } from '../core/sudo.ts';
import { createGuestApp } from './app.ts';
import { errorFields, log } from './log.ts';
import { startSudoBroker } from './sudo-broker.ts';
import { type Identity, readPasswd } from './users.ts';

const host = process.env.SPACE_GUEST_HOST || '0.0.0.0';
const port = Number(process.env.SPACE_GUEST_PORT || GUEST_PORT);
const userName = process.env.SPACE_GUEST_USER || 'user';
const passwd = readPasswd();
const selfUid = process.getuid?.() ?? 0;
const selfGid = process.getgid?.() ?? 0;
const privileged = selfUid === 0;

let user: Identity;
const found = passwd.get(userName);
const home = process.env.SPACE_GUEST_HOME || found?.home || '/home/user';
if (found) {
  user = { ...found, home };
} else {
  user = { name: userName, uid: selfUid, gid: selfGid, home, shell: '/bin/sh' };
  log('warn', 'user not found in /etc/passwd, running commands as the daemon uid', {
    user: userName,
    uid: selfUid,
  });
}
const root: Identity = passwd.get('root') ?? {
  name: 'root',
  uid: 0,
  gid: 0,
  home: '/root',
  shell: '/bin/sh',
};

try {
  const created = mkdirSync(home, { recursive: true, mode: 0o755 });
  if (created !== undefined && privileged) chownSync(home, user.uid, user.gid);
} catch (err) {
  log('warn', 'cannot create home', { home, ...errorFields(err) });
}

// The agent's secret arrives as a root-only file that is deleted once read: neither the process
// environment (readable in /proc) nor the filesystem keeps it for sandbox processes to find.
const tokenFile = process.env.SPACE_GUEST_TOKEN_FILE || '/opt/space/guest-token';
let token: string | null = null;
try {
  token = readFileSync(tokenFile, 'utf8').trim() || null;
  unlinkSync(tokenFile);
} catch (err) {
  log('warn', 'no guest token: every route is open to anyone who can connect', {
    tokenFile,
    ...errorFields(err),
  });
}

const app = createGuestApp({ user, root: { ...root, uid: 0, gid: 0 }, home, privileged, token });

process.on('uncaughtException', (err) => log('error', 'uncaught exception', errorFields(err)));
process.on('unhandledRejection', (err) => log('error', 'unhandled rejection', errorFields(err)));

for (const sig of ['SIGTERM', 'SIGINT'] as const) {
  process.once(sig, () => {
    log('info', 'shutting down', { signal: sig });
    const force = setTimeout(() => process.exit(0), 2000);
    force.unref();
    app.close().then(() => process.exit(0));
  });
}

// sudo where setuid cannot work (gVisor): only a root daemon can run commands as root
const sudoSocket = process.env.SPACE_GUEST_SUDO_SOCKET ?? SUDO_SOCKET;
if (privileged && sudoSocket) startSudoBroker(sudoSocket).unref();

app.server.on('error', (err) => {
  log('error', 'server error', errorFields(err));
  process.exit(1);
});
app.server.listen(port, host, () => {
  const addr = app.server.address();
  const bound = typeof addr === 'object' && addr ? addr.port : port;
  log('info', 'listening', { host, port: bound, user: user.name, uid: user.uid, home, privileged });
});
