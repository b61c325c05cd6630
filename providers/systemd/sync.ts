/**
 * How a VM follows the deployment after its first boot, without SSH: timers that read the target
 * version and the VM configuration from Redis and apply them (the same on control and agent VMs).
 */
import {
  DEPLOY_TARGET_VERSION_KEY,
  DEPLOY_VM_CONFIG_KEY,
  VERSION_TAG,
} from '../../runtime/core/redis-keys.ts';
import { OTEL_SETTING, type VmConfigPolicy } from '../../runtime/core/vm-config.ts';
import { DEPLOYMENT_OWNED, KNOWN_ENV, TRACED } from '../runtime-settings.ts';
import { REDIS_CLI_AUTH, type SyncedService, type VmFile, type VmServiceEnv } from './plan.ts';

/** Where a VM keeps its VM configuration policy (written once, at creation; runtime/core/vm-config.ts). */
export const VM_CONFIG_POLICY_FILE = '/etc/space/vm-config.policy.json';

/** The settings of `space-tls` (acme.ts), all of which `pulumi up` may change. */
const TLS_SETTINGS = ['SPACE_ACME_EMAIL', 'SPACE_ACME_SERVER', 'SPACE_TLS_HOSTNAMES'];

/**
 * Settings that name a program the service runs or a file or directory it trusts
 * (`SPACE_QEMU_BINARY`, `SPACE_GATEWAY_UPSTREAM_CA_FILE`, `SPACE_HIBERNATE_DIR`…): fixed when the VM
 * is made, since a node that can write Redis must not point a root service at another binary or key.
 */
const PATH_SETTING = /_(BINARY|FILE|DIR)$/;

/** The SPACE service a VM unit runs (`space-agent@<pool>` → `agent`), or undefined for another unit. */
function serviceKind(service: string): keyof typeof KNOWN_ENV | undefined {
  if (service.startsWith('space-agent@')) return 'agent';
  return ({ 'space-api': 'api', 'space-router': 'router', 'space-gateway': 'gateway' } as const)[
    service as 'space-api'
  ];
}

/**
 * Names of a VM service an operator may change through `pulumi up`: the settings its runtime
 * declares (`KNOWN_ENV`), less those the deployment owns, the paths ({@link PATH_SETTING}), the
 * Redis URL (it carries the password and has its own file) and the deployment key's hash (a VM's
 * API imports only the one it was created with). Pure.
 * @throws Error for a service with no known settings.
 */
export function tunableSettings(service: string): string[] {
  if (service === 'space-tls') return TLS_SETTINGS;
  const kind = serviceKind(service);
  if (!kind) throw new Error(`no settings are known for VM service ${service}`);
  const fixed = new Set<string>([...DEPLOYMENT_OWNED, 'SPACE_REDIS_URL', 'SPACE_BOOTSTRAP_API_KEY_SHA256']);
  return [...KNOWN_ENV[kind]].filter((n) => !fixed.has(n) && !PATH_SETTING.test(n)).sort();
}

/** Whether VM service `service` exports traces, so `OTEL_*` reach it through `pulumi up`. */
function traces(service: string): boolean {
  const kind = serviceKind(service);
  return kind !== undefined && TRACED.has(kind);
}

/**
 * A VM's policy for its VM configuration ({@link VM_CONFIG_POLICY_FILE}): for each of `services`
 * (in order), its env file, its unit, the names `pulumi up` may change, and every other setting
 * it was created with, pinned to its value. Pure.
 */
export function vmConfigPolicy(services: readonly SyncedService[], env: VmServiceEnv): VmConfigPolicy {
  return {
    services: services.map((s) => {
      const tunable = tunableSettings(s.service);
      const open = new Set(tunable);
      const otel = traces(s.service);
      // OTEL_* of a tracing service stay tunable even when the VM was created with them
      const pinned = Object.fromEntries(
        Object.entries(env[s.service] ?? {}).filter(([n]) => !open.has(n) && !(otel && OTEL_SETTING.test(n))),
      );
      return {
        service: s.service,
        file: s.file,
        unit: s.unit,
        tunable,
        pinned,
        ...(otel ? { otel: true } : {}),
      };
    }),
  };
}

