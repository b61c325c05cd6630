/**
 * The "without Kubernetes" path: what a plain VM needs to run SPACE as systemd units, rendered as
 * cloud-init (`#cloud-config`, Linode metadata) or as a shell script (Crusoe `startup_script`).
 *
 * Two roles: `control` (Redis + API) and `agent` (one per pool node, with its egress gateway unless
 * disabled). Each service runs the one image (`space:imageRepository:space:version`) under podman
 * with the same environment as in Kubernetes (`runtime-settings.ts`).
 *
 * Nothing secret is ever rendered here: user data is readable by anyone who can read the instance's
 * metadata. The control VM makes its own Ed25519 key pair at first boot (the private key never
 * leaves it) and publishes the public key in Redis, where agents read it; Redis listens on the
 * private network only, closed to everything but the VPC by the cloud firewall and by nftables on
 * the control VM. The API writes the first API key to `BOOTSTRAP_API_KEY_FILE` on the control VM.
 *
 * The gateway's CA is generated on each agent VM, by the gateway at its first start (ECDSA P-256,
 * key mode 0600 in a 0700 root directory): a CA key cannot travel in user data, and the only
 * channel from the control VM is Redis, which has no password on the private network. So in vm
 * mode the "per-deployment" CA is per node: a sandbox only ever talks to its own node's gateway and
 * trusts that node's certificate (the agent mounts only `ca.crt`); a leaked key exposes one node.
 * The gateway's ports are closed to everything but sandbox interfaces by an nftables table applied
 * at every boot before the gateway starts.
 */
import { stringify } from 'yaml';
import { renderEnvFile } from '../../runtime/core/env-file.ts';
import {
  DEPLOY_TARGET_VERSION_KEY,
  DEPLOY_VM_CONFIG_KEY,
  VERSION_TAG,
} from '../../runtime/core/redis-keys.ts';
import type { NodePool } from '../node-pool.ts';
import {
  AGENT_PORT,
  AGENT_STATE_DIR,
  API_PORT,
  agentEnvironment,
  apiEnvironment,
  CACHE_DIR,
  GATEWAY_CA_CERT_FILE,
  GATEWAY_CA_DIR,
  GATEWAY_CONTROL_SOCKET,
  GATEWAY_PORTS,
  GATEWAY_RUN_DIR,
  gatewayEnvironment,
  gatewayGuardRuleset,
  imageRef,
  KEY_DIR,
  REDIS_PERSISTENCE,
  REDIS_PORT,
  ROUTER_PORT,
  routerEnvironment,
  SERVICE_COMMANDS,
  SIGNING_KEY_FILE,
  TLS_CERT_FILE,
  TLS_DIR,
  TLS_KEY_FILE,
  VERIFY_KEY_FILE,
} from '../runtime-settings.ts';
import { IP_FORWARDING } from './ip-forwarding.ts';

/** One file written at first boot. */
export interface VmFile {
  readonly path: string;
  readonly content: string;
  /** Octal permission string, e.g. `0644`. */
  readonly mode: string;
}

/** What a VM gets at first boot: packages, files, then commands (each a shell line, run as root). */
export interface VmPlan {
  readonly packages: readonly string[];
  readonly files: readonly VmFile[];
  readonly commands: readonly string[];
}

/** Redis key where the control VM publishes the agents' verify key (outside the runtime's `space:v1:`). */
export const VERIFY_KEY_REDIS_KEY = 'space:deploy:verify-key';

/** Arguments shared by both roles. */
export interface VmCommonArgs {
  /** SPACE version: the image tag. */
  readonly version: string;
  /** Image repository. */
  readonly imageRepository: string;
  /** CIDR of the private network (VPC subnet) the nodes share; Redis admits only it. */
  readonly privateCidr: string;
}

/**
 * TLS on the control VM itself, from an ACME CA (certbot, HTTP-01 on port 80): for clouds with no
 * load balancer that terminates TLS here (Crusoe).
 */
export interface AcmeArgs {
  /** DNS names on the certificate (the API's and the router's); empty: plain HTTP. */
  readonly hostnames: readonly string[];
  /** Account e-mail given to the CA. */
  readonly email: string;
  /** ACME directory URL. */
  readonly server: string;
}

