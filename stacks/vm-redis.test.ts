/**
 * The secrets of the vm stacks' user data under the mock runtime. The Redis password: every VM's
 * user data holds it (the only channel into a new VM), as a Pulumi secret, in root-only files,
 * the same on every `pulumi up`; `space:redisPassword` replaces the derived one. The image pull
 * credentials (`space:imagePullUsername`, secret `space:imagePullPassword`): in podman's auth file
 * on every VM.
 */
import { hkdfSync } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { isWireSecret, plaintextOccurrences } from '../providers/testing/mocks.ts';
import { fails, render, SECRETS, VARIANTS, vmScripts, withSecrets } from './test-stacks.ts';

const derived = Buffer.from(
  hkdfSync('sha256', SECRETS.bootstrapApiKey, '', 'space vm redis password', 32),
).toString('hex');
const vmTypes = ['linode:index/instance:Instance', 'pulumi-nodejs:dynamic/crusoe:Instance'];

// five VMs per render since space:controlPlane: seconds each on a loaded host (not a speed goal)
describe.each(['akamai', 'crusoe'])('Redis password of stack %s', { timeout: 60_000 }, (name) => {
  it('every VM gets it, only inside a secret: the user data is a secret input, and no other input holds it', async () => {
    const recorded = await render(withSecrets(VARIANTS[name]!));
    const vms = recorded.filter((r) => vmTypes.includes(r.type));
    // three control VMs (the stack files' space:controlPlane) and two nodes
    expect(vms.length).toBe(5);
    for (const vm of vms) {
      const ud = vm.inputs[vm.type.startsWith('linode') ? 'metadatas' : 'startupScript'];
      expect(isWireSecret(ud)).toBe(true);
    }
    for (const script of Object.values(vmScripts(recorded))) {
      expect(script).toContain(`redis-sentinel://:${derived}@`);
    }
    for (const c of ['space-control', 'space-control-1', 'space-control-2'])
      expect(vmScripts(recorded)[c]).toContain(`requirepass ${derived}`);
    const leaks = recorded.flatMap((r) =>
      plaintextOccurrences(r.inputs, derived).map((p) => `${r.name}: ${p}`),
    );
    expect(leaks).toEqual([]);
  });

  it('space:redisPassword replaces the derived one; one that does not fit a URL or redis.conf is refused', async () => {
    const pw = 'operator-chosen-pw-0123';
    const recorded = await render(withSecrets({ ...VARIANTS[name]!, redisPassword: pw }));
    const scripts = Object.values(vmScripts(recorded)).join('\n');
    expect(scripts).toContain(`redis-sentinel://:${pw}@`);
    expect(scripts).not.toContain(derived);
    expect(fails({ ...VARIANTS[name]!, redisPassword: 'has a space 0123456' })).toEqual([
      expect.stringMatching(/^space:redisPassword: in vm mode 16-128 characters/),
    ]);
    // a short one: that one problem (the kubernetes-mode length rule is not repeated beside it)
    expect(fails({ ...VARIANTS[name]!, redisPassword: 'short' })).toEqual([
      expect.stringMatching(/^space:redisPassword: in vm mode 16-128 characters/),
    ]);
  });
});

describe.each(['akamai', 'crusoe'])('image pull credentials of stack %s', { timeout: 60_000 }, (name) => {
  const pull = { imagePullUsername: 'robot-space', imagePullPassword: 'pull-token-5b1d9c0e' };

  it('every VM gets the auth file for the repository’s registry, the token only inside a secret', async () => {
    const raw = { ...VARIANTS[name]!, imageRepository: 'registry.example:5000/space/space', ...pull };
    const recorded = await render(withSecrets(raw));
    const auth = Buffer.from(`robot-space:${pull.imagePullPassword}`).toString('base64');
    const scripts = Object.values(vmScripts(recorded));
    expect(scripts).toHaveLength(5);
    for (const s of scripts) {
      expect(s).toContain(`"registry.example:5000": {`);
      expect(s).toContain(`"auth": "${auth}"`);
    }
    const leaks = recorded.flatMap((r) =>
      [pull.imagePullPassword, auth].flatMap((n) =>
        plaintextOccurrences(r.inputs, n).map((p) => `${r.name}: ${p}`),
      ),
    );
    expect(leaks).toEqual([]);
  });

  it('one without the other, or a user name with ":", is refused at preview', () => {
    expect(fails({ ...VARIANTS[name]!, imagePullUsername: 'robot' })).toEqual([
      'space:imagePullUsername and space:imagePullPassword: set both or neither',
    ]);
    expect(fails({ ...VARIANTS[name]!, imagePullPassword: 'x' })).toEqual([
      'space:imagePullUsername and space:imagePullPassword: set both or neither',
    ]);
    expect(fails({ ...VARIANTS[name]!, ...pull, imagePullUsername: 'a:b' })).toEqual([
      expect.stringMatching(/^space:imagePullUsername: must be non-empty, without ":"/),
    ]);
  });
});
