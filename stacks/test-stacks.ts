/**
 * The stack configurations the deploy tests render (every stack file in stacks/, plus the LKE and
 * CKS-with-TLS variants), the secrets an operator would set for them, and `render`: the program
 * run under Pulumi's mock runtime. Shared by stacks.test.ts and resources.test.ts.
 */
import { generateKeyPairSync } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { parse } from 'yaml';
import { installMocks, type RecordedResource, settle, unwrapSecrets } from '../providers/testing/mocks.ts';
import { generateCaPem } from '../runtime/gateway/ca.ts';
import { type ConfigKey, loadStackConfig, StackConfigError } from './config.ts';
import { run } from './program.ts';

export const CA = await generateCaPem();
export const SIGNING = generateKeyPairSync('ed25519')
  .privateKey.export({ type: 'pkcs8', format: 'pem' })
  .toString();
export const SECRETS = {
  signingKey: SIGNING,
  redisPassword: 'redis-pw-3f9c1e7a5b',
  kubeconfig:
    'apiVersion: v1\nkind: Config\nusers: [{name: u, user: {token: CW-SECRET-kubeconfig-token-77}}]\n',
  lkeFirewallToken: 'linode-token-for-the-firewall-attacher-91',
  bootstrapApiKey: 'space_deploymentkeyABCDEF0123456789abcdef0123',
};
export const NEEDLES = [
  SIGNING.split('\n')[1]!,
  SECRETS.redisPassword,
  'CW-SECRET-kubeconfig-token-77',
  SECRETS.lkeFirewallToken,
  SECRETS.bootstrapApiKey,
  CA.keyPem.split('\n')[1]!,
];

export type Raw = Partial<Record<ConfigKey, string>>;

/** The `space:*` values of a stack file as Pulumi stores them (objects as JSON). */
export function stackFile(stack: string): Raw {
  const doc = parse(readFileSync(new URL(`./Pulumi.${stack}.yaml`, import.meta.url), 'utf8')) as {
    config: Record<string, unknown>;
  };
  return Object.fromEntries(
    Object.entries(doc.config)
      .filter(([k]) => k.startsWith('space:'))
      .map(([k, v]) => [k.slice('space:'.length), typeof v === 'string' ? v : JSON.stringify(v)]),
  );
}

/** The secrets an operator sets for `raw` with `pulumi config set --secret`. */
export function withSecrets(raw: Raw): Raw {
  const out = { ...raw };
  if ((raw.mode ?? '') === 'kubernetes')
    Object.assign(out, {
      signingKey: SECRETS.signingKey,
      redisPassword: SECRETS.redisPassword,
      gatewayCaCertificate: CA.certPem,
      gatewayCaKey: CA.keyPem,
    });
  if (raw.cloud === 'coreweave') out.kubeconfig = SECRETS.kubeconfig;
  if (raw.cloud === 'akamai' && raw.mode === 'kubernetes') out.lkeFirewallToken = SECRETS.lkeFirewallToken;
  return withDeploymentKey(out);
}

/** `raw` with `space:bootstrapApiKey` in vm mode (required there), unless `raw` names it, even as undefined. */
export function withDeploymentKey(raw: Raw): Raw {
  const vm = (raw.mode ?? (raw.cloud === 'akamai' || raw.cloud === 'crusoe' ? 'vm' : '')) === 'vm';
  return vm && !('bootstrapApiKey' in raw) ? { ...raw, bootstrapApiKey: SECRETS.bootstrapApiKey } : raw;
}

/** The keys `raw` sets, as the stack's Pulumi config would list them (a key given as undefined is unset). */
const setKeys = (raw: Readonly<Record<string, string | undefined>>): string[] =>
  Object.keys(raw).filter((k) => raw[k] !== undefined);

export async function render(raw: Raw): Promise<RecordedResource[]> {
  const recorded = await installMocks();
  run((k) => raw[k], setKeys(raw));
  await settle(recorded);
  return recorded;
}

export const VARIANTS: Record<string, Raw> = {
  akamai: stackFile('akamai'),
  'akamai-lke': {
    ...stackFile('akamai'),
    mode: 'kubernetes',
    // control VMs are vm mode's (LKE: space:redis, space:apiReplicas)
    controlPlane: undefined,
    routerUrl: 'http://router.space.example.com',
  },
  'coreweave-tls': {
    ...stackFile('coreweave'),
    routerUrl: undefined,
    tlsIssuer: 'letsencrypt',
    tlsHostnames: JSON.stringify({ api: 'api.space.example.com', router: 'router.space.example.com' }),
  },
  coreweave: stackFile('coreweave'),
  crusoe: stackFile('crusoe'),
  kind: stackFile('kind'),
};

type Obj = Record<string, unknown>;
/** Decoded user data / startup script of every VM, by resource name. */
export function vmScripts(recorded: RecordedResource[]): Record<string, string> {
  const out: Record<string, string> = {};
  for (const r of recorded) {
    // user data holds the Redis password: the stacks pass it as a secret
    const inputs = unwrapSecrets(r.inputs) as Obj;
    if (r.type === 'linode:index/instance:Instance')
      out[r.name] = Buffer.from(
        (inputs['metadatas'] as { userData: string }[])[0]!.userData,
        'base64',
      ).toString();
    if (r.type === 'pulumi-nodejs:dynamic/crusoe:Instance') out[r.name] = String(inputs['startupScript']);
  }
  return out;
}
export const podSpecOf = (r: RecordedResource) =>
  (((unwrapSecrets(r.inputs) as Obj)['spec'] as Obj)['template'] as Obj)['spec'] as Obj;
export const componentOf = (r: RecordedResource) =>
  (((unwrapSecrets(r.inputs) as Obj)['metadata'] as Obj)['labels'] as Record<string, string>)[
    'app.kubernetes.io/component'
  ];

/** The problems the stack configuration `raw` is refused with (empty when it loads). */
export const fails = (given: Raw & Record<string, string | undefined>) => {
  const raw = withDeploymentKey(given);
  try {
    loadStackConfig((k) => raw[k as ConfigKey], setKeys(raw));
  } catch (err) {
    if (err instanceof StackConfigError) return err.problems;
    throw err;
  }
  return [];
};
