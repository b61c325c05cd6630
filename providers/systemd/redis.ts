/**
 * Redis on the control VM, the state of record. SPACE writes its whole configuration
 * ({@link REDIS_CONF_FILE}) and runs it from its own unit (`space-redis`), so nothing depends on
 * the distribution's `redis.conf` or its quirks: Redis 6.0 (Ubuntu 22.04, Debian 11) reads an
 * `include` with a glob as a literal path and exits, which stopped the whole control VM. The
 * distribution's `redis-server` unit is stopped and masked; only its binary is used.
 *
 * Locked down three ways: a password (`requirepass`), listening on loopback and the VM's private
 * address only (`bind`, found at every start), and the nftables guard that admits only loopback and
 * the VPC subnet, applied at every boot before Redis listens.
 */
import { REDIS_PERSISTENCE, REDIS_PORT } from '../runtime-settings.ts';
import { checkRedisPassword, type VmFile } from './plan.ts';

/** The only configuration the control VM's Redis reads (mode 0600, handed to `redis` at each start). */
export const REDIS_CONF_FILE = '/etc/space/redis.conf';
/** The unit that runs Redis on the control VM. */
export const REDIS_UNIT = 'space-redis.service';

/**
 * The complete redis.conf of the control VM (no `include`): port, password, protected mode,
 * foreground under systemd, data in the distribution's `/var/lib/redis`, persistence. The private
 * address is added on the command line at each start (`--bind`), since the cloud may assign it.
 * Pure. @throws Error when `password` does not fit (see {@link checkRedisPassword}).
 */
export function redisConf(password: string): string {
  checkRedisPassword(password);
  return [
    '# rendered by providers/systemd/redis.ts: the whole configuration, no include, no distribution defaults',
    `port ${REDIS_PORT}`,
    // loopback here; the unit adds the private address (--bind on the command line replaces this)
    'bind 127.0.0.1',
    'protected-mode yes',
    `requirepass ${password}`,
    'daemonize no',
    'supervised no',
    'dir /var/lib/redis',
    'logfile ""',
    ...REDIS_PERSISTENCE.map(([k, v]) => `${k} ${v}`),
    '',
  ].join('\n');
}

/**
 * Redis's configuration, its unit and its boot-time firewall guard, for a subnet of `privateCidr`.
 * Pure.
 */
export function redisFiles(a: { readonly privateCidr: string; readonly redisPassword: string }): VmFile[] {
  return [
    { path: REDIS_CONF_FILE, mode: '0600', content: redisConf(a.redisPassword) },
    {
      path: '/usr/local/sbin/space-redis',
      mode: '0755',
      content: [
        '#!/bin/sh',
        "# runs Redis from /etc/space/redis.conf on loopback and this VM's private address only",
        'set -eu',
        `ip4=$(ip -4 -o addr show to ${a.privateCidr} | sed -n "s/.* inet \\([0-9.]*\\)\\/.*/\\1/p" | head -n 1)`,
        // systemd restarts the unit until the private interface has its address
        `[ -n "$ip4" ] || { echo "space-redis: no address in ${a.privateCidr} yet" >&2; exit 1; }`,
        `exec /usr/bin/redis-server ${REDIS_CONF_FILE} --bind 127.0.0.1 "$ip4"`,
        '',
      ].join('\n'),
    },
    {
      path: `/etc/systemd/system/${REDIS_UNIT}`,
      mode: '0644',
      content: [
        '[Unit]',
        'Description=SPACE: Redis, the state of record (password, private address and loopback only)',
        'Wants=network-online.target',
        'After=network-online.target space-control-guard.service',
        'Requires=space-control-guard.service',
        '',
        '[Service]',
        'Type=simple',
        'User=redis',
        'Group=redis',
        // '+': as root, so the file can stay root-only in between
        `ExecStartPre=+/bin/chown redis:redis ${REDIS_CONF_FILE}`,
        'ExecStart=/usr/local/sbin/space-redis',
        'Restart=always',
        'RestartSec=2',
        'LimitNOFILE=65535',
        '',
        '[Install]',
        'WantedBy=multi-user.target',
        '',
      ].join('\n'),
    },
    {
      path: '/etc/nftables.d/space-control.nft',
      mode: '0644',
      content: [
        // idempotent: `nft -f` replaces the table instead of adding a second copy of the rule
        'table inet space_control',
        'delete table inet space_control',
        'table inet space_control {',
        '  chain input {',
        '    type filter hook input priority 0; policy accept;',
        `    tcp dport ${REDIS_PORT} ip saddr != { 127.0.0.0/8, ${a.privateCidr} } drop`,
        '  }',
        '}',
        '',
      ].join('\n'),
    },
    {
      // nftables tables vanish at reboot and runcmd / a guarded startup script runs once: the
      // guard is a boot unit, ordered before Redis listens
      path: '/etc/systemd/system/space-control-guard.service',
      mode: '0644',
      content: [
        '[Unit]',
        'Description=SPACE control VM: Redis only from loopback and the private network',
        `Before=${REDIS_UNIT}`,
        '',
        '[Service]',
        'Type=oneshot',
        'RemainAfterExit=yes',
        'ExecStart=/usr/sbin/nft -f /etc/nftables.d/space-control.nft',
        '',
        '[Install]',
        'WantedBy=multi-user.target',
        '',
      ].join('\n'),
    },
  ];
}
