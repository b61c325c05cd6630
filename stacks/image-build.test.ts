/**
 * `space:imageBuild`: `pulumi up` builds and pushes the image before anything runs it.
 */
import { generateKeyPairSync } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import * as pulumi from '@pulumi/pulumi';
import { describe, expect, it } from 'vitest';
import { installMocks, settle } from '../providers/testing/mocks.ts';
import { generateCaPem } from '../runtime/gateway/ca.ts';
import type { ConfigKey } from './config.ts';
import { imageBuildCommand, run } from './program.ts';

const CA = await generateCaPem();
const kind: Partial<Record<ConfigKey, string>> = {
  cloud: 'kind',
  mode: 'kubernetes',
  version: '0.3.1',
  imageRepository: 'registry.example.com/space',
  signingKey: generateKeyPairSync('ed25519').privateKey.export({ type: 'pkcs8', format: 'pem' }).toString(),
  redisPassword: 'pw-0123456789abcdef',
  gatewayCaCertificate: CA.certPem,
  gatewayCaKey: CA.keyPem,
};

describe('space:imageBuild', () => {
  it('the build command is the repository’s own build, tagged and pushed as the deployed image', () => {
    const ref = 'registry.example.com/space:0.3.1';
    const b = imageBuildCommand(ref);
    expect(b.environment).toEqual({ SPACE_IMAGE_TAG: ref });
    expect(b.create).toContain('bash scripts/image.sh');
    expect(b.create).toContain('buildah push "$SPACE_IMAGE_TAG" "docker://$SPACE_IMAGE_TAG"');
    // the script builds the tag it is given
    const script = readFileSync(new URL('../scripts/image.sh', import.meta.url), 'utf8');
    expect(script).toMatch(/tag=\$\{SPACE_IMAGE_TAG:-/);
  });

  it('off by default: no command; on: one command for the tag, run from the repository root', async () => {
    let recorded = await installMocks();
    run((k) => kind[k]);
    await settle(recorded);
    expect(recorded.some((r) => r.type === 'command:local:Command')).toBe(false);

    recorded = await installMocks();
    run((k) => ({ ...kind, imageBuild: 'true' })[k]);
    await settle(recorded);
    const cmd = recorded.filter((r) => r.type === 'command:local:Command');
    expect(cmd).toHaveLength(1);
    expect(cmd[0]!.inputs).toMatchObject({
      environment: { SPACE_IMAGE_TAG: 'registry.example.com/space:0.3.1' },
      triggers: ['registry.example.com/space:0.3.1'],
    });
    expect(existsSync(join(String(cmd[0]!.inputs['dir']), 'scripts/image.sh'))).toBe(true);
  });

  it('nothing that runs the image is registered before the push finished (the Kubernetes provider waits for it)', async () => {
    // an engine whose image build takes 300 ms: a resource that depends on it is registered after
    const seen: { type: string; at: number }[] = [];
    let pushedAt = Number.POSITIVE_INFINITY;
    await pulumi.runtime.setMocks(
      {
        async newResource(args) {
          seen.push({ type: args.type, at: performance.now() });
          if (args.type === 'command:local:Command') {
            await sleep(300);
            pushedAt = performance.now();
          }
          return { id: `${args.name}-id`, state: args.inputs };
        },
        call: (args) => args.inputs,
      },
      'space',
      'test',
      false,
    );
    run((k) => ({ ...kind, imageBuild: 'true' })[k]);
    await sleep(1500);
    // the space:<cloud>:Stack component holds no state and runs nothing: only what it makes counts
    const after = seen.filter(
      (r) => r.type !== 'command:local:Command' && !/^space:[a-z]+:Stack$/.test(r.type),
    );
    expect(after.length).toBeGreaterThan(10);
    for (const r of after) expect(r.at, r.type).toBeGreaterThan(pushedAt);
  });
});
