/**
 * How a VM follows the deployment after its first boot, without SSH: timers that read the target
 * version and the VM configuration from Redis and apply them (the same on control and agent VMs).
 */
import {
  DEPLOY_TARGET_VERSION_KEY,
  DEPLOY_VM_CONFIG_KEY,
  VERSION_TAG,
} from '../../runtime/core/redis-keys.ts';
import { REDIS_PORT } from '../runtime-settings.ts';
import { REDIS_CLI_AUTH, type SyncedService, type VmFile } from './plan.ts';

/**
 * In-place upgrades without SSH: a timer on every VM reads the deployment's target version from
 * Redis ({@link DEPLOY_TARGET_VERSION_KEY}, set through the API's `PUT /v1/deployment/target-version`)
 * and, when it differs from the tag in `/etc/space/image.env`, runs `space-upgrade` (pull, rewrite,
 * restart). A value that is not an image tag is refused. Agent VMs wait a random delay (up to
 * `spreadSec`) so that nodes do not all restart at once; sandboxes survive either way (the agent
 * keeps them and re-adopts). The VM pulls only its own repository: the key chooses a tag, never
 * an image.
 */
export function versionSyncFiles(redisHost: string, spreadSec: number): VmFile[] {
  return [
    {
      path: '/usr/local/sbin/space-version-sync',
      mode: '0755',
      content: [
        '#!/bin/sh',
        '# upgrades this VM in place to the deployment target version in Redis (no SSH needed)',
        'set -eu',
        REDIS_CLI_AUTH,
        `v=$(redis-cli -h ${redisHost} -p ${REDIS_PORT} --raw GET ${DEPLOY_TARGET_VERSION_KEY} 2>/dev/null || true)`,
        '[ -n "$v" ] || exit 0',
        `printf "%s" "$v" | grep -Eq '${VERSION_TAG.source}' || { echo "space-version-sync: refusing target $v" >&2; exit 1; }`,
        // the tag after the image reference's last colon
        'cur=$(sed -n "s/^SPACE_IMAGE=.*://p" /etc/space/image.env)',
        '[ "$v" = "$cur" ] && exit 0',
        'echo "space-version-sync: $cur -> $v"',
        'exec /usr/local/sbin/space-upgrade "$v"',
        '',
      ].join('\n'),
    },
    {
      path: '/etc/systemd/system/space-version-sync.service',
      mode: '0644',
      content: [
        '[Unit]',
        'Description=SPACE: move to the deployment target version',
        'Wants=network-online.target',
        'After=network-online.target',
        '',
        '[Service]',
        'Type=oneshot',
        'ExecStart=/usr/local/sbin/space-version-sync',
        '',
      ].join('\n'),
    },
    {
      path: '/etc/systemd/system/space-version-sync.timer',
      mode: '0644',
      content: [
        '[Unit]',
        'Description=SPACE: check the deployment target version every minute',
        '',
        '[Timer]',
        'OnBootSec=2min',
        'OnUnitInactiveSec=1min',
        `RandomizedDelaySec=${spreadSec}`,
        '',
        '[Install]',
        'WantedBy=timers.target',
        '',
      ].join('\n'),
    },
  ];
}

/**
 * Configuration changes without SSH: a timer on every VM reads the deployment's VM configuration
 * from Redis ({@link DEPLOY_VM_CONFIG_KEY}, written by `pulumi up` through
 * `PUT /v1/deployment/vm-config`) once a minute and, for each of this VM's services whose field
 * differs from its env file, replaces the file and restarts that unit only. A field that is absent
 * leaves the file as it is; a value that is not an env file (every line `NAME=value`) is refused.
 * `services` are applied in order (TLS before the API; the gateway before the agent).
 */
export function configSyncFiles(redisHost: string, services: readonly SyncedService[]): VmFile[] {
  return [
    {
      path: '/usr/local/sbin/space-config-sync',
      mode: '0755',
      content: [
        '#!/bin/sh',
        '# applies the deployment VM configuration in Redis: a changed env file is replaced and its unit restarted',
        'set -u',
        REDIS_CLI_AUTH,
        'rc=0',
        '# apply <service> <env file> <unit>',
        'apply() {',
        `  v=$(redis-cli -h ${redisHost} -p ${REDIS_PORT} --raw HGET ${DEPLOY_VM_CONFIG_KEY} "$1") || { echo "space-config-sync: Redis unreachable" >&2; exit 1; }`,
        '  [ -n "$v" ] || return 0',
        `  printf '%s\\n' "$v" > "$2.sync"`,
        `  if grep -Evq '^[A-Za-z_][A-Za-z0-9_]*=' "$2.sync"; then`,
        '    echo "space-config-sync: refusing $1: not an env file" >&2',
        '    rm -f "$2.sync"; rc=1; return 0',
        '  fi',
        '  if cmp -s "$2.sync" "$2"; then rm -f "$2.sync"; return 0; fi',
        '  mv "$2.sync" "$2"',
        '  echo "space-config-sync: $1 changed; restarting $3"',
        '  systemctl restart "$3" || rc=1',
        '}',
        ...services.map((x) => `apply ${x.service} ${x.file} ${x.unit}`),
        'exit $rc',
        '',
      ].join('\n'),
    },
    {
      path: '/etc/systemd/system/space-config-sync.service',
      mode: '0644',
      content: [
        '[Unit]',
        'Description=SPACE: apply the deployment VM configuration',
        'Wants=network-online.target',
        'After=network-online.target',
        '',
        '[Service]',
        'Type=oneshot',
        'ExecStart=/usr/local/sbin/space-config-sync',
        '',
      ].join('\n'),
    },
    {
      path: '/etc/systemd/system/space-config-sync.timer',
      mode: '0644',
      content: [
        '[Unit]',
        'Description=SPACE: check the deployment VM configuration every minute',
        '',
        '[Timer]',
        'OnBootSec=1min',
        'OnUnitInactiveSec=1min',
        '',
        '[Install]',
        'WantedBy=timers.target',
        '',
      ].join('\n'),
    },
  ];
}