/** Let's Encrypt's production ACME directory (letsencrypt.org/docs/acme-protocol-updates). */
export const LETS_ENCRYPT_DIRECTORY = 'https://acme-v02.api.letsencrypt.org/directory';

/** Arguments of the control role. */
export interface ControlArgs extends VmCommonArgs {
  /** Extra API settings. Default none. */
  readonly apiEnv?: Readonly<Record<string, string>>;
  /**
   * SHA-256 (hex) of the API key the deployment holds (`space:bootstrapApiKey`): the API imports it,
   * so `pulumi up` can write the VM configuration. Not a secret (the key is 190+ random bits).
   * Default none.
   */
  readonly bootstrapKeySha256?: string;
  /**
   * ACME TLS on the control VM (`space-tls` unit). Absent: the VM has no such unit (a load balancer
   * in front terminates TLS, or none does). Present with no hostnames: the unit exists and serves
   * nothing, so TLS can be turned on later through the VM configuration.
   */
  readonly acme?: AcmeArgs;
  /**
   * The router's public base URL (`SPACE_ROUTER_URL` of the API): the cloud's load balancer in front
   * of the router, or the control VM's public address. Clients get data-plane URLs there only.
   */
  readonly routerUrl: string;
}

/** Arguments of the agent role. */
export interface AgentArgs extends VmCommonArgs {
  readonly pool: NodePool;
  /** Private address of the control VM (Redis, verify key). */
  readonly controlAddress: string;
  /**
   * Run the `space-gateway` unit beside the agent. Default true. False: the agent gets no
   * `SPACE_GATEWAY_CONTROL_SOCKET`, so its sandboxes have no egress at all.
   */
  readonly gatewayEnabled?: boolean;
  /** The gateway's upstream resolvers, `ip:port`. Default: the gateway's own. */
  readonly gatewayUpstreamDns?: readonly string[];
  /** CIDRs the gateway never dials nor answers. Default: the gateway's own. */
  readonly gatewayDenyCidrs?: readonly string[];
  /** Extra gateway settings. Default none. */
  readonly gatewayEnv?: Readonly<Record<string, string>>;
  /** Extra agent settings. Default none. */
  readonly agentEnv?: Readonly<Record<string, string>>;
}

const envFile = renderEnvFile;

/**
 * The env of every service of a VM role, by VM service name (the fields of
 * `space:deploy:vm-config`): what cloud-init writes at first boot and what `pulumi up` writes
 * through `PUT /v1/deployment/vm-config` afterwards, from one function so the two agree byte for
 * byte (a VM restarts a service only when its file changes).
 */
export type VmServiceEnv = Record<string, Record<string, string>>;

/** Where a VM keeps a service's env file and which unit reads it. */
interface SyncedService {
  /** Field in `space:deploy:vm-config`. */
  readonly service: string;
  readonly file: string;
  /** Unit restarted when the file changes. */
  readonly unit: string;
}

