/**
 * The rendered startup script run for real, twice, as Crusoe runs it (at every boot): under bash,
 * as root, inside a throwaway copy-on-write view of this machine's root (a private mount namespace
 * with an overlay over `/`, then chroot), with stubs for what would touch the host (apt-get,
 * systemctl, podman, nft, modprobe, sysctl, redis-cli, openssl). Between the two "boots" the VM is
 * upgraded in place with its own `space-upgrade`: the second boot must not rewind it.
 *
 * Needs root (mount namespaces, overlayfs, chroot); skipped otherwise.
 */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import type { NodePool } from '../node-pool.ts';
import {
  agentPlan,
  controlPlan,
  LETS_ENCRYPT_DIRECTORY,
  PROVISIONED_MARKER,
  toShellScript,
} from './cloud-init.ts';

const root = process.getuid?.() === 0;
const pool: NodePool = {
  name: 'default',
  driver: 'cloud-hypervisor',
  instanceType: 'c1a.8x',
  count: 1,
  labels: {},
  allowUnverifiedKvm: false,
};
const common = {
  version: '0.1.0',
  imageRepository: 'registry.example/space',
  privateCidr: '10.10.0.0/24',
  redisPassword: 'redis-pw-0123456789',
};

const STUBS = [
  'apt-get',
  'systemctl',
  'podman',
  'nft',
  'modprobe',
  'sysctl',
  'redis-cli',
  'openssl',
  'certbot',
];
const work = mkdtempSync(join(tmpdir(), 'space-startup-'));
afterAll(() => rmSync(work, { recursive: true, force: true }));

/**
 * Runs `steps` (bash lines, run in the chroot one after another) in an overlay of `/`; returns
 * what the last step printed. Every stub appends its name and arguments to /space-calls.
 */
function inOverlay(script: string, steps: string[]): string {
  writeFileSync(join(work, 'script.sh'), script);
  const stub = '#!/bin/bash\necho "$(basename "$0") $*" >> /space-calls\n';
  const inner = [
    'set -euo pipefail',
    `T=${work}/ovl`,
    'mkdir -p $T && mount -t tmpfs tmpfs $T && mkdir $T/u $T/w $T/m',
    'mount -t overlay overlay -o lowerdir=/,upperdir=$T/u,workdir=$T/w $T/m',
    'mkdir -p $T/m/space-stubs',
    ...STUBS.map((s) => `printf '%s' '${stub}' > $T/m/space-stubs/${s} && chmod 0755 $T/m/space-stubs/${s}`),
    `cp ${work}/script.sh $T/m/startup.sh`,
    // a fresh VM: nothing provisioned yet, whatever this machine has
    `rm -rf $T/m${PROVISIONED_MARKER} $T/m/etc/space`,
    ...steps.map(
      (step) =>
        `chroot $T/m /usr/bin/env -i PATH=/space-stubs:/usr/sbin:/usr/bin:/sbin:/bin /bin/bash -c ${JSON.stringify(step)}`,
    ),
  ].join('\n');
  return execFileSync('unshare', ['--mount', '--propagation', 'private', 'bash', '-c', inner], {
    encoding: 'utf8',
    timeout: 60_000,
    env: { PATH: process.env['PATH'] ?? '/usr/bin:/bin' },
  });
}

describe.skipIf(!root)('the startup script, run at every boot (Crusoe)', () => {
  const cases = {
    // as the Crusoe stack renders it: the ACME TLS unit is always there (names come later, if ever)
    control: toShellScript(
      controlPlan({
        ...common,
        routerUrl: 'https://router.space.example.com:8082',
        acme: {
          hostnames: ['api.space.example.com'],
          email: 'ops@example.com',
          server: LETS_ENCRYPT_DIRECTORY,
        },
      }),
    ),
    agent: toShellScript(agentPlan({ ...common, pool, controlAddress: '10.10.0.7' })),
  };

  it.each(Object.entries(cases))(
    '%s: a second boot after an in-place upgrade keeps the upgrade and installs nothing again',
    (_role, script) => {
      const out = inOverlay(script, [
        'bash /startup.sh > /boot1.log',
        // the runbook's in-place upgrade, with the VM's own script
        '/usr/local/sbin/space-upgrade 0.2.0',
        ': > /space-calls',
        'bash /startup.sh > /boot2.log',
        'cat /etc/space/image.env; echo ---; cat /space-calls; echo ---; cat /boot2.log',
      ]);
      const [imageEnv, calls, boot2] = out.split('---\n');
      expect(imageEnv).toBe('SPACE_IMAGE=registry.example/space:0.2.0\n');
      expect(calls).toBe('');
      expect(boot2).toContain('provisioned already');
    },
  );

  it('control: the first boot provisions (packages, units enabled, marker left)', () => {
    const out = inOverlay(cases.control, [
      'bash /startup.sh > /boot1.log',
      `test -e ${PROVISIONED_MARKER} && echo marked; cat /etc/space/image.env; cat /space-calls`,
      'stat -c "%a %n" /etc/space/redis.conf /etc/space/redis.env /etc/space/redis.password',
    ]);
    // the files with the Redis password are root-only (the mode is set before the content is written)
    expect(out).toContain(
      '600 /etc/space/redis.conf\n600 /etc/space/redis.env\n600 /etc/space/redis.password\n',
    );
    expect(out).toContain('marked\nSPACE_IMAGE=registry.example/space:0.1.0\n');
    expect(out).toMatch(/^apt-get install -y podman redis-server/m);
    expect(out).toContain('systemctl enable --now space-control-guard.service space-redis.service');
    expect(out).toContain('systemctl mask redis-server.service');
    expect(out).toMatch(/^systemctl enable --now .*space-config-sync\.timer$/m);
    expect(out).toContain('systemctl start --no-block space-tls.service');
    expect(out).toContain('podman pull --authfile /etc/containers/auth.json registry.example/space:0.1.0');
  });
});
