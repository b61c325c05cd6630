/**
 * What every VM role's rendering shares: the plan a VM gets at first boot (packages, files,
 * commands), the arguments of the control and agent roles, and the pieces every service's unit is
 * made of (the image file, the podman unit, the upgrade script). Pure.
 */
import { renderEnvFile } from '../../runtime/core/env-file.ts';
import type { BackupPlan } from '../backup-schedule.ts';
import { type ImagePullCredentials, registryAuthFile } from '../image-pull.ts';
import type { NodePool } from '../node-pool.ts';
import { imageRef, REDIS_PORT, REDIS_PRIMARY_NAME, SENTINEL_PORT } from '../runtime-settings.ts';

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
  /**
   * Password of the control VM's Redis (secret: `space:redisPassword`, or derived from
   * `space:bootstrapApiKey`, see vm-network.ts). Written only to root-only files (mode 0600) of the
   * VM; user data is the only channel into a new VM, so the user data holding it is a Pulumi
   * secret. Must match {@link REDIS_PASSWORD}.
   */
  readonly redisPassword: string;
  /**
   * A control plane of several VMs (`space:controlPlane.replicas` 3 or 5), each with a Redis data
   * server and a Sentinel: what this VM knows of them when it is made. Absent: one control VM,
   * one Redis, no failover (the rendering of before).
   */
  readonly ha?: VmHa;
  /**
   * Credentials for the image's registry (`space:imagePullUsername`, secret
   * `space:imagePullPassword`), written to {@link REGISTRY_AUTH_FILE}. Default: anonymous pulls.
   */
  readonly imagePull?: ImagePullCredentials;
}

/**
 * A highly available control plane in vm mode: every control VM runs a Redis data server and a
 * Redis Sentinel (port {@link SENTINEL_PORT}); the sentinels elect and follow the primary.
 */
export interface VmHa {
  /** How many control VMs there are (3 or 5): the sentinels' quorum is their majority. */
  readonly controlVms: number;
  /**
   * Private addresses of the control VMs this VM may ask (their Redis for reads, their sentinels
   * for the primary), as far as they are known when it is made: all of them where the cloud lets
   * the program choose addresses (Akamai); on Crusoe, whose API chooses, the ones made before it.
   */
  readonly controlAddresses: readonly string[];
  /**
   * The control VM whose Redis is the primary when the deployment is new (the first one): its
   * address, or {@link SELF_ADDRESS} in the first VM's own rendering where the cloud chooses its
   * address only when it makes it (Crusoe).
   */
  readonly initialPrimary: string;
}

/** {@link VmHa.initialPrimary} meaning "this VM": its private address, found at each start. */
export const SELF_ADDRESS = '@SELF@';

/**
 * `SPACE_REDIS_URL` of a VM's services: `redis://:<pw>@<host>:6379` with one control VM, else
 * `redis-sentinel://:<pw>@<a1>:26379,…/space` naming the sentinels of `ha` (the form of
 * runtime/core/redis-connection.ts; the client asks them for the primary and follows failovers).
 * `first` (a control VM's own loopback) is asked first. Pure.
 */
export function redisUrlFor(host: string, password: string, ha?: VmHa, first?: string): string {
  if (!ha) return `redis://:${password}@${host}:${REDIS_PORT}`;
  const hosts = [...new Set([...(first ? [first] : []), ...ha.controlAddresses])];
  return `redis-sentinel://:${password}@${hosts.map((h) => `${h}:${SENTINEL_PORT}`).join(',')}/${REDIS_PRIMARY_NAME}`;
}

/** The helper a VM's scripts read Redis through when the control plane has several VMs. */
export const REDIS_READ = '/usr/local/sbin/space-redis-read';

/**
 * The `redis-cli` a VM's scripts read with (GET, HGET: a replica answers those too): one control
 * VM's Redis at `host`, or with `ha` {@link REDIS_READ}, which tries each control VM in turn. The
 * caller exports `REDISCLI_AUTH` first ({@link REDIS_CLI_AUTH}). Pure.
 */
