/**
 * An agent VM of a node pool: the node agent (its identity and the verify key fetched at boot, its
 * privileged podman unit) beside its egress gateway (gateway.ts) unless disabled.
 */
import {
  AGENT_PORT,
  AGENT_STATE_DIR,
  agentEnvironment,
  CACHE_DIR,
  DEFAULT_AGENT_DRAIN_SECONDS,
  GATEWAY_CA_CERT_FILE,
  GATEWAY_CA_DIR,
  GATEWAY_CONTROL_SOCKET,
  GATEWAY_RUN_DIR,
  KEY_DIR,
  SERVICE_COMMANDS,
  VERIFY_KEY_FILE,
} from '../runtime-settings.ts';
import { gatewayFiles, gatewayServiceEnv } from './gateway.ts';
import { IP_FORWARDING } from './ip-forwarding.ts';
import {
  type AgentArgs,
  envFile,
  imageFile,
  PODMAN_PULL,
  REDIS_CLI_AUTH,
  redisClientFiles,
  redisReadCli,
  redisReadFile,
  registryAuthVmFile,
  type SyncedService,
  unit,
  upgradeScript,
  VERIFY_KEY_REDIS_KEY,
  type VmPlan,
  type VmServiceEnv,
} from './plan.ts';
import { configSyncFiles, versionSyncFiles } from './sync.ts';

/** The VM service name of the agent of `pool` (agents of different pools differ: driver, labels). */
export const agentService = (pool: string) => `space-agent@${pool}`;

/** A node VM's services: the gateway (unless disabled) and the agent of its pool. Pure. */
export function agentServiceEnv(a: Omit<AgentArgs, 'redisPassword'>): VmServiceEnv {
  const gw = a.gatewayEnabled ?? true;
  // SPACE_REDIS_URL is in no service's env: it carries the password (REDIS_ENV_FILE)
  return {
    ...(gw ? { 'space-gateway': gatewayServiceEnv(a) } : {}),
    [agentService(a.pool.name)]: {
      ...agentEnvironment(a.pool, a.agentEnv, { enabled: gw }),
      // a node drained through the control plane (`space nodes drain`) that the cloud then shuts
      // down: its agent waits this long for the sandboxes before it stops (its unit allows for it)
      SPACE_DRAIN_WAIT_MS: String(drainSeconds(a) * 1000),
    },
  };
}

/** The stack's agent drain wait, s. */
const drainSeconds = (a: Pick<AgentArgs, 'agentDrainSeconds'>) =>
  a.agentDrainSeconds ?? DEFAULT_AGENT_DRAIN_SECONDS;

