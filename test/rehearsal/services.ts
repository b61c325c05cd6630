/**
 * The host-side stand-ins the rehearsal's VMs reach, each a real server on the host's end of the
 * rehearsal network:
 * - an OCI registry (Debian's `docker-registry`, the CNCF distribution 2.8 server) over TLS with
 *   basic auth, serving the image `npm run image` built: the stand-in for ghcr.io or a cloud
 *   registry. Its certificate chains to the rehearsal CA, which the base images trust.
 * - an apt cache (Debian's `apt-cacher-ng`) in front of Debian's archive: the cloud's mirror.
 * Both write only under the rehearsal's work directory and stop with `stop()`.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { copyFile, mkdir, readFile, writeFile } from 'node:fs/promises';
import { connect } from 'node:net';
import { join } from 'node:path';
import { stringify } from 'yaml';
import { REHEARSAL_NET, run } from './host.ts';

/** A started server. */
export interface Service {
  readonly name: string;
  stop(): Promise<void>;
}

/** The rehearsal CA: a key and self-signed certificate kept in `cacheDir` (base images trust it). */
export interface RehearsalCa {
  readonly certFile: string;
  readonly keyFile: string;
  readonly certPem: string;
}

/** Loads the CA from `cacheDir/ca`, making it (EC P-256, 10 years) the first time. */
export async function rehearsalCa(cacheDir: string): Promise<RehearsalCa> {
  const dir = join(cacheDir, 'ca');
  const certFile = join(dir, 'ca.crt');
  const keyFile = join(dir, 'ca.key');
  if (!existsSync(certFile) || !existsSync(keyFile)) {
    await mkdir(dir, { recursive: true, mode: 0o700 });
    await run('openssl', [
      'req',
      '-x509',
      '-newkey',
      'ec',
      '-pkeyopt',
      'ec_paramgen_curve:P-256',
      '-nodes',
      '-keyout',
      keyFile,
      '-out',
      certFile,
      '-days',
      '3650',
      '-subj',
      '/CN=SPACE rehearsal CA',
      '-addext',
      'basicConstraints=critical,CA:TRUE',
      '-addext',
      'keyUsage=critical,keyCertSign,cRLSign',
    ]);
  }
  return { certFile, keyFile, certPem: await readFile(certFile, 'utf8') };
}

/** Resolves once `host:port` accepts a TCP connection; throws after `timeoutMs`. */
export async function waitForPort(host: string, port: number, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const ok = await new Promise<boolean>((resolve) => {
      const s = connect({ host, port }, () => {
        s.destroy();
        resolve(true);
      });
      s.on('error', () => resolve(false));
    });
    if (ok) return;
    if (Date.now() > deadline) throw new Error(`nothing listens on ${host}:${port} after ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

function started(name: string, child: ChildProcess): Service {
  return {
    name,
    stop: () =>
      new Promise<void>((resolve) => {
        if (child.exitCode !== null || child.signalCode !== null) return resolve();
        child.once('exit', () => resolve());
        child.kill('SIGTERM');
        setTimeout(() => child.kill('SIGKILL'), 5_000).unref();
      }),
  };
}

/**
 * Spawns `cmd args` as service `name` and resolves once `port` on the rehearsal's host address
 * accepts connections (15 s); otherwise kills it and throws with the tail of its stderr.
 */
async function spawnService(
  name: string,
  cmd: string,
  args: readonly string[],
  port: number,
): Promise<Service> {
  const child = spawn(cmd, [...args], { stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  child.stderr?.on('data', (d) => {
    stderr = (stderr + d).slice(-4000);
  });
  try {
    await waitForPort(REHEARSAL_NET.hostAddress, port, 15_000);
  } catch (err) {
    child.kill('SIGKILL');
    throw new Error(`${cmd} did not start: ${(err as Error).message}\n${stderr}`);
  }
  return started(name, child);
}

/** The registry: where it listens, the credentials it takes, the CA its certificate chains to. */
export interface Registry extends Service {
  /** `host:port`, what an image reference starts with. */
  readonly address: string;
  readonly username: string;
  readonly password: string;
  /** The registry's own directory (storage, certificate, htpasswd). */
  readonly workDir: string;
}

/**
 * Starts `docker-registry` on the host's rehearsal address with TLS (a certificate for that
 * address signed by `ca`) and htpasswd (bcrypt) auth for one random user. Storage under `workDir`.
 */
export async function startRegistry(workDir: string, ca: RehearsalCa): Promise<Registry> {
  const { hostAddress, registryPort } = REHEARSAL_NET;
  const dir = join(workDir, 'registry');
  await mkdir(join(dir, 'storage'), { recursive: true });
  const key = join(dir, 'tls.key');
  const csr = join(dir, 'tls.csr');
  const cert = join(dir, 'tls.crt');
  await run('openssl', [
    'req',
    '-newkey',
    'ec',
    '-pkeyopt',
    'ec_paramgen_curve:P-256',
    '-nodes',
    '-keyout',
    key,
    '-out',
    csr,
    '-subj',
    `/CN=${hostAddress}`,
  ]);
  const ext = join(dir, 'tls.ext');
  await writeFile(ext, `subjectAltName=IP:${hostAddress}\nextendedKeyUsage=serverAuth\n`);
  await run('openssl', [
    'x509',
    '-req',
    '-in',
    csr,
    '-CA',
    ca.certFile,
    '-CAkey',
    ca.keyFile,
    '-CAcreateserial',
    '-out',
    cert,
    '-days',
    '30',
    '-extfile',
    ext,
  ]);
  const username = 'rehearsal';
  const password = randomBytes(18).toString('base64url');
  const htpasswd = join(dir, 'htpasswd');
  await writeFile(htpasswd, await run('htpasswd', ['-Bbn', username, password]));
  const config = join(dir, 'config.yml');
  await writeFile(
    config,
    stringify({
      version: 0.1,
      log: { level: 'warn' },
      storage: { filesystem: { rootdirectory: join(dir, 'storage') } },
      http: { addr: `${hostAddress}:${registryPort}`, tls: { certificate: cert, key } },
      auth: { htpasswd: { realm: 'space-rehearsal', path: htpasswd } },
    }),
  );
  const service = await spawnService('registry', 'docker-registry', ['serve', config], registryPort);
  return {
    ...service,
    address: `${hostAddress}:${registryPort}`,
    username,
    password,
    workDir: dir,
  };
}

/**
 * Pushes the local image `source` (buildah's storage, e.g. `localhost/space:0.1.0`) to
 * `registry` as `repository:tag`, verifying the registry's certificate against the rehearsal CA.
 */
export async function pushImage(
  registry: Registry,
  ca: RehearsalCa,
  source: string,
  target: string,
): Promise<void> {
  // buildah reads every *.crt of --cert-dir as a CA, and pairs a *.key with a client certificate:
  // a directory of the CA certificate alone
  const certDir = join(registry.workDir, 'push-certs');
  await mkdir(certDir, { recursive: true });
  await copyFile(ca.certFile, join(certDir, 'ca.crt'));
  await run(
    'buildah',
    [
      'push',
      '--cert-dir',
      certDir,
      '--creds',
      `${registry.username}:${registry.password}`,
      source,
      `docker://${target}`,
    ],
    { timeoutMs: 900_000 },
  );
}

