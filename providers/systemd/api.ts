/**
 * The API on the control VM: its environment, the key pair it makes at first boot (the private key
 * never leaves the VM; the public key is published in Redis for the agents and the router) and
 * its podman unit.
 */
import {
  apiEnvironment,
  KEY_DIR,
  REDIS_PORT,
  REDIS_PRIMARY_NAME,
  SENTINEL_PORT,
  SERVICE_COMMANDS,
  SIGNING_KEY_FILE,
  VERIFY_KEY_FILE,
} from '../runtime-settings.ts';
import { type ControlArgs, REDIS_CLI_AUTH, unit, VERIFY_KEY_REDIS_KEY, type VmFile } from './plan.ts';
import { REDIS_UNIT } from './redis.ts';

/** How a control-VM service serves TLS (ACME): its podman arguments and `ExecStartPre` lines. */
export interface VmTls {
  readonly serve: string[];
  readonly pre: string[];
}

/** The API's env (`space-api` in the VM configuration). Pure. */
export function apiServiceEnv(a: Omit<ControlArgs, 'redisPassword'>): Record<string, string> {
  // SPACE_REDIS_URL is not here: it carries the password (REDIS_ENV_FILE, read by every unit)
  return {
    ...apiEnvironment(a.apiEnv, { routerUrl: a.routerUrl, replicatedRedis: !!a.ha }),
    ...(a.bootstrapKeySha256 ? { SPACE_BOOTSTRAP_API_KEY_SHA256: a.bootstrapKeySha256 } : {}),
  };
}

/**
 * `space-keys`: makes the API key pair once and publishes the public key in Redis. Pure. With
 * `signingKey` (several control VMs: one key for all, PKCS#8 PEM, a secret) the private key is
 * that one, written root-only, and the public key is published to the primary the local sentinel
 * names (a replica refuses writes).
 */
export function apiKeyFiles(signingKey?: string): VmFile[] {
  const publish = signingKey
    ? [
        // the primary may be on another control VM, and may still be being elected
        `until p=$(redis-cli -p ${SENTINEL_PORT} --raw SENTINEL get-master-addr-by-name ${REDIS_PRIMARY_NAME} 2>/dev/null | head -n 1) && [ -n "$p" ] && redis-cli -h "$p" -p ${REDIS_PORT} -x SET ${VERIFY_KEY_REDIS_KEY} < ${VERIFY_KEY_FILE} | grep -q OK; do sleep 2; done`,
      ]
    : [
        `until redis-cli -p ${REDIS_PORT} ping >/dev/null 2>&1; do sleep 1; done`,
        `redis-cli -p ${REDIS_PORT} -x SET ${VERIFY_KEY_REDIS_KEY} < ${VERIFY_KEY_FILE} >/dev/null`,
      ];
  return [
    ...(signingKey ? [{ path: SIGNING_KEY_FILE, mode: '0600', content: signingKey }] : []),
    {
      path: '/usr/local/sbin/space-keys',
      mode: '0755',
      content: [
        '#!/bin/sh',
        signingKey
          ? "# the control VMs' one API key pair (the private key from the user data) and its public key published"
          : '# makes the API key pair once (the private key never leaves this VM) and publishes the public key',
        'set -eu',
        `mkdir -p -m 0700 ${KEY_DIR}`,
        `[ -s ${SIGNING_KEY_FILE} ] || openssl genpkey -algorithm ed25519 -out ${SIGNING_KEY_FILE}`,
        `chmod 0600 ${SIGNING_KEY_FILE}`,
        `openssl pkey -in ${SIGNING_KEY_FILE} -pubout -out ${VERIFY_KEY_FILE}`,
        REDIS_CLI_AUTH,
        ...publish,
        '',
      ].join('\n'),
    },
    {
      path: '/etc/systemd/system/space-keys.service',
      mode: '0644',
      content: [
        '[Unit]',
        'Description=SPACE API key pair',
        `After=${REDIS_UNIT}`,
        `Requires=${REDIS_UNIT}`,
        '',
        '[Service]',
        'Type=oneshot',
        'RemainAfterExit=yes',
        'ExecStart=/usr/local/sbin/space-keys',
        '',
        '[Install]',
        'WantedBy=multi-user.target',
        '',
      ].join('\n'),
    },
  ];
}

/** The API's podman unit. Pure. */
export function apiUnit(tls: VmTls): VmFile {
  return unit(
    'space-api',
    'SPACE API',
    SERVICE_COMMANDS.api,
    [`-v ${KEY_DIR}:${KEY_DIR}:ro`, `-v /var/lib/space/api:/var/lib/space/api`, ...tls.serve],
    [`After=space-keys.service ${REDIS_UNIT}`, 'Requires=space-keys.service'],
    tls.pre,
  );
}
