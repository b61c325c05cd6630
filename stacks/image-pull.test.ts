/**
 * Pulling the SPACE image from a registry that wants credentials (issue 42 item 4): every pod that
 * runs the image names a pull Secret, made by the stack from `space:imagePullUsername`/`Password`
 * or given by name (`space:imagePullSecretName`); bad combinations are refused at preview.
 */
import { describe, expect, it } from 'vitest';
import { dockerConfigJson, imageRegistry } from '../providers/image-pull.ts';
import { schemaProblems } from '../providers/testing/k8s-schema.ts';
import { plaintextOccurrences, type RecordedResource, unwrapSecrets } from '../providers/testing/mocks.ts';
import { fails, podSpecOf, render, VARIANTS, withSecrets } from './test-stacks.ts';

type Obj = Record<string, unknown>;
const PULL_PASSWORD = 'ghp_pull-token-that-must-stay-secret-42';

/** Every workload whose pods run the SPACE image (any container or init container from the repository). */
function spaceWorkloads(recorded: RecordedResource[], repository: string) {
  return recorded
    .filter((r) => /^kubernetes:apps\/v1:(Deployment|DaemonSet|StatefulSet)$/.test(r.type))
    .filter((r) => {
      const pod = podSpecOf(r) as { containers: Obj[]; initContainers?: Obj[] };
      return [...pod.containers, ...(pod.initContainers ?? [])].some((c) =>
        String(c['image']).startsWith(`${repository}:`),
      );
    });
}

describe('image pull credentials', () => {
  it('imageRegistry follows the reference grammar: a first component with "." or ":" or localhost is the registry, else Docker Hub', () => {
    expect(imageRegistry('ghcr.io/space-sandbox/space')).toBe('ghcr.io');
    expect(imageRegistry('registry.local:5000/space')).toBe('registry.local:5000');
    expect(imageRegistry('localhost/space')).toBe('localhost');
    expect(imageRegistry('space-sandbox/space')).toBe('docker.io');
    expect(JSON.parse(dockerConfigJson('docker.io', 'u', 'p'))).toEqual({
      auths: { 'https://index.docker.io/v1/': { username: 'u', password: 'p', auth: 'dTpw' } },
    });
  });

  it.each(['kind', 'coreweave', 'akamai-lke'])(
    '%s: a user name and password make one dockerconfigjson Secret every SPACE pod pulls with',
    async (variant) => {
      const repository = 'registry.example.com:5000/team/space';
      const raw = {
        ...withSecrets(VARIANTS[variant]!),
        imageRepository: repository,
        imagePullUsername: 'robot$space',
        imagePullPassword: PULL_PASSWORD,
      };
      expect(fails(raw)).toEqual([]);
      const recorded = await render(raw);
      const pull = recorded.filter(
        (r) =>
          r.type === 'kubernetes:core/v1:Secret' &&
          (unwrapSecrets(r.inputs) as { type: string }).type === 'kubernetes.io/dockerconfigjson',
      );
      expect(pull).toHaveLength(1);
      const secret = unwrapSecrets(pull[0]!.inputs) as Obj & {
        metadata: { name: string };
        stringData: Record<string, string>;
      };
      expect(schemaProblems(secret)).toEqual([]);
      expect(JSON.parse(secret.stringData['.dockerconfigjson']!)).toEqual({
        auths: {
          'registry.example.com:5000': {
            username: 'robot$space',
            password: PULL_PASSWORD,
            auth: Buffer.from(`robot$space:${PULL_PASSWORD}`).toString('base64'),
          },
        },
      });
      // the password (and its base64 form) only inside a secret
      const b64 = Buffer.from(`robot$space:${PULL_PASSWORD}`).toString('base64');
      const leaks = recorded.flatMap((r) => [
        ...plaintextOccurrences(r.inputs, PULL_PASSWORD),
        ...plaintextOccurrences(r.inputs, b64),
      ]);
      expect(leaks).toEqual([]);
      const workloads = spaceWorkloads(recorded, repository);
      // api, router, every agent and gateway (and LKE's firewall attacher)
      expect(workloads.length).toBeGreaterThanOrEqual(4);
      for (const w of workloads)
        expect(podSpecOf(w)['imagePullSecrets'], w.name).toEqual([{ name: secret.metadata.name }]);
    },
  );

  it('an existing Secret is named by every SPACE pod and nothing is made', async () => {
    const raw = { ...withSecrets(VARIANTS['coreweave']!), imagePullSecretName: 'corp-registry' };
    const recorded = await render(raw);
    expect(recorded.filter((r) => JSON.stringify(r.inputs).includes('dockerconfigjson'))).toEqual([]);
    const workloads = spaceWorkloads(recorded, raw['imageRepository']!);
    expect(workloads.length).toBeGreaterThanOrEqual(4);
    for (const w of workloads) expect(podSpecOf(w)['imagePullSecrets']).toEqual([{ name: 'corp-registry' }]);
  });

  it('half a login, a user name with a colon, both ways at once, or a Secret name on VMs are refused', () => {
    const kind = withSecrets(VARIANTS['kind']!);
    expect(fails({ ...kind, imagePullUsername: 'u' })).toEqual([
      'space:imagePullUsername and space:imagePullPassword: set both or neither',
    ]);
    expect(fails({ ...kind, imagePullUsername: 'a:b', imagePullPassword: 'p' })).toEqual([
      'space:imagePullUsername: must be non-empty, without ":" or spaces',
    ]);
    expect(
      fails({ ...kind, imagePullUsername: 'u', imagePullPassword: 'p', imagePullSecretName: 'Bad_Name' }),
    ).toEqual([
      'space:imagePullSecretName and space:imagePullUsername: set one or the other',
      'space:imagePullSecretName: not a Kubernetes Secret name ("Bad_Name")',
    ]);
    expect(fails({ ...withSecrets(VARIANTS['akamai']!), imagePullSecretName: 'corp-registry' })).toEqual([
      'space:imagePullSecretName: kubernetes mode only (a Secret in the cluster)',
    ]);
  });
});