/**
 * Starts apt-cacher-ng on the host's rehearsal address in front of `mirror` (Debian's archive; its
 * security suite is taken from the same host), caching under `cacheDir` (kept between runs, so a
 * second rehearsal installs from disk). Its own configuration directory: the package's default
 * maps deb.debian.org to a mirror list whose first entry (ftp.debian.org) need not resolve here.
 */
export async function startAptCache(cacheDir: string, workDir: string, mirror: string): Promise<Service> {
  const { hostAddress, aptCachePort } = REHEARSAL_NET;
  const dir = join(workDir, 'apt-cacher-ng');
  const store = join(cacheDir, 'apt-cacher-ng');
  await mkdir(join(dir, 'log'), { recursive: true });
  await mkdir(store, { recursive: true });
  const archive = mirror.replace(/\/+$/, '');
  const security = archive.replace(/\/debian$/, '/debian-security');
  await writeFile(
    join(dir, 'acng.conf'),
    [
      `CacheDir: ${store}`,
      `LogDir: ${join(dir, 'log')}`,
      'SupportDir: /usr/lib/apt-cacher-ng',
      `Port: ${aptCachePort}`,
      `BindAddress: ${hostAddress}`,
      `Remap-debrep: deb.debian.org/debian ; ${archive}/`,
      `Remap-secdeb: deb.debian.org/debian-security security.debian.org/debian-security ; ${security}/`,
      'ExThreshold: 4',
      '',
    ].join('\n'),
  );
  return spawnService(
    'apt-cache',
    'apt-cacher-ng',
    ['-c', dir, 'ForeGround=1', 'PidFile=', 'SocketPath='],
    aptCachePort,
  );
}

/**
 * Makes the "new build" of a version bump from the local image `source`: one more layer that
 * stamps `version` into it (`SPACE_VERSION`, which every service reports: nodes in
 * `GET /v1/nodes`, the API and router in `GET /healthz`), committed as `localhost/space:<version>`.
 * Returns that reference. A real new image (its own digest), without a second full build.
 */
export async function stampedImage(source: string, version: string): Promise<string> {
  const ref = `localhost/space:${version}`;
  const cid = (await run('buildah', ['from', '--pull=never', source])).trim();
  try {
    await run('buildah', [
      'config',
      '--env',
      `SPACE_VERSION=${version}`,
      '--label',
      `org.opencontainers.image.version=${version}`,
      cid,
    ]);
    await run('buildah', ['commit', '--quiet', cid, ref], { timeoutMs: 900_000 });
  } finally {
    await run('buildah', ['rm', cid]).catch(() => undefined);
  }
  return ref;
}
