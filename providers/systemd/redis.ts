/**
 * Redis on the control VM, the state of record: its configuration (private network only, AOF
 * persistence) and the nftables guard that admits only loopback and the VPC subnet, applied at
 * every boot before Redis listens.
 */
import { REDIS_PERSISTENCE, REDIS_PORT } from '../runtime-settings.ts';
import type { VmFile } from './plan.ts';

/** Redis's configuration and its boot-time firewall guard, for a subnet of `privateCidr`. Pure. */
export function redisFiles(a: { readonly privateCidr: string }): VmFile[] {
  return [
    {
      path: '/etc/redis/redis.conf.d/space.conf',
      mode: '0644',
      content: [
        `port ${REDIS_PORT}`,
        // the agents reach Redis over the private network; nftables and the cloud firewall close it otherwise
        'bind 0.0.0.0',
        'protected-mode no',
        ...REDIS_PERSISTENCE.map(([k, v]) => `${k} ${v}`),
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
        'Before=redis-server.service',
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
