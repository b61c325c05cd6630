/**
 * The vm stacks after their first boot (configuration reaches existing VMs through space:VmConfig,
 * Crusoe's ACME TLS, Akamai's TLS at the NodeBalancer) and what every stack tells clients (the
 * router's public URL), under the mock runtime.
 */
import { createHash } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { parse } from 'yaml';
import {
  isWireSecret,
  plaintextOccurrences,
  type RecordedResource,
  unwrapSecrets,
} from '../providers/testing/mocks.ts';
import { renderEnvFile } from '../runtime/core/env-file.ts';
import { CA, fails, podSpecOf, render, SECRETS, VARIANTS, vmScripts, withSecrets } from './test-stacks.ts';

type Obj = Record<string, unknown>;

/** Env files a VM's first boot writes (`/etc/space/<name>.env`), from cloud-config or a startup script. */
function envFilesOf(script: string): Record<string, string> {
  const out: Record<string, string> = {};
  if (script.startsWith('#cloud-config')) {
    const doc = parse(script.slice(script.indexOf('\n') + 1)) as {
      write_files: { path: string; content: string }[];
    };
    for (const f of doc.write_files) {
      const m = /^\/etc\/space\/([^/]+)\.env$/.exec(f.path);
      if (m) out[m[1]!] = f.content;
    }
  } else {
    for (const m of script.matchAll(
      /cat > \/etc\/space\/([^/ ]+)\.env <<'(SPACE_EOF_\d+)'\n([\s\S]*?)\n\2\n/g,
    ))
      out[m[1]!] = `${m[3]}\n`;
  }
  return out;
}
const vmConfigOf = (recorded: RecordedResource[]) =>
  recorded.filter((r) => r.type === 'pulumi-nodejs:dynamic/space:VmConfig');

describe('vm stacks: config changes reach existing VMs through space:VmConfig', () => {
  it.each(['akamai', 'crusoe'])(
    '%s: one VmConfig writes, with the deployment key kept secret, the env files a VM made now would get',
    async (name) => {
      const recorded = await render(withSecrets(VARIANTS[name]!));
      const [vc, ...more] = vmConfigOf(recorded);
      expect(more).toEqual([]);
      expect(isWireSecret(vc!.inputs['apiKey'])).toBe(true);
      expect(unwrapSecrets(vc!.inputs['apiKey'])).toBe(SECRETS.bootstrapApiKey);
      const services = vc!.inputs['services'] as Record<string, Record<string, string>>;
      const scripts = vmScripts(recorded);
      const control = envFilesOf(scripts['space-control']!);
      const node = envFilesOf(scripts['space-node-default-0']!);
      expect(renderEnvFile(services['space-api']!)).toBe(control['space-api']);
      expect(renderEnvFile(services['space-router']!)).toBe(control['space-router']);
      expect(renderEnvFile(services['space-gateway']!)).toBe(node['space-gateway']);
      expect(renderEnvFile(services['space-agent@default']!)).toBe(node['space-agent']);
      // the API imports the key from its hash: the key itself is in no user data
      const sha = createHash('sha256').update(SECRETS.bootstrapApiKey).digest('hex');
      expect(services['space-api']!['SPACE_BOOTSTRAP_API_KEY_SHA256']).toBe(sha);
      // and the version: pulumi up with a new space:version upgrades the VMs in place
      expect(vc!.inputs['version']).toBe(VARIANTS[name]!.version);
      // every VM applies it
      for (const s of Object.values(scripts)) expect(s).toContain('space-config-sync.timer');
      expect(vc!.inputs['apiUrl']).toMatch(
        name === 'akamai' ? /^http:\/\/198\.51\.100\.10$/ : /^http:\/\/203\.0\.113\.\d+:8080$/,
      );
    },
  );

  it('a changed setting changes only what the VmConfig writes, never the VMs (they are not replaced)', async () => {
    const a = await render(withSecrets(VARIANTS['crusoe']!));
    const b = await render(
      withSecrets({ ...VARIANTS['crusoe']!, agentEnv: JSON.stringify({ SPACE_WARM_POOL_SIZE: '7' }) }),
    );
    const agent = (r: RecordedResource[]) =>
      (vmConfigOf(r)[0]!.inputs['services'] as Record<string, Record<string, string>>)[
        'space-agent@default'
      ]!;
    expect(agent(a)['SPACE_WARM_POOL_SIZE']).toBeUndefined();
    expect(agent(b)['SPACE_WARM_POOL_SIZE']).toBe('7');
    // the startup script differs too, but Instance ignores it after creation (ignoreChanges)
  });

  it('the deployment key: required in vm mode, refused in kubernetes mode, must be long and random-looking', () => {
    expect(fails({ ...VARIANTS['crusoe'], bootstrapApiKey: undefined })).toEqual([
      expect.stringContaining('space:bootstrapApiKey: required in vm mode'),
    ]);
    expect(fails({ ...VARIANTS['akamai'], bootstrapApiKey: 'space_short' })).toEqual([
      expect.stringContaining('space:bootstrapApiKey: must be'),
    ]);
    expect(
      fails(withSecrets({ ...VARIANTS['akamai-lke']!, bootstrapApiKey: SECRETS.bootstrapApiKey })),
    ).toEqual([expect.stringContaining('space:bootstrapApiKey: vm mode only')]);
  });
});

