/**
 * Pull credentials on VMs: podman's auth file as rendered, read back by this host's buildah (the
 * same containers-auth.json(5) reader as podman; offline, `login --get-login`), and every pull a
 * VM makes (first boot, `space-upgrade`) naming it.
 */
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { imageRegistry, registryAuthFile } from '../image-pull.ts';
import type { NodePool } from '../node-pool.ts';
import { agentPlan, controlPlan, toShellScript } from './cloud-init.ts';

const pool: NodePool = {
  name: 'default',
  driver: 'gvisor',
  instanceType: 'g6-dedicated-4',
  count: 1,
  labels: {},
  allowUnverifiedKvm: false,
};
const common = {
  version: '0.1.0',
  imageRepository: 'registry.example:5000/space/space',
  privateCidr: '10.10.0.0/24',
  redisPassword: 'redis-pw-0123456789',
  imagePull: { username: 'robot$space', password: 'tok-9f8e7d:with/odd+chars' },
};
const plans = {
  control: controlPlan({ ...common, routerUrl: 'https://router.example.com' }),
  agent: agentPlan({ ...common, pool, controlAddress: '10.10.0.2' }),
};
const dir = mkdtempSync(join(tmpdir(), 'space-authfile-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
const buildah = spawnSync('buildah', ['--version']).status === 0;

describe('image pull credentials on VMs', () => {
  it('the registry is the repository’s first component when it names a host, else Docker Hub', () => {
    expect(imageRegistry('ghcr.io/space-sandbox/space')).toBe('ghcr.io');
    expect(imageRegistry('registry.example:5000/space/space')).toBe('registry.example:5000');
    expect(imageRegistry('localhost/space')).toBe('localhost');
    expect(imageRegistry('spacesandbox/space')).toBe('docker.io');
  });

  it.each(Object.entries(plans))(
    '%s: writes the root-only auth file, and every pull names it',
    (_role, plan) => {
      const auth = plan.files.find((f) => f.path === '/etc/containers/auth.json')!;
      expect(auth.mode).toBe('0600');
      expect(JSON.parse(auth.content)).toEqual({
        auths: {
          'registry.example:5000': {
            auth: Buffer.from('robot$space:tok-9f8e7d:with/odd+chars').toString('base64'),
          },
        },
      });
      const pulls = [...plan.commands, ...plan.files.map((f) => f.content)]
        .join('\n')
        .split('\n')
        .filter((l) => /podman pull/.test(l));
      expect(pulls.length).toBeGreaterThanOrEqual(2); // first boot and space-upgrade
      for (const l of pulls) expect(l).toContain('podman pull --authfile /etc/containers/auth.json ');
      // the credentials only there: no command line, no other file
      expect(plan.commands.join('\n')).not.toContain('tok-9f8e7d');
      expect(plan.files.filter((f) => f.content.includes('cm9ib3Qk')).map((f) => f.path)).toEqual([
        '/etc/containers/auth.json',
      ]);
    },
  );

  it('without credentials the file is there, empty: the same pulls go anonymously', () => {
    const plan = agentPlan({ ...common, imagePull: undefined, pool, controlAddress: '10.10.0.2' });
    expect(JSON.parse(plan.files.find((f) => f.path === '/etc/containers/auth.json')!.content)).toEqual({
      auths: {},
    });
    expect(toShellScript(plan)).toContain('podman pull --authfile /etc/containers/auth.json ');
  });

  it('a user name with ":" is refused (the auth field is "user:password")', () => {
    expect(() => registryAuthFile('ghcr.io/x/y', { username: 'a:b', password: 'p' })).toThrow(
      /must not contain/,
    );
  });

  it.skipIf(!buildah)(
    'the rendered file is what containers-auth.json(5) readers take: buildah finds the login for that registry only',
    () => {
      const file = join(dir, 'auth.json');
      writeFileSync(file, plans.agent.files.find((f) => f.path === '/etc/containers/auth.json')!.content, {
        mode: 0o600,
      });
      const login = (registry: string) =>
        spawnSync('buildah', ['login', '--get-login', '--authfile', file, registry], { encoding: 'utf8' });
      expect(login('registry.example:5000')).toMatchObject({ status: 0, stdout: 'robot$space\n' });
      expect(login('ghcr.io').status).not.toBe(0);
      writeFileSync(file, registryAuthFile('ghcr.io/space-sandbox/space'));
      expect(login('ghcr.io').status).not.toBe(0);
    },
  );
});