/**
 * In-place upgrades without SSH: a timer on every VM reads the deployment's target version from
 * Redis ({@link DEPLOY_TARGET_VERSION_KEY}, set through the API's `PUT /v1/deployment/target-version`)
 * and, when it differs from the tag in `/etc/space/image.env`, runs `space-upgrade` (pull, rewrite,
 * restart). A value that is not an image tag is refused. Agent VMs wait a random delay (up to
 * `spreadSec`) so that nodes do not all restart at once; sandboxes survive either way (the agent
 * keeps them and re-adopts). The VM pulls only its own repository: the key chooses a tag, never
 * an image. `redisCli` is the read command (plan.ts `redisReadCli`: one Redis, or any control VM's).
 */
export function versionSyncFiles(redisCli: string, spreadSec: number): VmFile[] {
  return [
    {
      path: '/usr/local/sbin/space-version-sync',
      mode: '0755',
      content: [
        '#!/bin/sh',
        '# upgrades this VM in place to the deployment target version in Redis (no SSH needed)',
        'set -eu',
        REDIS_CLI_AUTH,
        `v=$(${redisCli} --raw GET ${DEPLOY_TARGET_VERSION_KEY} 2>/dev/null || true)`,
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
 * `PUT /v1/deployment/vm-config`) once a minute. A service's field (a JSON document) that changed
 * since it was last applied is checked against the VM's policy ({@link vmConfigPolicy}) by
 * `runtime/cli/vm-config-apply.ts`, run from the VM's own image with no network and no
 * capabilities; the env file is replaced with what that renders, and the unit restarted, only when
 * the file changes (read with `redisCli`, as {@link versionSyncFiles}). Anything the policy refuses (an unknown name such as `NODE_OPTIONS`, a pinned
 * setting changed, a newline in a value, not JSON) leaves the file as it is and fails the run.
 * A field that is absent leaves the file as it is. `services` are applied in order (TLS before the
 * API; the gateway before the agent); `env` is what the VM was created with.
 */
export function configSyncFiles(
  redisCli: string,
  services: readonly SyncedService[],
  env: VmServiceEnv,
): VmFile[] {
  const seen = '/var/lib/space/config-sync';
  return [
    {
      path: VM_CONFIG_POLICY_FILE,
      mode: '0644',
      content: `${JSON.stringify(vmConfigPolicy(services, env), null, 2)}\n`,
    },
    {
      path: '/usr/local/sbin/space-config-sync',
      mode: '0755',
      content: [
        '#!/bin/sh',
        '# applies the deployment VM configuration in Redis: each changed document is checked against this',
        `# VM's policy (${VM_CONFIG_POLICY_FILE}) by the image's vm-config-apply; a changed env file is replaced`,
        '# and its unit restarted',
        'set -u',
        REDIS_CLI_AUTH,
        'rc=0',
        'img=$(sed -n "s/^SPACE_IMAGE=//p" /etc/space/image.env)',
        `mkdir -p -m 0700 ${seen}`,
        '# apply <service> <env file> <unit>',
        'apply() {',
        `  v=$(${redisCli} --raw HGET ${DEPLOY_VM_CONFIG_KEY} "$1") || { echo "space-config-sync: Redis unreachable" >&2; exit 1; }`,
        '  [ -n "$v" ] || return 0',
        // the check runs a container: not again for the document last applied, while its file is as written
        `  if printf '%s\\n' "$v" | cmp -s - "${seen}/$1.json" && cmp -s "$2" "${seen}/$1.env"; then return 0; fi`,
        `  if ! printf '%s\\n' "$v" | podman run --rm -i --network none --cap-drop all --security-opt no-new-privileges -v ${VM_CONFIG_POLICY_FILE}:${VM_CONFIG_POLICY_FILE}:ro "$img" node runtime/cli/vm-config-apply.ts ${VM_CONFIG_POLICY_FILE} "$1" > "$2.sync"; then`,
        '    echo "space-config-sync: refusing $1 (see above); its env file is left as it is" >&2',
        '    rm -f "$2.sync"; rc=1; return 0',
        '  fi',
        `  printf '%s\\n' "$v" > "${seen}/$1.json"`,
        `  cp "$2.sync" "${seen}/$1.env"`,
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
