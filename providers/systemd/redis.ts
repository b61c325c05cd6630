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
 *
 * With several control VMs ({@link VmHa}) each runs a data server and a Redis Sentinel
 * (`space-sentinel`, the distribution's `redis-server --sentinel`, its own configuration in
 * {@link SENTINEL_CONF_FILE}, rewritten by Sentinel as it learns). Each start of a data server
 * asks the sentinels for the primary (the other control VMs' first: this VM's own may remember a
 * primary that has since been replaced) and starts as its replica, or as the primary when the
 * answer is this VM, or when none answers on a new deployment and this is the first control VM.
 */
import {
  REDIS_PERSISTENCE,
  REDIS_PORT,
  REDIS_PRIMARY_NAME,
  REDIS_REPLICATION,
  SENTINEL_PORT,
  SENTINEL_TIMING,
  sentinelQuorum,
} from '../runtime-settings.ts';
import { checkRedisPassword, SELF_ADDRESS, type VmFile, type VmHa } from './plan.ts';

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
export function redisConf(password: string, ha?: VmHa): string {
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
    // a replica authenticates to the primary with the same password; a primary cut off from every
    // replica stops taking writes (runtime-settings.ts REDIS_REPLICATION)
    ...(ha ? [`masterauth ${password}`, ...REDIS_REPLICATION.map(([k, v]) => `${k} ${v}`)] : []),
    '',
  ].join('\n');
}

/** Sentinel's configuration on a control VM: written by Sentinel itself after the first start. */
export const SENTINEL_CONF_FILE = '/var/lib/redis/sentinel.conf';
/** What the first start copies to {@link SENTINEL_CONF_FILE} (root-only: it holds the password). */
export const SENTINEL_TEMPLATE_FILE = '/etc/space/sentinel.conf';
/** The unit that runs the control VM's sentinel. */
export const SENTINEL_UNIT = 'space-sentinel.service';

/**
 * A control VM's first sentinel configuration: the primary it starts from (`ha.initialPrimary`),
 * a majority quorum of the control VMs, the password on both sides (data servers and other
 * sentinels), the failover timing of runtime-settings.ts. Pure.
 * @throws Error when `password` does not fit (see {@link checkRedisPassword}).
 */
export function sentinelConf(password: string, ha: VmHa): string {
  checkRedisPassword(password);
  const n = REDIS_PRIMARY_NAME;
  const t = SENTINEL_TIMING;
  return [
    '# rendered by providers/systemd/redis.ts; Sentinel rewrites this copy as it learns',
    `port ${SENTINEL_PORT}`,
    'daemonize no',
    'dir /var/lib/redis',
    'logfile ""',
    `requirepass ${password}`,
    `sentinel monitor ${n} ${ha.initialPrimary} ${REDIS_PORT} ${sentinelQuorum(ha.controlVms)}`,
    `sentinel auth-pass ${n} ${password}`,
    `sentinel down-after-milliseconds ${n} ${t.downAfterMs}`,
    `sentinel failover-timeout ${n} ${t.failoverTimeoutMs}`,
    `sentinel parallel-syncs ${n} ${t.parallelSyncs}`,
    '',
  ].join('\n');
}

/** The shell lines that set `ip4` to this VM's address in `privateCidr` (or exit 1: systemd retries). */
const privateAddress = (unitName: string, privateCidr: string) => [
  `ip4=$(ip -4 -o addr show to ${privateCidr} | sed -n "s/.* inet \\([0-9.]*\\)\\/.*/\\1/p" | head -n 1)`,
  `[ -n "$ip4" ] || { echo "${unitName}: no address in ${privateCidr} yet" >&2; exit 1; }`,
];

/**
 * Redis's configuration, its unit and its boot-time firewall guard, for a subnet of `privateCidr`.
 * Pure.
 */
