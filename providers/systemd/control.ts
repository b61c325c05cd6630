/**
 * The control VM: Redis, the API (with its key pair) and the router, and with ACME its own TLS.
 * Each service renders in its own module (redis.ts, api.ts, router.ts, acme.ts); this composes
 * them into the VM's plan and its services' env.
 */
import { KEY_DIR, TLS_DIR } from '../runtime-settings.ts';
import { acmeFiles } from './acme.ts';
import { apiKeyFiles, apiServiceEnv, apiUnit, type VmTls } from './api.ts';
import { BACKUP_TIMER, backupFiles } from './backup.ts';
import {
  type ControlArgs,
  envFile,
  imageFile,
  PODMAN_PULL,
  redisClientFiles,
  redisReadCli,
  redisReadFile,
  registryAuthVmFile,
  type SyncedService,
  upgradeScript,
  type VmPlan,
  type VmServiceEnv,
} from './plan.ts';
import { REDIS_UNIT, redisFiles, SENTINEL_UNIT } from './redis.ts';
import { routerServiceEnv, routerUnit } from './router.ts';
import { configSyncFiles, versionSyncFiles } from './sync.ts';

/** The control VM's services: API, router, and with {@link ControlArgs.acme} the TLS unit. Pure. */
export function controlServiceEnv(a: Omit<ControlArgs, 'redisPassword'>): VmServiceEnv {
  return {
    'space-api': apiServiceEnv(a),
    // the router: Redis (REDIS_ENV_FILE) and the verify key the control VM made (space-keys), nothing else
    'space-router': routerServiceEnv(),
    ...(a.acme
      ? {
          'space-tls': {
            // always present (maybe empty): an empty file would read as "no configuration"
            SPACE_TLS_HOSTNAMES: a.acme.hostnames.join(','),
            SPACE_ACME_EMAIL: a.acme.email,
            SPACE_ACME_SERVER: a.acme.server,
          },
        }
      : {}),
  };
}

/**
 * The signing key of a control VM among several ({@link ControlArgs.self}). @throws Error when it
 * is missing (the stacks always pass it with `ha`).
 */
function haSigningKey(a: ControlArgs): string {
  if (!a.self) throw new Error('a control VM among several needs its address and the shared signing key');
  return a.self.signingKey;
}

/**
 * The control VM: Redis on the private network, the API, its own key pair. With
 * {@link ControlArgs.ha}, one of several: its Redis a primary or replica, a sentinel beside it,
 * the key pair they share, reads from any of them. With `backup`, the backup timer.
 */
export function controlPlan(a: ControlArgs): VmPlan {
  const env = controlServiceEnv(a);
  const synced: SyncedService[] = [
    // TLS first: a new certificate or name set is in place before the API and router restart
    ...(a.acme ? [{ service: 'space-tls', file: '/etc/space/space-tls.env', unit: 'space-tls' }] : []),
    { service: 'space-api', file: '/etc/space/space-api.env', unit: 'space-api' },
    { service: 'space-router', file: '/etc/space/space-router.env', unit: 'space-router' },
  ];
  // with ACME, the API and the router read their TLS settings from a second env file the
  // `space-tls` unit writes once a certificate exists (empty until then: they serve plain HTTP)
  const tls = (unit: string): VmTls => ({
    serve: a.acme ? [`-v ${TLS_DIR}:${TLS_DIR}:ro`, `--env-file /etc/space/${unit}.tls.env`] : [],
    pre: a.acme
      ? [`ExecStartPre=/bin/sh -c 'mkdir -p -m 0700 ${TLS_DIR} && touch /etc/space/${unit}.tls.env'`]
      : [],
  });
  return {
    packages: ['podman', 'redis-server', 'openssl', 'nftables', ...(a.acme ? ['certbot'] : [])],
    files: [
      imageFile(a),
      registryAuthVmFile(a),
      ...synced.map((x) => ({ path: x.file, mode: '0644', content: envFile(env[x.service]!) })),
      ...redisFiles(a),
      // several control VMs: the sentinels (this VM's first), and reads from any control VM's Redis
      ...redisClientFiles('127.0.0.1', a.redisPassword, a.ha, '127.0.0.1'),
      ...(a.ha ? [redisReadFile(a.ha, '127.0.0.1')] : []),
      ...apiKeyFiles(a.ha ? haSigningKey(a) : undefined),
      apiUnit(tls('space-api')),
      routerUnit(tls('space-router')),
      ...(a.acme ? acmeFiles() : []),
      ...(a.backup ? backupFiles(a.backup) : []),
      upgradeScript(a, ['space-router', 'space-api']),
      // several control VMs: each moves at a random moment within five minutes, so an upgrade
      // does not restart every API and router at once (the load balancer keeps the others)
      ...versionSyncFiles(redisReadCli('127.0.0.1', a.ha), a.ha ? 300 : 0),
      ...configSyncFiles(redisReadCli('127.0.0.1', a.ha), synced, env),
    ],
    commands: [
      `mkdir -p /var/lib/space/api ${KEY_DIR}`,
      // the package's own unit (open, no password, its distribution's config) never runs: SPACE's does
      'systemctl disable --now redis-server.service || true',
      'systemctl mask redis-server.service',
      'systemctl daemon-reload',
      `systemctl enable --now space-control-guard.service ${a.ha ? `${SENTINEL_UNIT} ` : ''}${REDIS_UNIT}`,
      `${PODMAN_PULL} "$(sed -n "s/^SPACE_IMAGE=//p" /etc/space/image.env)"`,
      ...(a.acme
        ? [
            `mkdir -p -m 0700 ${TLS_DIR}`,
            'touch /etc/space/space-api.tls.env /etc/space/space-router.tls.env',
          ]
        : []),
      'systemctl enable --now space-keys.service space-api.service space-router.service space-version-sync.timer space-config-sync.timer',
      ...(a.backup ? [`systemctl enable --now ${BACKUP_TIMER}`] : []),
      // not --now: a first certificate can fail (names not pointed yet) and a failed start would
      // stop this script before it marks the VM provisioned; the unit retries on its own
      ...(a.acme
        ? ['systemctl enable space-tls.service', 'systemctl start --no-block space-tls.service']
        : []),
    ],
  };
}
