/**
 * `space up`'s host side, before any service starts (the first run included): the tools and the
 * root it needs (searched on $PATH plus the system sbin/bin dirs, which children get too), free
 * ports (with a hint when an earlier `space up` still holds them), `$SPACE_HOME` with its key pair,
 * IPv4 forwarding, and the host resolver the local gateway asks. Refusals are the CLI's own
 * CliErrors (`PREREQUISITES`, `PORT_IN_USE`, and a usage error for ports that collide).
 */
import { createPublicKey } from 'node:crypto';
import {
  accessSync,
  chmodSync,
  constants,
  existsSync,
  mkdirSync,
  readFileSync,
  writeFileSync,
} from 'node:fs';
import { createServer } from 'node:net';
import { delimiter, join } from 'node:path';
import { isIPv4 } from '../core/net-address.ts';
import { type localPaths, readLocalState } from './local.ts';
import { CliError, note, usageError } from './output.ts';

/** The address every service of the local stack listens on. */
export const LOCAL_HOST = '127.0.0.1';
const HOST = LOCAL_HOST;

/** The host's first resolver (`/etc/resolv.conf`), as `ip:53`: what the local gateway asks. */
export function hostResolver(resolvConf: string): string {
  const first = [...resolvConf.matchAll(/^\s*nameserver\s+(\S+)\s*$/gm)].map((m) => m[1]).find(isIPv4);
  return `${first ?? '127.0.0.1'}:53`;
}

/** Directories searched besides $PATH (root's tools often live in sbin, absent from user PATHs). */
const EXTRA_DIRS = ['/usr/local/sbin', '/usr/local/bin', '/usr/sbin', '/usr/bin', '/sbin', '/bin'];

/** `$PATH` with the standard system dirs appended (children get this too). Pure. */
export function searchPath(pathEnv: string | undefined): string {
  const dirs = (pathEnv ?? '').split(delimiter).filter(Boolean);
  for (const d of EXTRA_DIRS) if (!dirs.includes(d)) dirs.push(d);
  return dirs.join(delimiter);
}

/** Absolute path of executable `name` on `pathEnv` (+ system dirs), or null. */
export function findExecutable(name: string, pathEnv = process.env['PATH']): string | null {
  for (const dir of searchPath(pathEnv).split(delimiter)) {
    const p = join(dir, name);
    try {
      accessSync(p, constants.X_OK);
      return p;
    } catch {
      // next
    }
  }
  return null;
}

/** Tools the local stack needs on the host. */
export function requiredTools(localRedis: boolean): string[] {
  return ['runsc', ...(localRedis ? ['redis-server'] : []), 'nft', 'ip', 'debootstrap', 'tini-static'];
}

/** Every missing prerequisite as a line (root, then tools). */
export function missingPrerequisites(
  localRedis: boolean,
  uid: number | undefined = process.getuid?.(),
  find: (name: string) => string | null = (n) => findExecutable(n),
): string[] {
  const missing: string[] = [];
  if (uid !== 0)
    missing.push('root (the agent creates network namespaces, nftables rules and gVisor sandboxes)');
  for (const tool of requiredTools(localRedis)) if (!find(tool)) missing.push(tool);
  return missing;
}

/** True when something already listens on `host:port`. */
export function portInUse(port: number, host = HOST): Promise<boolean> {
  return new Promise((resolve) => {
    const srv = createServer();
    srv.once('error', (err: NodeJS.ErrnoException) =>
      resolve(err.code === 'EADDRINUSE' || err.code === 'EACCES'),
    );
    srv.listen({ port, host, exclusive: true }, () => srv.close(() => resolve(false)));
  });
}

/** A TCP port free on 127.0.0.1 right now (the kernel picks it; another process may take it later). */
export function freeLoopbackPort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.once('error', reject);
    srv.listen(0, LOCAL_HOST, () => {
      const { port } = srv.address() as { port: number };
      srv.close(() => resolve(port));
    });
  });
}