/** An agent VM of `pool`: the verify key from the control VM, then the agent (and gateway). */
export function agentPlan(a: AgentArgs): VmPlan {
  const gw = a.gatewayEnabled ?? true;
  const services = agentServiceEnv(a);
  const env = services[agentService(a.pool.name)]!;
  const synced: SyncedService[] = [
    // the gateway first: its restart restarts the agent too (PartOf)
    ...(gw
      ? [{ service: 'space-gateway', file: '/etc/space/space-gateway.env', unit: 'space-gateway' }]
      : []),
    { service: agentService(a.pool.name), file: '/etc/space/space-agent.env', unit: 'space-agent' },
  ];
  // the gateway first: restarting it restarts the agent too (PartOf), which re-registers its sandboxes
  const units = [...(gw ? ['space-gateway'] : []), 'space-agent'];
  // reads (the verify key, the target version, the VM configuration): the control VM's Redis, or
  // with several control VMs any of theirs
  const read = redisReadCli(a.controlAddress, a.ha);
  const agentMounts = [
    `-v ${KEY_DIR}:${KEY_DIR}:ro`,
    `-v ${CACHE_DIR}:${CACHE_DIR}`,
    '-v /var/run/netns:/var/run/netns:rshared',
    '-v /sys/fs/cgroup:/sys/fs/cgroup',
    '-v /lib/modules:/lib/modules:ro',
    '-v /dev:/dev',
    '--privileged',
    '--pid host',
    '--cgroupns host',
    // podman's own cgroup for the container, as the kubelet gives the agent's pod: podman refuses
    // `--cgroups disabled` beside `--pid host` ("containers not creating CGroups must create a
    // private PID namespace", podman 4.3 on Debian 12, found by `npm run rehearse`: the agent
    // exited 125 at every start). Sandboxes leave it for their own `/space/<id>` cgroups.
    ...(gw
      ? [
          `-v ${GATEWAY_RUN_DIR}:${GATEWAY_RUN_DIR}`,
          // the CA certificate only: the key stays in the gateway's directory
          `-v ${GATEWAY_CA_CERT_FILE}:${GATEWAY_CA_CERT_FILE}:ro`,
        ]
      : []),
  ];
  return {
    packages: ['podman', 'redis-tools', 'nftables'],
    files: [
      imageFile(a),
      registryAuthVmFile(a),
      ...redisClientFiles(a.controlAddress, a.redisPassword, a.ha),
      ...(a.ha ? [redisReadFile(a.ha)] : []),
      IP_FORWARDING.file,
      { path: '/etc/space/space-agent.env', mode: '0644', content: envFile(env) },
      {
        path: '/usr/local/sbin/space-node-env',
        mode: '0755',
        content: [
          '#!/bin/sh',
          '# node id and the agent URL: its address on the private network (the router and the API',
          '# reach agents there; clients never do)',
          'set -eu',
          `ip4=$(ip -4 -o addr show to ${a.privateCidr} | sed -n "s/.* inet \\([0-9.]*\\)\\/.*/\\1/p" | head -n 1)`,
          `[ -n "$ip4" ] || { echo "space-node-env: no address in ${a.privateCidr}" >&2; exit 1; }`,
          `printf "SPACE_NODE_ID=%s\\nSPACE_AGENT_URL=http://%s:${AGENT_PORT}\\n" "$(hostname)" "$ip4" > /etc/space/space-agent.node.env`,
          REDIS_CLI_AUTH,
          `until ${read} --raw GET ${VERIFY_KEY_REDIS_KEY} | grep -q "BEGIN PUBLIC KEY"; do sleep 2; done`,
          `${read} --raw GET ${VERIFY_KEY_REDIS_KEY} > ${VERIFY_KEY_FILE}.tmp`,
          `mv ${VERIFY_KEY_FILE}.tmp ${VERIFY_KEY_FILE}`,
          '',
        ].join('\n'),
      },
      {
        path: '/etc/systemd/system/space-node-env.service',
        mode: '0644',
        content: [
          '[Unit]',
          'Description=SPACE node identity and verify key',
          'Wants=network-online.target',
          'After=network-online.target',
          '',
          '[Service]',
          'Type=oneshot',
          'RemainAfterExit=yes',
          'ExecStart=/usr/local/sbin/space-node-env',
          '',
          '[Install]',
          'WantedBy=multi-user.target',
          '',
        ].join('\n'),
      },
      unit(
        'space-agent',
        `SPACE node agent (pool ${a.pool.name}, driver ${a.pool.driver})`,
        SERVICE_COMMANDS.agent,
        [...agentMounts, '--env-file /etc/space/space-agent.node.env'],
        [
          'After=space-node-env.service',
          'Requires=space-node-env.service',
          ...(gw
            ? ['After=space-gateway.service', 'Wants=space-gateway.service', 'PartOf=space-gateway.service']
            : []),
        ],
        gw
          ? [
              // re-adoption registers every sandbox with the gateway: wait until it answers
              `ExecStartPre=/bin/sh -c 'until [ -S ${GATEWAY_CONTROL_SOCKET} ] && [ -s ${GATEWAY_CA_CERT_FILE} ]; do sleep 1; done'`,
            ]
          : [],
        // the drain wait, then 30 s to stop (as the Kubernetes pod's grace period)
        drainSeconds(a) + 30,
      ),
      ...(gw ? gatewayFiles(services['space-gateway']!) : []),
      upgradeScript(a, units),
      // nodes spread their restarts over five minutes
      ...versionSyncFiles(read, 300),
      ...configSyncFiles(read, synced, services),
    ],
    commands: [
      `mkdir -p ${KEY_DIR} ${AGENT_STATE_DIR} /var/run/netns`,
      ...(gw ? [`mkdir -p -m 0700 ${GATEWAY_RUN_DIR} ${GATEWAY_CA_DIR}`] : []),
      'modprobe tun || true',
      ...(a.pool.driver === 'gvisor' ? [] : ['modprobe kvm_intel || modprobe kvm_amd || true']),
      IP_FORWARDING.applyNow,
      `${PODMAN_PULL} "$(sed -n "s/^SPACE_IMAGE=//p" /etc/space/image.env)"`,
      'systemctl daemon-reload',
      `systemctl enable --now space-node-env.service ${[...(gw ? ['space-gateway-guard'] : []), ...units].map((u) => `${u}.service`).join(' ')} space-version-sync.timer space-config-sync.timer`,
    ],
  };
}