describe('crusoe: TLS on the control VM from an ACME CA', () => {
  const tlsRaw = {
    ...VARIANTS['crusoe']!,
    routerUrl: undefined,
    tlsHostnames: JSON.stringify({ api: 'api.space.example.com', router: 'router.space.example.com' }),
    acmeEmail: 'ops@example.com',
    acmeServer: 'https://acme-staging-v02.api.letsencrypt.org/directory',
    // one control VM: several cannot all prove the names over HTTP-01 (refused, stacks/ha-vm.test.ts)
    controlPlane: JSON.stringify({ replicas: 1 }),
  };

  it('the control VM asks for one certificate for both names; port 80 opens for HTTP-01; clients get https URLs', async () => {
    const recorded = await render(withSecrets(tlsRaw));
    const script = vmScripts(recorded)['space-control']!;
    expect(envFilesOf(script)['space-tls']).toBe(
      'SPACE_ACME_EMAIL=ops@example.com\nSPACE_ACME_SERVER=https://acme-staging-v02.api.letsencrypt.org/directory\nSPACE_TLS_HOSTNAMES=api.space.example.com,router.space.example.com\n',
    );
    expect(script).toContain('apt-get install -y podman redis-server openssl nftables certbot');
    expect(script).toContain('cat > /usr/local/sbin/space-tls');
    // started without waiting: a failed first certificate must not stop the provisioning script
    expect(script).toContain(
      'systemctl enable space-tls.service\nsystemctl start --no-block space-tls.service',
    );
    expect(envFilesOf(script)['space-api']).toContain(
      'SPACE_ROUTER_URL=https://router.space.example.com:8082\n',
    );
    const rules = recorded
      .filter((r) => r.type === 'pulumi-nodejs:dynamic/crusoe:FirewallRule')
      .map((r) => unwrapSecrets(r.inputs) as { name: string; sources: string[]; destinationPorts: string[] });
    expect(rules.find((r) => r.destinationPorts.includes('80'))).toMatchObject({
      sources: ['0.0.0.0/0'],
    });
    const vc = vmConfigOf(recorded)[0]!;
    expect(vc.inputs['apiUrl']).toBe('https://api.space.example.com:8080');
    // plain HTTP only to hand TLS to a control VM that does not serve it yet (see vm-config-client.ts)
    expect(vc.inputs['plainApiUrl']).toMatch(/^http:\/\/203\.0\.113\.\d+:8080$/);
  });

  it('without names: no port 80, plain HTTP, the TLS unit present but idle (TLS can be turned on later)', async () => {
    const recorded = await render(withSecrets(VARIANTS['crusoe']!));
    const script = vmScripts(recorded)['space-control']!;
    expect(envFilesOf(script)['space-tls']).toContain('SPACE_TLS_HOSTNAMES=\n');
    const ports = recorded
      .filter((r) => r.type === 'pulumi-nodejs:dynamic/crusoe:FirewallRule')
      .flatMap((r) => (unwrapSecrets(r.inputs) as { destinationPorts: string[] }).destinationPorts);
    expect(ports).not.toContain('80');
    expect(vmConfigOf(recorded)[0]!.inputs['plainApiUrl']).toBeUndefined();
  });

  it('config: the e-mail is required with names, refused without them; a bad server is refused', () => {
    expect(fails(withSecrets({ ...tlsRaw, acmeEmail: undefined }))).toEqual([
      expect.stringContaining('space:acmeEmail: required with space:tlsHostnames'),
    ]);
    expect(fails(withSecrets({ ...VARIANTS['crusoe']!, acmeEmail: 'ops@example.com' }))).toEqual([
      expect.stringContaining('space:acmeEmail: only with space:tlsHostnames'),
    ]);
    expect(fails(withSecrets({ ...tlsRaw, acmeServer: 'http://acme.example.com/dir' }))).toEqual([
      expect.stringContaining('space:acmeServer: must be an https:// URL'),
    ]);
    expect(fails(withSecrets(tlsRaw))).toEqual([]);
  });
});