export function redisReadCli(host: string, ha?: VmHa): string {
  return ha ? REDIS_READ : `redis-cli -h ${host} -p ${REDIS_PORT}`;
}

/** {@link REDIS_READ} for `ha`, `first` tried first (a control VM's own Redis). Pure. */
export function redisReadFile(ha: VmHa, first?: string): VmFile {
  const hosts = [...new Set([...(first ? [first] : []), ...ha.controlAddresses])];
  return {
    path: REDIS_READ,
    mode: '0755',
    content: [
      '#!/bin/sh',
      '# redis-cli against the first control VM whose Redis answers: any of them serves reads (replicas',
      '# too); the caller exports REDISCLI_AUTH',
      `for h in ${hosts.join(' ')}; do`,
      `  if redis-cli -h "$h" -p ${REDIS_PORT} PING 2>/dev/null | grep -q PONG; then exec redis-cli -h "$h" -p ${REDIS_PORT} "$@"; fi`,
      'done',
      'echo "space-redis-read: no control VM\'s Redis answers" >&2',
      'exit 1',
      '',
    ].join('\n'),
  };
}

/** podman's auth file on a VM (mode 0600; containers-auth.json(5)); every pull names it. */
export const REGISTRY_AUTH_FILE = '/etc/containers/auth.json';
/**
 * How a VM pulls: with {@link REGISTRY_AUTH_FILE} named, since podman's own default for root is
 * under `/run` (lost at every reboot) and a later `space-upgrade` must still authenticate.
 */
export const PODMAN_PULL = `podman pull --authfile ${REGISTRY_AUTH_FILE}`;

/** {@link REGISTRY_AUTH_FILE} for `a`'s image: its registry's credentials, or none. Pure. */
export function registryAuthVmFile(a: VmCommonArgs): VmFile {
  return {
    path: REGISTRY_AUTH_FILE,
    mode: '0600',
    content: registryAuthFile(a.imageRepository, a.imagePull),
  };
}

/**
 * What a VM-mode Redis password may be: URL-unreserved characters only (RFC 3986 section 2.3), so
 * it goes into a `redis://` URL, a redis.conf line and a shell word unquoted and unescaped.
 */
export const REDIS_PASSWORD = /^[A-Za-z0-9._~-]{16,128}$/;

/** @throws Error when `password` does not fit {@link REDIS_PASSWORD} (the stack configuration refuses it first). */
export function checkRedisPassword(password: string): void {
  if (!REDIS_PASSWORD.test(password))
    throw new Error('the Redis password must be 16-128 characters from A-Z a-z 0-9 . _ ~ -');
}

/** The env file (mode 0600) every podman unit of a VM reads last: `SPACE_REDIS_URL` with the password. */
export const REDIS_ENV_FILE = '/etc/space/redis.env';
/** The password alone (mode 0600), for `redis-cli` in the VM's scripts (through `REDISCLI_AUTH`). */
export const REDIS_PASSWORD_FILE = '/etc/space/redis.password';
/**
 * The shell line a VM script runs before any `redis-cli`: the password from
 * {@link REDIS_PASSWORD_FILE} in `REDISCLI_AUTH`, which redis-cli reads since 5.0.3 (redis/redis
 * pull 5460), so it never shows in the process list as `-a` would.
 */
export const REDIS_CLI_AUTH = `export REDISCLI_AUTH="$(cat ${REDIS_PASSWORD_FILE})"`;

/**
 * The Redis client files of a VM whose services reach Redis at `host` (with `ha`: through the
 * sentinels, `first` asked first; {@link redisUrlFor}): {@link REDIS_ENV_FILE} and
 * {@link REDIS_PASSWORD_FILE}, both root-only. @throws Error when the password does not fit
 * {@link REDIS_PASSWORD} (the stack configuration refuses it first).
 */
