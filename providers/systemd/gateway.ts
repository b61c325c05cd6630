/**
 * The egress gateway on an agent VM: its environment, the host firewall closing its ports to all
 * but sandbox interfaces, and its unit. Its CA is made on the node at first start (a CA key cannot
 * travel in user data), so in vm mode the per-deployment CA is per node.
 */
import {
  GATEWAY_CA_DIR,
  GATEWAY_RUN_DIR,
  gatewayEnvironment,
  gatewayGuardRuleset,
  SERVICE_COMMANDS,
} from '../runtime-settings.ts';
import { type AgentArgs, envFile, unit, type VmFile } from './plan.ts';

/**
 * The gateway's env (`space-gateway` in the VM configuration). Pure. It reads credential values
 * from the state of record itself (as the agent does): `SPACE_REDIS_URL` comes from
 * `REDIS_ENV_FILE`, since it carries the password.
 */
export function gatewayServiceEnv(a: Omit<AgentArgs, 'redisPassword'>): Record<string, string> {
  return {
    ...gatewayEnvironment({
      enabled: true,
      ...(a.gatewayUpstreamDns ? { upstreamDns: a.gatewayUpstreamDns } : {}),
      ...(a.gatewayDenyCidrs ? { denyCidrs: a.gatewayDenyCidrs } : {}),
      ...(a.gatewayEnv ? { env: a.gatewayEnv } : {}),
    }),
  };
}

/**
 * The gateway of an agent VM: its environment, the host firewall closing its ports (applied at
 * every boot, before the gateway), and its unit (root, no capabilities; the CA is made on first
 * start in `GATEWAY_CA_DIR`, which only it mounts read-write).
 */
export function gatewayFiles(env: Record<string, string>): VmFile[] {
  const mkdirs = `ExecStartPre=/bin/mkdir -p -m 0700 ${GATEWAY_RUN_DIR} ${GATEWAY_CA_DIR}`;
  return [
    { path: '/etc/space/space-gateway.env', mode: '0644', content: envFile(env) },
    { path: '/etc/space/gateway-guard.nft', mode: '0644', content: gatewayGuardRuleset() },
    {
      path: '/etc/systemd/system/space-gateway-guard.service',
      mode: '0644',
      content: [
        '[Unit]',
        'Description=SPACE gateway ports: only from sandbox interfaces',
        // nothing listens on these ports before the gateway starts
        'Before=space-gateway.service',
        '',
        '[Service]',
        'Type=oneshot',
        'RemainAfterExit=yes',
        'ExecStart=/usr/sbin/nft -f /etc/space/gateway-guard.nft',
        '',
        '[Install]',
        'WantedBy=multi-user.target',
        '',
      ].join('\n'),
    },
    unit(
      'space-gateway',
      'SPACE egress gateway',
      SERVICE_COMMANDS.gateway,
      [
        `-v ${GATEWAY_RUN_DIR}:${GATEWAY_RUN_DIR}`,
        `-v ${GATEWAY_CA_DIR}:${GATEWAY_CA_DIR}`,
        '--cap-drop all',
        '--security-opt no-new-privileges',
      ],
      ['After=space-gateway-guard.service', 'Requires=space-gateway-guard.service'],
      [mkdirs],
    ),
  ];
}