/** Creates `$SPACE_HOME` (0700) and its dirs, and the Ed25519 key pair when missing. */
export async function prepareHome(paths: ReturnType<typeof localPaths>): Promise<void> {
  mkdirSync(paths.home, { recursive: true, mode: 0o700 });
  chmodSync(paths.home, 0o700);
  mkdirSync(paths.logs, { recursive: true, mode: 0o700 });
  mkdirSync(paths.redisDir, { recursive: true, mode: 0o700 });
  if (!existsSync(paths.signingKey)) {
    const { writeNewKeyPair } = await import('../core/tokens.ts');
    await writeNewKeyPair(paths.signingKey, paths.verifyKey);
    note(`space: created key pair ${paths.signingKey}`);
  } else if (!existsSync(paths.verifyKey)) {
    const pub = createPublicKey(readFileSync(paths.signingKey)).export({ type: 'spki', format: 'pem' });
    writeFileSync(paths.verifyKey, pub, { mode: 0o644 });
  }
}

/** Where the kernel keeps `net.ipv4.ip_forward` (every interface's IPv4 forwarding). */
const IP_FORWARD_PATH = '/proc/sys/net/ipv4/ip_forward';

/**
 * Turns IPv4 forwarding on, as the deployments' agent nodes have it: a sandbox's CIDR egress
 * rules need the uplink to forward their replies back to it (`space doctor`: ipv4-forwarding).
 * Already on: nothing is written. A host that refuses (no root, a read-only /proc/sys) gets a note
 * naming the sysctl; the stack still starts, without working CIDR rules. Never throws.
 */
export function enableIpv4Forwarding(): void {
  try {
    if (readFileSync(IP_FORWARD_PATH, 'utf8').trim() === '1') return;
    writeFileSync(IP_FORWARD_PATH, '1\n');
    note('space: IPv4 forwarding turned on (net.ipv4.ip_forward=1): CIDR egress rules need it');
  } catch (err) {
    note(
      `space: could not turn IPv4 forwarding on (${(err as Error).message}); CIDR egress rules need net.ipv4.ip_forward=1 (npx space doctor)`,
    );
  }
}

/**
 * Throws `PREREQUISITES` (with `details.missing`) unless this process is root and every tool of
 * {@link requiredTools} is found.
 */
export function checkPrerequisites(localRedis: boolean): void {
  const missing = missingPrerequisites(localRedis);
  if (missing.length) {
    throw new CliError('PREREQUISITES', `missing: ${missing.join(', ')}`, {
      details: { missing },
      hint: 'install the host packages with: bash scripts/host-deps.sh (as root), and run space up as root',
    });
  }
}

/**
 * Throws unless every `[what, port]` of `ports` is free on {@link LOCAL_HOST}: `USAGE` when two are
 * the same, `PORT_IN_USE` (with `details.ports`, and a hint from `home`'s local.json about an
 * earlier `space up`) when something listens on one.
 */
export async function checkPortsFree(ports: [string, number][], home: string): Promise<void> {
  if (new Set(ports.map(([, p]) => p)).size !== ports.length) throw usageError('the ports must differ');
  const busy: string[] = [];
  for (const [what, port] of ports) if (await portInUse(port)) busy.push(`${port} (${what})`);
  if (busy.length) {
    const prior = readLocalState(home);
    const running = prior?.pid && prior.pid !== process.pid && pidAlive(prior.pid);
    throw new CliError(
      'PORT_IN_USE',
      `port${busy.length > 1 ? 's' : ''} in use on ${HOST}: ${busy.join(', ')}`,
      {
        details: { ports: busy },
        hint: running
          ? `another \`space up\` seems to be running (pid ${prior.pid}); stop it first`
          : prior
            ? `a \`space up\` (pid ${prior.pid}) ended without stopping its services; stop them (the agent first: ` +
              `pkill -TERM -f runtime/agent/server.ts, then runtime/router/, runtime/api/ and runtime/gateway/, then redis-server), ` +
              'or pick other ports with --api-port / --agent-port'
            : 'stop what uses them, or pick others with --api-port / --agent-port',
      },
    );
  }
}

/** True when process `pid` exists (signal 0 reaches it). */
export function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}