export function redisClientFiles(host: string, password: string, ha?: VmHa, first?: string): VmFile[] {
  checkRedisPassword(password);
  return [
    {
      path: REDIS_ENV_FILE,
      mode: '0600',
      content: `SPACE_REDIS_URL=${redisUrlFor(host, password, ha, first)}\n`,
    },
    { path: REDIS_PASSWORD_FILE, mode: '0600', content: password },
  ];
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
  /**
   * Scheduled backups (`space:backup`, with the secret `space:backupSecretAccessKey`): the
   * `space-backup` timer and service (backup.ts). Absent: the VM has neither.
   */
  readonly backup?: BackupPlan & { readonly secretAccessKey?: string };
  /**
   * With {@link VmCommonArgs.ha}: this control VM's private address (its Redis and sentinel bind
   * there; the others reach it there) and the API's signing key, PKCS#8 PEM, the same on every
   * control VM (a token one API signs must verify wherever it is presented); a secret, written
   * only to a root-only file. Without `ha` the VM makes its own key at first boot.
   */
  readonly self?: { readonly address: string; readonly signingKey: string };
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
  /**
   * How long a drained node's agent waits at SIGTERM for its sandboxes to end, s
   * (`space:agentDrainSeconds`; `SPACE_DRAIN_WAIT_MS`). Default 120 (runtime-settings.ts).
   */
  readonly agentDrainSeconds?: number;
}

/** A service's env file (`NAME=value` lines; runtime/core/env-file.ts). */
export const envFile = renderEnvFile;

/**
 * The env of every service of a VM role, by VM service name (the fields of
 * `space:deploy:vm-config`): what cloud-init writes at first boot and what `pulumi up` writes
 * through `PUT /v1/deployment/vm-config` afterwards, from one function so the two agree byte for
 * byte (a VM restarts a service only when its file changes).
 */
export type VmServiceEnv = Record<string, Record<string, string>>;

/** Where a VM keeps a service's env file and which unit reads it. */
export interface SyncedService {
  /** Field in `space:deploy:vm-config`. */
  readonly service: string;
  readonly file: string;
  /** Unit restarted when the file changes. */
  readonly unit: string;
}

/** `/etc/space/image.env`: the only place a VM names the image; `space-upgrade` rewrites it. */
export function imageFile(a: VmCommonArgs): VmFile {
  return {
    path: '/etc/space/image.env',
    content: `SPACE_IMAGE=${imageRef(a.imageRepository, a.version)}\n`,
    mode: '0644',
  };
}

/** Seconds a service's container gets between SIGTERM and SIGKILL (`podman stop --time`), by default. */
export const STOP_GRACE_SECONDS = 150;

/**
 * A podman-run systemd unit. `KillMode=process` and host PID/cgroup namespaces: stopping the unit
 * signals only the service, so sandboxes outlive an agent restart and are re-adopted. The
 * container gets `stopGraceSeconds` (default {@link STOP_GRACE_SECONDS}) after SIGTERM, and
 * systemd 30 s more before it gives up on the stop.
 */
export function unit(
  name: string,
  description: string,
  command: readonly string[],
  podmanArgs: string[],
  extra: string[] = [],
  serviceExtra: string[] = [],
  stopGraceSeconds = STOP_GRACE_SECONDS,
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
      // the Redis URL last: it carries the password, so it lives in its own root-only file and no
      // synced env file can set it (vm-config refuses SPACE_REDIS_URL)
      `ExecStart=/usr/bin/podman run --rm --name ${name} --network host ${podmanArgs.join(' ')} --env-file /etc/space/${name}.env --env-file ${REDIS_ENV_FILE} \${SPACE_IMAGE} ${command.join(' ')}`,
      `ExecStop=/usr/bin/podman stop --time ${stopGraceSeconds} ${name}`,
      'KillMode=process',
      `TimeoutStopSec=${stopGraceSeconds + 30}`,
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
export function upgradeScript(a: VmCommonArgs, units: string[]): VmFile {
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
      `${PODMAN_PULL} "$img"`,
      'printf "SPACE_IMAGE=%s\\n" "$img" > /etc/space/image.env',
      `systemctl restart ${units.join(' ')}`,
      '',
    ].join('\n'),
  };
}