/** The control VM's services: API, router, and with {@link ControlArgs.acme} the TLS unit. Pure. */
export function controlServiceEnv(a: ControlArgs): VmServiceEnv {
  const redisUrl = `redis://127.0.0.1:${REDIS_PORT}`;
  return {
    'space-api': {
      ...apiEnvironment(a.apiEnv, { routerUrl: a.routerUrl }),
      ...(a.bootstrapKeySha256 ? { SPACE_BOOTSTRAP_API_KEY_SHA256: a.bootstrapKeySha256 } : {}),
      SPACE_REDIS_URL: redisUrl,
    },
    // the router: Redis and the verify key the control VM made (space-keys), nothing else
    'space-router': { ...routerEnvironment(), SPACE_REDIS_URL: redisUrl },
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

/** The VM service name of the agent of `pool` (agents of different pools differ: driver, labels). */
export const agentService = (pool: string) => `space-agent@${pool}`;

/** A node VM's services: the gateway (unless disabled) and the agent of its pool. Pure. */
export function agentServiceEnv(a: AgentArgs): VmServiceEnv {
  const gw = a.gatewayEnabled ?? true;
  const redisUrl = `redis://${a.controlAddress}:${REDIS_PORT}`;
  return {
    ...(gw
      ? {
          'space-gateway': {
            ...gatewayEnvironment({
              enabled: true,
              ...(a.gatewayUpstreamDns ? { upstreamDns: a.gatewayUpstreamDns } : {}),
              ...(a.gatewayDenyCidrs ? { denyCidrs: a.gatewayDenyCidrs } : {}),
              ...(a.gatewayEnv ? { env: a.gatewayEnv } : {}),
            }),
            // the gateway reads credential values from the state of record itself (as the agent does)
            SPACE_REDIS_URL: redisUrl,
          },
        }
      : {}),
    [agentService(a.pool.name)]: {
      ...agentEnvironment(a.pool, a.agentEnv, { enabled: gw }),
      SPACE_REDIS_URL: redisUrl,
    },
  };
}

/** `/etc/space/image.env`: the only place a VM names the image; `space-upgrade` rewrites it. */
function imageFile(a: VmCommonArgs): VmFile {
  return {
    path: '/etc/space/image.env',
    content: `SPACE_IMAGE=${imageRef(a.imageRepository, a.version)}\n`,
    mode: '0644',
  };
}

/**
 * A podman-run systemd unit. `KillMode=process` and host PID/cgroup namespaces: stopping the unit
 * signals only the service, so sandboxes outlive an agent restart and are re-adopted.
 */
function unit(
  name: string,
  description: string,
  command: readonly string[],
  podmanArgs: string[],
  extra: string[] = [],
  serviceExtra: string[] = [],
): VmFile {
  return {
    path: `/etc/systemd/system/${name}.service`,
    mode: '0644',
    content: [
      '[Unit]',
      `Description=${description}`,
      'Wants=network-online.target',
      'After=network-online.target',
      ...extra,
      '',
      '[Service]',
      'EnvironmentFile=/etc/space/image.env',
      ...serviceExtra,
      `ExecStartPre=-/usr/bin/podman rm -f ${name}`,
      `ExecStart=/usr/bin/podman run --rm --name ${name} --network host ${podmanArgs.join(' ')} --env-file /etc/space/${name}.env \${SPACE_IMAGE} ${command.join(' ')}`,
      `ExecStop=/usr/bin/podman stop --time 150 ${name}`,
      'KillMode=process',
      'TimeoutStopSec=180',
      'Restart=always',
      'RestartSec=2',
      '',
      '[Install]',
      'WantedBy=multi-user.target',
      '',
    ].join('\n'),
  };
}

/** `space-upgrade <version>`: pulls the new image and restarts this VM's SPACE services (runbook). */
function upgradeScript(a: VmCommonArgs, units: string[]): VmFile {
  return {
    path: '/usr/local/sbin/space-upgrade',
    mode: '0755',
    content: [
      '#!/bin/sh',
      '# usage: space-upgrade <version> - pulls the image, then restarts the SPACE units one by one',
      'set -eu',
      // biome-ignore lint/suspicious/noTemplateCurlyInString: shell parameter expansion, not a template
      'v="${1:?usage: space-upgrade <version>}"',
      `img="${a.imageRepository}:$v"`,
      'podman pull "$img"',
      'printf "SPACE_IMAGE=%s\\n" "$img" > /etc/space/image.env',
      `systemctl restart ${units.join(' ')}`,
      '',
    ].join('\n'),
  };
}

/**
 * In-place upgrades without SSH: a timer on every VM reads the deployment's target version from
 * Redis ({@link DEPLOY_TARGET_VERSION_KEY}, set through the API's `PUT /v1/deployment/target-version`)
 * and, when it differs from the tag in `/etc/space/image.env`, runs `space-upgrade` (pull, rewrite,
 * restart). A value that is not an image tag is refused. Agent VMs wait a random delay (up to
 * `spreadSec`) so that nodes do not all restart at once; sandboxes survive either way (the agent
 * keeps them and re-adopts). The VM pulls only its own repository: the key chooses a tag, never
 * an image.
 */
function versionSyncFiles(redisHost: string, spreadSec: number): VmFile[] {
  return [
    {
      path: '/usr/local/sbin/space-version-sync',
      mode: '0755',
      content: [
        '#!/bin/sh',
        '# upgrades this VM in place to the deployment target version in Redis (no SSH needed)',
        'set -eu',
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
function configSyncFiles(redisHost: string, services: readonly SyncedService[]): VmFile[] {
  return [
    {
      path: '/usr/local/sbin/space-config-sync',
      mode: '0755',
      content: [
        '#!/bin/sh',
        '# applies the deployment VM configuration in Redis: a changed env file is replaced and its unit restarted',
        'set -u',
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

/**
 * ACME TLS on the control VM: `space-tls` (bash) asks certbot for one certificate naming
 * `SPACE_TLS_HOSTNAMES` (HTTP-01, certbot's standalone server on port 80), copies it to
 * {@link TLS_DIR} and writes the API's and the router's TLS env files (`*.tls.env`), restarting
 * them only when what they serve changed. It runs at every boot (a unit, ordered before them), when
 * the VM configuration changes `space-tls`, and as certbot's deploy hook after each renewal
 * (Debian's certbot package renews from its own timer). Idempotent: certbot keeps a certificate
 * until it is due. Until a certificate exists (DNS not pointed yet, CA unreachable) the API and the
 * router serve plain HTTP, and the unit retries every 5 minutes; with no hostnames they serve
 * plain HTTP.
 */
function acmeFiles(): VmFile[] {
  const live = '/etc/letsencrypt/live/space';
  return [
    {
      path: '/usr/local/sbin/space-tls',
      mode: '0755',
      content: [
        '#!/bin/bash',
        '# usage: space-tls [--installed]  (--installed: certbot deploy hook, installs without asking the CA)',
        'set -euo pipefail',
        'conf=/etc/space/space-tls.env',
        'get() { sed -n "s/^$1=//p" "$conf" 2>/dev/null | head -n 1; }',
        'hosts=$(get SPACE_TLS_HOSTNAMES)',
        'email=$(get SPACE_ACME_EMAIL)',
        'server=$(get SPACE_ACME_SERVER)',
        `live=${live}`,
        // biome-ignore lint/suspicious/noTemplateCurlyInString: bash parameter expansion, not a template
        'if [ -n "$hosts" ] && [ "${1:-}" != "--installed" ]; then',
        '  [[ "$hosts" =~ ^[a-z0-9.-]+(,[a-z0-9.-]+)*$ ]] || { echo "space-tls: bad SPACE_TLS_HOSTNAMES" >&2; exit 2; }',
        '  [[ "$email" =~ ^[^[:space:]@]+@[^[:space:]@]+$ ]] || { echo "space-tls: bad SPACE_ACME_EMAIL" >&2; exit 2; }',
        '  [[ "$server" =~ ^https://[^[:space:]]+$ ]] || { echo "space-tls: bad SPACE_ACME_SERVER" >&2; exit 2; }',
        '  domains=()',
        '  IFS=, read -ra names <<< "$hosts"',
        // biome-ignore lint/suspicious/noTemplateCurlyInString: bash parameter expansion, not a template
        '  for h in "${names[@]}"; do domains+=(-d "$h"); done',
        '  certbot certonly --standalone --non-interactive --agree-tos --email "$email" --server "$server" \\',
        // biome-ignore lint/suspicious/noTemplateCurlyInString: bash parameter expansion, not a template
        '    --cert-name space --keep-until-expiring --expand "${domains[@]}" \\',
        '    --deploy-hook "/usr/local/sbin/space-tls --installed"',
        'fi',
        'restart=""',
        'api_env=""',
        'router_env=""',
        'if [ -n "$hosts" ] && [ -s "$live/fullchain.pem" ] && [ -s "$live/privkey.pem" ]; then',
        `  mkdir -p -m 0700 ${TLS_DIR}`,
        `  if ! cmp -s "$live/fullchain.pem" ${TLS_CERT_FILE} || ! cmp -s "$live/privkey.pem" ${TLS_KEY_FILE}; then`,
        `    install -m 0644 "$live/fullchain.pem" ${TLS_CERT_FILE}.new`,
        `    install -m 0600 "$live/privkey.pem" ${TLS_KEY_FILE}.new`,
        `    mv ${TLS_CERT_FILE}.new ${TLS_CERT_FILE}`,
        `    mv ${TLS_KEY_FILE}.new ${TLS_KEY_FILE}`,
        '    restart="space-api space-router"',
        '  fi',
        `  api_env=$(printf 'SPACE_API_TLS_CERT_FILE=%s\\nSPACE_API_TLS_KEY_FILE=%s' ${TLS_CERT_FILE} ${TLS_KEY_FILE})`,
        `  router_env=$(printf 'SPACE_ROUTER_TLS_CERT_FILE=%s\\nSPACE_ROUTER_TLS_KEY_FILE=%s' ${TLS_CERT_FILE} ${TLS_KEY_FILE})`,
        'fi',
        "# put <unit> <content>: rewrites the unit's TLS env file when it differs",
        'put() {',
        '  f=/etc/space/$1.tls.env',
        '  if [ ! -e "$f" ] || [ "$(cat "$f")" != "$2" ]; then',
        '    if [ -n "$2" ]; then printf \'%s\\n\' "$2" > "$f"; else : > "$f"; fi',
        '    restart="$restart $1"',
        '  fi',
        '}',
        'put space-api "$api_env"',
        'put space-router "$router_env"',
        '# try-restart: at boot they are not running yet and start after this unit',
        'if [ -n "$restart" ]; then systemctl try-restart $restart; fi',
        '',
      ].join('\n'),
    },
    {
      path: '/etc/systemd/system/space-tls.service',
      mode: '0644',
      content: [
        '[Unit]',
        'Description=SPACE: ACME certificate of the API and the router',
        'Wants=network-online.target',
        'After=network-online.target',
        'Before=space-api.service space-router.service',
        '',
        '[Service]',
        'Type=oneshot',
        'ExecStart=/usr/local/sbin/space-tls',
        // DNS not pointed at the VM yet, the CA unreachable: try again, while the API serves plain HTTP
        'Restart=on-failure',
        'RestartSec=300',
        '',
        '[Install]',
        'WantedBy=multi-user.target',
        '',
      ].join('\n'),
    },
  ];
}

/** The control VM: Redis on the private network, the API, its own key pair. */
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
  const tlsServe = (unit: string) =>
    a.acme ? [`-v ${TLS_DIR}:${TLS_DIR}:ro`, `--env-file /etc/space/${unit}.tls.env`] : [];
  const tlsPre = (unit: string) =>
    a.acme
      ? [`ExecStartPre=/bin/sh -c 'mkdir -p -m 0700 ${TLS_DIR} && touch /etc/space/${unit}.tls.env'`]
      : [];
  return {
    packages: ['podman', 'redis-server', 'openssl', 'nftables', ...(a.acme ? ['certbot'] : [])],
    files: [
      imageFile(a),
      ...synced.map((x) => ({ path: x.file, mode: '0644', content: envFile(env[x.service]!) })),
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
      {
        path: '/usr/local/sbin/space-keys',
        mode: '0755',
        content: [
          '#!/bin/sh',
          '# makes the API key pair once (the private key never leaves this VM) and publishes the public key',
          'set -eu',
          `mkdir -p -m 0700 ${KEY_DIR}`,
          `[ -s ${SIGNING_KEY_FILE} ] || openssl genpkey -algorithm ed25519 -out ${SIGNING_KEY_FILE}`,
          `chmod 0600 ${SIGNING_KEY_FILE}`,
          `openssl pkey -in ${SIGNING_KEY_FILE} -pubout -out ${VERIFY_KEY_FILE}`,
          `until redis-cli -p ${REDIS_PORT} ping >/dev/null 2>&1; do sleep 1; done`,
          `redis-cli -p ${REDIS_PORT} -x SET ${VERIFY_KEY_REDIS_KEY} < ${VERIFY_KEY_FILE} >/dev/null`,
          '',
        ].join('\n'),
      },
      {
        path: '/etc/systemd/system/space-keys.service',
        mode: '0644',
        content: [
          '[Unit]',
          'Description=SPACE API key pair',
          'After=redis-server.service',
          'Requires=redis-server.service',
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
      unit(
        'space-api',
        'SPACE API',
        SERVICE_COMMANDS.api,
        [`-v ${KEY_DIR}:${KEY_DIR}:ro`, `-v /var/lib/space/api:/var/lib/space/api`, ...tlsServe('space-api')],
        ['After=space-keys.service redis-server.service', 'Requires=space-keys.service'],
        tlsPre('space-api'),
      ),
      unit(
        'space-router',
        'SPACE data-plane router',
        SERVICE_COMMANDS.router,
        [
          `-v ${VERIFY_KEY_FILE}:${VERIFY_KEY_FILE}:ro`,
          '--cap-drop all',
          '--security-opt no-new-privileges',
          ...tlsServe('space-router'),
        ],
        ['After=space-keys.service redis-server.service', 'Requires=space-keys.service'],
        tlsPre('space-router'),
      ),
      ...(a.acme ? acmeFiles() : []),
      upgradeScript(a, ['space-router', 'space-api']),
      ...versionSyncFiles('127.0.0.1', 0),
      ...configSyncFiles('127.0.0.1', synced),
    ],
    commands: [
      `mkdir -p /var/lib/space/api ${KEY_DIR}`,
      'grep -q "redis.conf.d" /etc/redis/redis.conf || echo "include /etc/redis/redis.conf.d/*.conf" >> /etc/redis/redis.conf',
      'systemctl daemon-reload',
      'systemctl enable --now space-control-guard.service',
      'systemctl restart redis-server',
      'podman pull "$(sed -n "s/^SPACE_IMAGE=//p" /etc/space/image.env)"',
      ...(a.acme
        ? [
            `mkdir -p -m 0700 ${TLS_DIR}`,
            'touch /etc/space/space-api.tls.env /etc/space/space-router.tls.env',
          ]
        : []),
      'systemctl enable --now space-keys.service space-api.service space-router.service space-version-sync.timer space-config-sync.timer',
      // not --now: a first certificate can fail (names not pointed yet) and a failed start would
      // stop this script before it marks the VM provisioned; the unit retries on its own
      ...(a.acme
        ? ['systemctl enable space-tls.service', 'systemctl start --no-block space-tls.service']
        : []),
    ],
  };
}

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
    '--cgroups disabled',
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
          `until redis-cli -h ${a.controlAddress} -p ${REDIS_PORT} --raw GET ${VERIFY_KEY_REDIS_KEY} | grep -q "BEGIN PUBLIC KEY"; do sleep 2; done`,
          `redis-cli -h ${a.controlAddress} -p ${REDIS_PORT} --raw GET ${VERIFY_KEY_REDIS_KEY} > ${VERIFY_KEY_FILE}.tmp`,
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
      ),
      ...(gw ? gatewayFiles(services['space-gateway']!) : []),
      upgradeScript(a, units),
      // nodes spread their restarts over five minutes
      ...versionSyncFiles(a.controlAddress, 300),
      ...configSyncFiles(a.controlAddress, synced),
    ],
    commands: [
      `mkdir -p ${KEY_DIR} ${AGENT_STATE_DIR} /var/run/netns`,
      ...(gw ? [`mkdir -p -m 0700 ${GATEWAY_RUN_DIR} ${GATEWAY_CA_DIR}`] : []),
      'modprobe tun || true',
      ...(a.pool.driver === 'gvisor' ? [] : ['modprobe kvm_intel || modprobe kvm_amd || true']),
      IP_FORWARDING.applyNow,
      'podman pull "$(sed -n "s/^SPACE_IMAGE=//p" /etc/space/image.env)"',
      'systemctl daemon-reload',
      `systemctl enable --now space-node-env.service ${[...(gw ? ['space-gateway-guard'] : []), ...units].map((u) => `${u}.service`).join(' ')} space-version-sync.timer space-config-sync.timer`,
    ],
  };
}

/**
 * The gateway of an agent VM: its environment, the host firewall closing its ports (applied at
 * every boot, before the gateway), and its unit (root, no capabilities; the CA is made on first
 * start in `GATEWAY_CA_DIR`, which only it mounts read-write).
 */
function gatewayFiles(env: Record<string, string>): VmFile[] {
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

/** The plan as cloud-init user data (`#cloud-config` YAML). */
export function toCloudConfig(plan: VmPlan): string {
  const doc = {
    package_update: true,
    packages: [...plan.packages],
    write_files: plan.files.map((f) => ({
      path: f.path,
      permissions: f.mode,
      owner: 'root:root',
      content: f.content,
    })),
    runcmd: [...plan.commands],
  };
  return `#cloud-config\n${stringify(doc, { lineWidth: 0 })}`;
}

/** Marker the startup script leaves once the VM is provisioned (see {@link toShellScript}). */
export const PROVISIONED_MARKER = '/var/lib/space/provisioned';

/**
 * The plan as one bash script, for clouds without cloud-init (Crusoe `startup_script`). Crusoe
 * runs startup scripts at **every boot**, requires them to start with `#!/bin/bash` and to be
 * ASCII only (Crusoe docs, "startup scripts"; clouds.md "Checked against the real APIs"). So:
 * - a non-ASCII character anywhere (an operator setting, a comment) is refused here, at render time;
 * - the script provisions once and leaves {@link PROVISIONED_MARKER}; at every later boot it exits
 *   at once. Re-running it would rewrite `/etc/space/image.env` and so rewind an in-place upgrade
 *   (`space-upgrade`) to the version the VM was created with. What must happen at every boot is a
 *   systemd unit (the firewall guards, the services), never a line of this script.
 */
export function toShellScript(plan: VmPlan): string {
  const lines = [
    '#!/bin/bash',
    '# SPACE provisioning script (rendered by providers/systemd/cloud-init.ts).',
    '# Runs at every boot; provisions once. Boot-time work lives in systemd units.',
    'set -euo pipefail',
    `if [ -e ${PROVISIONED_MARKER} ]; then`,
    '  echo "space: provisioned already; nothing to do at this boot"',
    '  exit 0',
    'fi',
  ];
  lines.push(
    'export DEBIAN_FRONTEND=noninteractive',
    'apt-get update',
    `apt-get install -y ${plan.packages.join(' ')}`,
  );
  plan.files.forEach((f, i) => {
    const marker = `SPACE_EOF_${i}`;
    lines.push(
      `mkdir -p "$(dirname ${f.path})"`,
      `cat > ${f.path} <<'${marker}'`,
      f.content.replace(/\n$/, ''),
      marker,
      `chmod ${f.mode} ${f.path}`,
    );
  });
  lines.push(
    ...plan.commands,
    `mkdir -p "$(dirname ${PROVISIONED_MARKER})"`,
    `touch ${PROVISIONED_MARKER}`,
    '',
  );
  const script = lines.join('\n');
  const bad = [...script].findIndex((c) => c.charCodeAt(0) > 0x7e || (c < ' ' && c !== '\n' && c !== '\t'));
  if (bad >= 0) {
    const line = script.slice(0, bad).split('\n').length;
    throw new Error(
      `startup script: character ${JSON.stringify(script[bad])} on line ${line} is not printable ASCII (Crusoe accepts ASCII only)`,
    );
  }
  return script;
}

/** Every port a role serves clients on (for the firewall tests): API and router on control, none on agents. */
export const PUBLIC_PORTS = { control: [API_PORT, ROUTER_PORT], agent: [] } as const;
/** Ports an agent VM serves inside the private network only (dispatch and router forwarding). */
export const PRIVATE_PORTS = { agent: [AGENT_PORT] } as const;

/** Ports an agent VM listens on that only its sandboxes may reach (the gateway's). */
export const NODE_LOCAL_PORTS = Object.values(GATEWAY_PORTS);