export function redisFiles(a: {
  readonly privateCidr: string;
  readonly redisPassword: string;
  readonly ha?: VmHa;
}): VmFile[] {
  const { ha } = a;
  return [
    { path: REDIS_CONF_FILE, mode: '0600', content: redisConf(a.redisPassword, ha) },
    {
      path: '/usr/local/sbin/space-redis',
      mode: '0755',
      content: ha
        ? haRedisScript(a.privateCidr, ha)
        : [
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
        // this VM's sentinel is asked (after the others) which server is the primary
        ...(ha ? [`After=${SENTINEL_UNIT}`, `Wants=${SENTINEL_UNIT}`] : []),
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
        `    tcp dport ${ha ? `{ ${REDIS_PORT}, ${SENTINEL_PORT} }` : REDIS_PORT} ip saddr != { 127.0.0.0/8, ${a.privateCidr} } drop`,
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
        `Before=${REDIS_UNIT}${ha ? ` ${SENTINEL_UNIT}` : ''}`,
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
    ...(ha ? sentinelFiles(a.privateCidr, a.redisPassword, ha) : []),
  ];
}

/**
 * `space-redis` with several control VMs: ask the sentinels which server is the primary (the
 * other control VMs' first, then this VM's own, which may remember a primary since replaced),
 * else on a new deployment take the first control VM; start as the primary when that is this VM,
 * else as its replica. Runs as `redis`: the password comes from redis.conf, which it owns. Pure.
 */
function haRedisScript(privateCidr: string, ha: VmHa): string {
  return [
    '#!/bin/sh',
    "# runs Redis from /etc/space/redis.conf on loopback and this VM's private address only, as the",
    '# primary the sentinels name or as its replica',
    'set -eu',
    ...privateAddress('space-redis', privateCidr),
    `REDISCLI_AUTH=$(sed -n "s/^requirepass //p" ${REDIS_CONF_FILE})`,
    'export REDISCLI_AUTH',
    'primary=""',
    `for s in $(printf "%s\\n" ${ha.controlAddresses.join(' ')} | grep -vx "$ip4") 127.0.0.1; do`,
    `  primary=$(timeout 3 redis-cli -h "$s" -p ${SENTINEL_PORT} --raw SENTINEL get-master-addr-by-name ${REDIS_PRIMARY_NAME} 2>/dev/null | head -n 1) || primary=""`,
    '  [ -z "$primary" ] || break',
    'done',
    `[ -n "$primary" ] || primary=${ha.initialPrimary === SELF_ADDRESS ? '"$ip4"' : ha.initialPrimary}`,
    'echo "space-redis: $ip4 starts; primary $primary"',
    `[ "$primary" = "$ip4" ] && exec /usr/bin/redis-server ${REDIS_CONF_FILE} --bind 127.0.0.1 "$ip4"`,
    `exec /usr/bin/redis-server ${REDIS_CONF_FILE} --bind 127.0.0.1 "$ip4" --replicaof "$primary" ${REDIS_PORT}`,
    '',
  ].join('\n');
}

/**
 * The control VM's sentinel: its first configuration ({@link SENTINEL_TEMPLATE_FILE}), copied
 * once to {@link SENTINEL_CONF_FILE} (Sentinel needs a file it can rewrite; {@link SELF_ADDRESS}
 * becomes this VM's address), the start script
 * (loopback and the private address) and the unit. Pure.
 */
function sentinelFiles(privateCidr: string, password: string, ha: VmHa): VmFile[] {
  return [
    { path: SENTINEL_TEMPLATE_FILE, mode: '0600', content: sentinelConf(password, ha) },
    {
      path: '/usr/local/sbin/space-sentinel',
      mode: '0755',
      content: [
        '#!/bin/sh',
        "# runs this control VM's Redis Sentinel on loopback and its private address only",
        'set -eu',
        ...privateAddress('space-sentinel', privateCidr),
        // the first start: the template, with this VM's address where it names itself
        'umask 077',
        `if [ -e ${SENTINEL_CONF_FILE}.new ]; then sed "s/${SELF_ADDRESS}/$ip4/g" ${SENTINEL_CONF_FILE}.new > ${SENTINEL_CONF_FILE} && rm ${SENTINEL_CONF_FILE}.new; fi`,
        // the data server's binary in Sentinel mode (redis.io, "Running Sentinel"): no second
        // package, so no distribution unit starting an open sentinel of its own
        `exec /usr/bin/redis-server ${SENTINEL_CONF_FILE} --sentinel --bind 127.0.0.1 "$ip4"`,
        '',
      ].join('\n'),
    },
    {
      path: `/etc/systemd/system/${SENTINEL_UNIT}`,
      mode: '0644',
      content: [
        '[Unit]',
        'Description=SPACE: Redis Sentinel (elects and follows the primary of the control VMs)',
        'Wants=network-online.target',
        'After=network-online.target space-control-guard.service',
        'Requires=space-control-guard.service',
        '',
        '[Service]',
        'Type=simple',
        'User=redis',
        'Group=redis',
        // once: later starts keep what Sentinel wrote (the current primary, replicas, peers)
        `ExecStartPre=+/bin/sh -c '[ -e ${SENTINEL_CONF_FILE} ] || install -o redis -g redis -m 0600 ${SENTINEL_TEMPLATE_FILE} ${SENTINEL_CONF_FILE}.new'`,
        'ExecStart=/usr/local/sbin/space-sentinel',
        'Restart=always',
        'RestartSec=2',
        '',
        '[Install]',
        'WantedBy=multi-user.target',
        '',
      ].join('\n'),
    },
  ];
}
