/**
 * The guest's side of `sudo` in sandboxes where setuid cannot work (runtime/core/sudo.ts): a Unix
 * socket that hands each connection, unread, to a python3 one-shot handler running as root (the
 * handler checks the caller and runs the command). Nothing runs until a request comes; the
 * connection's bytes and file descriptors are never read here (`pauseOnConnect`), so the handler
 * receives the caller's stdio intact.
 */
import { spawn } from 'node:child_process';
import { chmodSync, rmSync } from 'node:fs';
import { createServer, type Server } from 'node:net';
import { SUDO_GROUP, SUDO_HANDLER } from '../core/sudo.ts';
import { errorFields, log } from './log.ts';

/**
 * Listens on `path` (mode 0666: the handler decides by the caller's credentials) and serves sudo
 * requests until closed. Never throws: a socket that cannot be made is logged (sudo then says it
 * cannot reach the guest) and the daemon goes on.
 */
export function startSudoBroker(path: string, python = 'python3'): Server {
  const server = createServer({ pauseOnConnect: true }, (conn) => {
    const child = spawn(python, ['-c', SUDO_HANDLER, SUDO_GROUP], {
      stdio: ['ignore', 'ignore', 'pipe', conn],
    });
    let err = '';
    child.stderr?.on('data', (d: Buffer) => {
      err = (err + d.toString()).slice(-2000);
    });
    const done = () => conn.destroy();
    child.once('spawn', done); // the child holds its own copy of the connection
    child.once('error', (e) => {
      log('warn', 'sudo handler did not start', { python, ...errorFields(e) });
      done();
    });
    child.once('exit', (code) => {
      if (code !== 0) log('warn', 'sudo handler failed', { code, stderr: err });
    });
  });
  server.on('error', (e) => log('warn', 'sudo socket unavailable', { path, ...errorFields(e) }));
  rmSync(path, { force: true });
  server.listen(path, () => {
    try {
      chmodSync(path, 0o666);
    } catch (e) {
      log('warn', 'sudo socket mode not set', { path, ...errorFields(e) });
    }
  });
  return server;
}
