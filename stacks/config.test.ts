/**
 * The stack configuration's validation: every problem of a config is refused before anything is
 * created, with its key; one test renders (cert-manager TLS) to show what a valid config makes.
 */
import { generateKeyPairSync } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { schemaProblems } from '../providers/testing/k8s-schema.ts';
import { installMocks, unwrapSecrets } from '../providers/testing/mocks.ts';
import { CONFIG_KEYS } from './config.ts';
import { run } from './program.ts';
import { CA, componentOf, fails, podSpecOf, render, VARIANTS, withSecrets } from './test-stacks.ts';

type Obj = Record<string, unknown>;

describe('configuration validation', () => {
  it('the router URL: required where the router address is not known before it exists; TLS needs issuer and hostnames together', () => {
    expect(fails(withSecrets({ ...VARIANTS['crusoe']!, routerUrl: undefined }))).toEqual([
      expect.stringContaining('space:routerUrl: required on crusoe'),
    ]);
    expect(fails(withSecrets({ ...VARIANTS['coreweave']!, routerUrl: undefined }))).toEqual([
      expect.stringContaining('space:routerUrl: required on coreweave'),
    ]);
    expect(fails(withSecrets({ ...VARIANTS['coreweave']!, routerUrl: 'router.example.com' }))).toEqual([
      expect.stringContaining('must be http(s)://'),
    ]);
    expect(fails(withSecrets({ ...VARIANTS['coreweave-tls']!, tlsHostnames: undefined }))).toEqual(
      expect.arrayContaining([expect.stringContaining('space:tlsIssuer and space:tlsHostnames')]),
    );
    expect(
      fails(withSecrets({ ...VARIANTS['coreweave-tls']!, tlsHostnames: JSON.stringify({ api: 'x' }) })),
    ).toEqual([expect.stringContaining('space:tlsHostnames: must be')]);
    expect(fails(withSecrets(VARIANTS['coreweave-tls']!))).toEqual([]);
    // kind and akamai vm derive it
    expect(fails(withSecrets(VARIANTS['kind']!))).toEqual([]);
    expect(fails(withSecrets(VARIANTS['akamai']!))).toEqual([]);
  });

  it('coreweave with cert-manager TLS: a Certificate custom resource for both names; both services serve HTTPS on 443', async () => {
    const recorded = await render(withSecrets(VARIANTS['coreweave-tls']!));
    const cert = recorded.find((r) => r.type === 'kubernetes:cert-manager.io/v1:Certificate')!;
    expect(cert).toBeDefined();
    const body = unwrapSecrets(cert.inputs) as Obj;
    expect(schemaProblems(body)).toEqual([]);
    expect(body['spec']).toMatchObject({
      secretName: 'space-tls',
      dnsNames: ['api.space.example.com', 'router.space.example.com'],
      issuerRef: { name: 'letsencrypt', kind: 'ClusterIssuer' },
    });
    const svcs = recorded
      .filter((r) => r.type === 'kubernetes:core/v1:Service')
      .map((r) => unwrapSecrets(r.inputs) as { metadata: { name: string }; spec: { ports: Obj[] } });
    for (const name of ['space-api', 'space-router'])
      expect(svcs.find((x) => x.metadata.name === name)!.spec.ports[0]!['port']).toBe(443);
    const api = recorded.find((r) => r.type === 'kubernetes:apps/v1:Deployment' && componentOf(r) === 'api')!;
    const env = (podSpecOf(api)['containers'] as { env: { name: string; value?: string }[] }[])[0]!.env;
    expect(env.find((e) => e.name === 'SPACE_ROUTER_URL')?.value).toBe('https://router.space.example.com');
  });

  it('servers in sandboxes (tlsHostnames.sandboxes): the Certificate also carries *.<it>; a bad name and Crusoe’s HTTP-01 are refused', async () => {
    const names = { api: 'api.space.example.com', router: 'router.space.example.com' };
    const withSandboxes = (sandboxes: unknown, base = 'coreweave-tls') =>
      withSecrets({ ...VARIANTS[base]!, tlsHostnames: JSON.stringify({ ...names, sandboxes }) });
    expect(fails(withSandboxes('sbx.space.example.com'))).toEqual([]);
    expect(fails(withSandboxes('not a name'))).toEqual([
      expect.stringContaining('space:tlsHostnames.sandboxes: must be a DNS name'),
    ]);
    expect(fails(withSandboxes('sbx.space.example.com', 'crusoe'))).toEqual(
      expect.arrayContaining([expect.stringContaining('space:tlsHostnames.sandboxes: not on crusoe')]),
    );
    const recorded = await render(withSandboxes('sbx.space.example.com'));
    const cert = recorded.find((r) => r.type === 'kubernetes:cert-manager.io/v1:Certificate')!;
    const body = unwrapSecrets(cert.inputs) as Obj;
    expect(schemaProblems(body)).toEqual([]);
    expect((body['spec'] as Obj)['dnsNames']).toEqual([names.api, names.router, '*.sbx.space.example.com']);
  });

  it('a VMM driver on a type without verified KVM fails before anything is created, with every problem', () => {
    const problems = fails({
      ...VARIANTS['akamai'],
      nodePools: JSON.stringify([
        { name: 'a', driver: 'firecracker', instanceType: 'g6-dedicated-4' },
        { name: 'b', driver: 'gvisor', instanceType: 'g6-nope' },
      ]),
      version: '',
    });
    expect(problems).toHaveLength(3);
    expect(problems).toEqual(
      expect.arrayContaining([
        expect.stringContaining(
          'space:nodePools[0]: driver "firecracker" needs KVM but KVM on "g6-dedicated-4" is unverified',
        ),
        expect.stringContaining('space:nodePools[1].instanceType: "g6-nope" is not in the akamai catalogue'),
        expect.stringContaining('space:version: required'),
      ]),
    );
  });

  it('opting in after a probe allows a VMM driver on Linode', () => {
    const nodePools = JSON.stringify([
      { name: 'a', driver: 'firecracker', instanceType: 'g6-dedicated-4', allowUnverifiedKvm: true },
    ]);
    expect(fails({ ...VARIANTS['akamai'], nodePools, imageVmms: '["gvisor","qemu","firecracker"]' })).toEqual(
      [],
    );
  });

  it('crusoe refuses Firecracker (Cloud Hypervisor is its only inner hypervisor)', () => {
    const nodePools = JSON.stringify([{ name: 'a', driver: 'firecracker', instanceType: 'c1a.8x' }]);
    expect(fails({ ...VARIANTS['crusoe'], nodePools })).toEqual([
      expect.stringContaining('crusoe cannot run "firecracker"'),
    ]);
  });

  it('kubernetes mode needs the signing key and a Redis password; overrides of deployment-owned settings are refused', () => {
    const problems = fails({
      ...VARIANTS['kind'],
      agentEnv: JSON.stringify({ SPACE_DRIVER: 'x', SPACE_NOPE: '1' }),
    });
    expect(problems).toEqual(
      expect.arrayContaining([
        expect.stringMatching(/^space:signingKey: required/),
        expect.stringMatching(/^space:redisPassword: required/),
        'space:agentEnv.SPACE_DRIVER: set by the deployment; cannot be overridden',
        'space:agentEnv.SPACE_NOPE: not a agent setting (see README.md)',
      ]),
    );
  });

  it('kubernetes mode with the gateway needs a valid CA; vm mode refuses one (each node makes its own)', () => {
    const { gatewayCaCertificate: _c, gatewayCaKey: _k, ...noCa } = withSecrets(VARIANTS['kind']!);
    expect(fails(noCa)).toEqual([
      expect.stringMatching(/^space:gatewayCaCertificate and space:gatewayCaKey: required/),
    ]);
    expect(fails({ ...noCa, gatewayEnabled: 'false' })).toEqual([]);
    const other = generateKeyPairSync('ec', { namedCurve: 'P-256' }).privateKey.export({
      type: 'pkcs8',
      format: 'pem',
    });
    expect(fails({ ...noCa, gatewayCaCertificate: CA.certPem, gatewayCaKey: other.toString() })).toEqual([
      'space:gatewayCaCertificate/gatewayCaKey: deployment CA key does not match its certificate',
    ]);
    expect(
      fails({ ...VARIANTS['akamai'], gatewayCaCertificate: CA.certPem, gatewayCaKey: CA.keyPem }),
    ).toEqual([
      expect.stringMatching(/^space:gatewayCaCertificate: not used in vm mode/),
      expect.stringMatching(/^space:gatewayCaKey: not used in vm mode/),
    ]);
  });

  it('gateway settings are checked: resolvers, deny CIDRs that still cover the deployment, gatewayEnv', () => {
    expect(
      fails({
        ...VARIANTS['crusoe'],
        gatewayUpstreamDns: JSON.stringify(['10.77.128.2:53', '[2606:4700:4700::1111]:53']),
        gatewayDenyCidrs: JSON.stringify(['10.0.0.0/8', 'fc00::/7']),
        gatewayEnv: JSON.stringify({ SPACE_GATEWAY_DNS_QPS: '20' }),
      }),
    ).toEqual([]);
    expect(
      fails({
        ...VARIANTS['crusoe'],
        gatewayUpstreamDns: JSON.stringify(['1.1.1.1']),
        gatewayDenyCidrs: JSON.stringify(['192.168.0.0/16']),
        gatewayEnv: JSON.stringify({
          SPACE_GATEWAY_TLS_PORT: '443',
          SPACE_GATEWAY_UPSTREAM_DNS: '8.8.8.8:53',
          SPACE_NODE_ID: 'x',
        }),
      }),
    ).toEqual([
      'space:gatewayEnv.SPACE_GATEWAY_TLS_PORT: set by the deployment; cannot be overridden',
      'space:gatewayEnv.SPACE_GATEWAY_UPSTREAM_DNS: set it with space:gatewayUpstreamDns',
      'space:gatewayEnv.SPACE_NODE_ID: not a gateway setting (see README.md)',
      expect.stringMatching(/^space:gatewayUpstreamDns: must be a list of "ip:port"/),
      "space:gatewayDenyCidrs: must cover 10.77.128.0/24 (the deployment's own network; sandboxes must not reach it)",
      "space:gatewayDenyCidrs: must cover 10.77.0.0/16 (the deployment's own network; sandboxes must not reach it)",
    ]);
    expect(
      fails({ ...VARIANTS['crusoe'], agentEnv: JSON.stringify({ SPACE_GATEWAY_CONTROL_SOCKET: '' }) }),
    ).toEqual(['space:agentEnv.SPACE_GATEWAY_CONTROL_SOCKET: set by the deployment; cannot be overridden']);
  });

  it('OpenTelemetry variables (OTEL_*) pass to the services that trace; the API’s reach the router too', async () => {
    const otel = { OTEL_EXPORTER_OTLP_ENDPOINT: 'http://otel-collector.observability:4318' };
    const raw = withSecrets({
      ...VARIANTS['kind'],
      apiEnv: JSON.stringify({ ...otel, OTEL_TRACES_SAMPLER: 'parentbased_traceidratio' }),
      agentEnv: JSON.stringify(otel),
    });
    expect(fails(raw)).toEqual([]);
    // the gateway exports no traces; a name that is not OTEL_'s own pattern is still refused
    expect(
      fails({ ...raw, gatewayEnv: JSON.stringify(otel), apiEnv: JSON.stringify({ OTEL_x: '1' }) }),
    ).toEqual([
      'space:apiEnv.OTEL_x: not a api setting (see README.md)',
      'space:gatewayEnv.OTEL_EXPORTER_OTLP_ENDPOINT: the gateway exports no traces',
    ]);
    const recorded = await render(raw);
    const envOf = (component: string) => {
      const w = recorded.find(
        (r) =>
          ['kubernetes:apps/v1:Deployment', 'kubernetes:apps/v1:DaemonSet'].includes(r.type) &&
          componentOf(r) === component,
      )!;
      const c = (
        podSpecOf(w)['containers'] as { name: string; env: { name: string; value?: string }[] }[]
      ).find((x) => x.name === component)!;
      return Object.fromEntries(c.env.map((e) => [e.name, e.value]));
    };
    for (const component of ['api', 'router', 'agent'])
      expect(envOf(component), component).toMatchObject(otel);
    expect(envOf('router')['OTEL_TRACES_SAMPLER']).toBe('parentbased_traceidratio');
    expect(envOf('gateway')).not.toHaveProperty('OTEL_EXPORTER_OTLP_ENDPOINT');
  });

  it('a key SPACE does not declare is refused with the nearest valid name, not silently ignored', () => {
    const raw = withSecrets(VARIANTS['kind']!);
    expect(
      fails({
        ...raw,
        nodePool: '[]',
        APIREPLICAS: '3',
        imageRepositry: 'x',
        gatewayEnable: 'false',
        zzzz: '1',
      }),
    ).toEqual([
      'space:nodePool: not a SPACE configuration key; did you mean `space:nodePools`?',
      'space:APIREPLICAS: not a SPACE configuration key; did you mean `space:apiReplicas`?',
      'space:imageRepositry: not a SPACE configuration key; did you mean `space:imageRepository`?',
      'space:gatewayEnable: not a SPACE configuration key; did you mean `space:gatewayEnabled`?',
      'space:zzzz: not a SPACE configuration key (docs/deployment.md lists every key)',
    ]);
    // reported with the other problems, even when the cloud itself is wrong
    expect(fails({ cloud: 'gke', regoin: 'x' })).toEqual([
      'space:regoin: not a SPACE configuration key; did you mean `space:region`?',
      expect.stringMatching(/^space:cloud: must be one of/),
    ]);
  });

  it('the program reads the key names from the Pulumi runtime: a misspelt key in the stack fails the preview', async () => {
    const raw = withSecrets(VARIANTS['kind']!);
    const config = Object.fromEntries(
      Object.entries({ ...raw, agentDrainSecond: '60' })
        .filter(([, v]) => v !== undefined)
        .map(([k, v]) => [`space:${k}`, v!]),
    );
    await installMocks({ ...config, 'kubernetes:context': 'other-namespace-is-not-ours' });
    expect(() => run()).toThrow(
      /space:agentDrainSecond: not a SPACE configuration key; did you mean `space:agentDrainSeconds`\?/,
    );
    delete config['space:agentDrainSecond'];
    await installMocks(config);
    expect(() => run()).not.toThrow();
  });

  it('a Redis password shorter than 16 characters is refused: it is the in-cluster Redis’s only gate', () => {
    expect(fails({ ...withSecrets(VARIANTS['kind']!), redisPassword: 'short-pw' })).toEqual([
      expect.stringMatching(/^space:redisPassword: at least 16 characters/),
    ]);
  });

  it('keys of another cloud are refused', () => {
    expect(fails(withSecrets({ ...VARIANTS['kind'], crusoeProjectId: 'x' }))).toEqual([
      'space:crusoeProjectId: does not apply to kind (only crusoe)',
    ]);
  });

  it('every stack file sets only declared keys, and docs/deployment.md documents every key', () => {
    const declared = Object.keys(CONFIG_KEYS);
    for (const raw of Object.values(VARIANTS))
      for (const k of Object.keys(raw)) expect(declared).toContain(k);
    const doc = readFileSync(new URL('../docs/deployment.md', import.meta.url), 'utf8');
    for (const k of declared) expect(doc, `space:${k}`).toContain(`| \`space:${k}\``);
  });
});