/** The API's environment in a rendered stack: its Deployment's env, or the control VM's env file. */
function apiEnvOf(recorded: RecordedResource[]): Record<string, string> {
  const dep = recorded.find(
    (r) =>
      r.type === 'kubernetes:apps/v1:Deployment' &&
      ((unwrapSecrets(r.inputs) as Obj)['metadata'] as Obj)['name'] === 'space-api',
  );
  if (dep) {
    const c = (podSpecOf(dep)['containers'] as Obj[])[0]!;
    return Object.fromEntries(
      ((c['env'] as Obj[]) ?? [])
        .filter((e) => typeof e['value'] === 'string')
        .map((e) => [e['name'], e['value']]),
    ) as Record<string, string>;
  }
  const control = vmScripts(recorded)['space-control'];
  return Object.fromEntries(
    (envFilesOf(control ?? '')['space-api'] ?? '')
      .split('\n')
      .filter(Boolean)
      .map((l) => [l.slice(0, l.indexOf('=')), l.slice(l.indexOf('=') + 1)]),
  );
}

describe.each(Object.entries(VARIANTS))('exposure of stack %s', (name, base) => {
  // finding "agent URLs handed to clients are private addresses": the API hands out data-plane
  // URLs on SPACE_ROUTER_URL, and without it, the agent's own (private) URL
  it('the API hands clients the router’s public URL, never an agent’s address', async () => {
    const url = apiEnvOf(await render(withSecrets(base)))['SPACE_ROUTER_URL'];
    expect(url, 'SPACE_ROUTER_URL').toMatch(/^https?:\/\/[^/]+\/?$/);
    const u = new URL(url!);
    expect(u.port, 'not the agent port').not.toBe('8081');
    expect(u.hostname).not.toMatch(/^(10\.|192\.168\.|172\.(1[6-9]|2\d|3[01])\.)/);
    if (name !== 'kind') expect(u.hostname).not.toMatch(/^(127\.|localhost$)/);
  });
});

describe('akamai vm: TLS at the NodeBalancer', () => {
  // finding "no TLS except on one path": the vm path terminates TLS on the NodeBalancer
  it('https on 443 (API) and 8443 (router) with the certificate, its key kept secret; clients and pulumi up use the names', async () => {
    const key = 'nodebalancer-tls-key-5d1e';
    const recorded = await render(
      withSecrets({
        ...VARIANTS['akamai']!,
        apiTlsCertificate: CA.certPem,
        apiTlsKey: key,
        tlsHostnames: JSON.stringify({ api: 'api.space.example.com', router: 'router.space.example.com' }),
      }),
    );
    const configs = recorded.filter((r) => r.type === 'linode:index/nodeBalancerConfig:NodeBalancerConfig');
    expect(configs.map((c) => [c.inputs['port'], c.inputs['protocol']]).sort()).toEqual([
      [443, 'https'],
      [8443, 'https'],
    ]);
    for (const c of configs) {
      expect(isWireSecret(c.inputs['sslKey'])).toBe(true);
      expect(unwrapSecrets(c.inputs['sslCert'])).toBe(CA.certPem);
    }
    expect(recorded.flatMap((r) => plaintextOccurrences(r.inputs, key))).toEqual([]);
    expect(apiEnvOf(recorded)['SPACE_ROUTER_URL']).toBe('https://router.space.example.com:8443');
    expect(vmConfigOf(recorded)[0]!.inputs['apiUrl']).toBe('https://api.space.example.com');
    // the names are those of the certificate: without it they are refused
    expect(
      fails(
        withSecrets({
          ...VARIANTS['akamai']!,
          tlsHostnames: JSON.stringify({ api: 'a.example.com', router: 'r.example.com' }),
        }),
      ),
    ).toEqual([expect.stringContaining('space:tlsHostnames: on akamai in vm mode')]);
  });
});
