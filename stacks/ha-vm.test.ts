/**
 * No single point of failure in vm mode (issue 44), what the Akamai and Crusoe stacks render under
 * the mock runtime with `space:controlPlane: { replicas: 3 }` (the stack files' setting): three
 * control VMs, each with a Redis server and a Sentinel, the API and the router; Akamai's
 * NodeBalancer health-checking `/readyz` on every one; nodes naming the three sentinels; one API
 * signing key for the three; and the settings preview refuses.
 */
import { createPrivateKey, generateKeyPairSync } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { parse } from 'yaml';
import { plaintextOccurrences, type RecordedResource, unwrapSecrets } from '../providers/testing/mocks.ts';
import { parseRedisUrl } from '../runtime/core/redis-connection.ts';
import { fails, render, VARIANTS, vmScripts, withSecrets } from './test-stacks.ts';

type Obj = Record<string, unknown>;
const CONTROLS = ['space-control', 'space-control-1', 'space-control-2'];
const { timeout } = { timeout: 60_000 };

/** The files a cloud-config writes, by path. */
function cloudFiles(userData: string): Record<string, string> {
  const doc = parse(userData.slice(userData.indexOf('\n') + 1)) as {
    write_files: { path: string; content: string }[];
  };
  return Object.fromEntries(doc.write_files.map((f) => [f.path, f.content]));
}
const urlOf = (envFile: string) => /^SPACE_REDIS_URL=(.*)$/m.exec(envFile)![1]!;
const nb = (recorded: RecordedResource[], type: string) =>
  recorded
    .filter((r) => r.type === `linode:index/${type}`)
    .map((r): Obj => ({ name: r.name, ...(unwrapSecrets(r.inputs) as Obj) }));

describe('akamai vm with three control VMs', () => {
  it('each control VM runs a Redis server and a Sentinel (quorum 2 of 3), the first leading a new deployment', {
    timeout,
  }, async () => {
    const recorded = await render(withSecrets(VARIANTS['akamai']!));
    const scripts = vmScripts(recorded);
    expect(Object.keys(scripts).sort()).toEqual([
      ...CONTROLS,
      'space-node-default-0',
      'space-node-default-1',
    ]);
    for (const c of CONTROLS) {
      const f = cloudFiles(scripts[c]!);
      expect(f['/etc/space/sentinel.conf']).toContain('sentinel monitor space 10.77.128.10 6379 2');
      expect(f['/etc/space/sentinel.conf']).toMatch(/^sentinel auth-pass space \S{16,}$/m);
      expect(f['/etc/systemd/system/space-sentinel.service']).toContain(
        'ExecStart=/usr/local/sbin/space-sentinel',
      );
      expect(f['/usr/local/sbin/space-sentinel']).toContain('--sentinel --bind 127.0.0.1 "$ip4"');
      expect(f['/etc/space/redis.conf']).toMatch(/^masterauth \S{16,}$/m);
      expect(f['/etc/space/redis.conf']).toContain('min-replicas-to-write 1\nmin-replicas-max-lag 10');
      // the others' sentinels first, this VM's own last, then the first control VM on a new deployment
      expect(f['/usr/local/sbin/space-redis']).toContain(
        'for s in $(printf "%s\\n" 10.77.128.10 10.77.128.11 10.77.128.12 | grep -vx "$ip4") 127.0.0.1; do',
      );
      expect(f['/usr/local/sbin/space-redis']).toContain('[ -n "$primary" ] || primary=10.77.128.10');
      // the guard admits Redis and Sentinel from the subnet only
      expect(f['/etc/nftables.d/space-control.nft']).toContain(
        'tcp dport { 6379, 26379 } ip saddr != { 127.0.0.0/8, 10.77.128.0/24 } drop',
      );
      // its services: this VM's sentinel first, then every control VM's
      expect(urlOf(f['/etc/space/redis.env']!)).toMatch(
        /^redis-sentinel:\/\/:\S+@127\.0\.0\.1:26379,10\.77\.128\.10:26379,10\.77\.128\.11:26379,10\.77\.128\.12:26379\/space$/,
      );
      expect(scripts[c]).toContain(
        'systemctl enable --now space-control-guard.service space-sentinel.service space-redis.service',
      );
      // an upgrade reaches the three at different moments (one VM alone moves at once)
      expect(f['/etc/systemd/system/space-version-sync.timer']).toContain('RandomizedDelaySec=300');
      // the API and the router on each
      expect(f['/etc/systemd/system/space-api.service']).toBeDefined();
      // with replicas, the API waits for one before a client is told of a write
      expect(scripts[c]).toContain('SPACE_REDIS_WAIT_REPLICAS=1');
      expect(f['/etc/systemd/system/space-router.service']).toBeDefined();
    }
  });

  it('nodes get the three sentinels as SPACE_REDIS_URL and read from whichever control VM answers', {
    timeout,
  }, async () => {
    const recorded = await render(withSecrets(VARIANTS['akamai']!));
    const f = cloudFiles(vmScripts(recorded)['space-node-default-0']!);
    const url = urlOf(f['/etc/space/redis.env']!);
    expect(parseRedisUrl(url)).toMatchObject({
      kind: 'sentinel',
      primaryName: 'space',
      sentinels: ['10.77.128.10', '10.77.128.11', '10.77.128.12'].map((host) => ({ host, port: 26379 })),
    });
    expect(f['/usr/local/sbin/space-redis-read']).toContain(
      'for h in 10.77.128.10 10.77.128.11 10.77.128.12; do',
    );
    for (const script of [
      '/usr/local/sbin/space-node-env',
      '/usr/local/sbin/space-version-sync',
      '/usr/local/sbin/space-config-sync',
    ])
      expect(f[script]).toContain('/usr/local/sbin/space-redis-read --raw');
  });

  it('one API signing key for the three control VMs: the same valid Ed25519 key, in no node, stable across renders', {
    timeout,
  }, async () => {
    const keys = async () => {
      const scripts = vmScripts(await render(withSecrets(VARIANTS['akamai']!)));
      return {
        controls: CONTROLS.map((c) => cloudFiles(scripts[c]!)['/etc/space/keys/signing.pem']),
        node: cloudFiles(scripts['space-node-default-0']!)['/etc/space/keys/signing.pem'],
      };
    };
    const a = await keys();
    expect(new Set(a.controls).size).toBe(1);
    // only inside secrets (the user data that carries it is one), in both clouds
    for (const cloud of ['akamai', 'crusoe']) {
      const recorded = await render(withSecrets(VARIANTS[cloud]!));
      const line = a.controls[0]!.split('\n')[1]!;
      expect(recorded.flatMap((r) => plaintextOccurrences(r.inputs, line))).toEqual([]);
    }
    expect(createPrivateKey(a.controls[0]!).asymmetricKeyType).toBe('ed25519');
    expect(a.node).toBeUndefined();
    expect((await keys()).controls[0]).toBe(a.controls[0]);
  });

  it('space:signingKey, when set, is the key the control VMs share (not one derived from the API key); with one control VM it is refused', {
    timeout,
  }, async () => {
    const own = generateKeyPairSync('ed25519').privateKey.export({ type: 'pkcs8', format: 'pem' }).toString();
    const scripts = vmScripts(await render(withSecrets({ ...VARIANTS['akamai']!, signingKey: own })));
    for (const c of CONTROLS) expect(cloudFiles(scripts[c]!)['/etc/space/keys/signing.pem']).toBe(own);
    expect(
      fails(
        withSecrets({
          ...VARIANTS['akamai']!,
          controlPlane: JSON.stringify({ replicas: 1 }),
          signingKey: own,
        }),
      ),
    ).toEqual([expect.stringMatching(/^space:signingKey: with one control VM it makes its own key/)]);
  });

  it('the NodeBalancer health-checks /readyz on every control VM, for the API and the router', {
    timeout,
  }, async () => {
    const recorded = await render(withSecrets(VARIANTS['akamai']!));
    const configs = nb(recorded, 'nodeBalancerConfig:NodeBalancerConfig');
    expect(configs).toHaveLength(2);
    for (const c of configs)
      expect(c).toMatchObject({
        check: 'http',
        checkPath: '/readyz',
        checkInterval: 5,
        checkTimeout: 3,
        checkAttempts: 2,
      });
    const backends = nb(recorded, 'nodeBalancerNode:NodeBalancerNode').map((n) => String(n['address']));
    // the control VMs' private addresses (the mock gives each Linode its own), each behind both ports
    const hosts = (port: number) =>
      backends
        .filter((b) => b.endsWith(`:${port}`))
        .map((b) => b.split(':')[0])
        .sort();
    expect(new Set(hosts(8080)).size).toBe(3);
    expect(hosts(8082)).toEqual(hosts(8080));
    // Sentinel: the subnet only; and the nodes admit dispatch from every control VM
    const fw = (name: string) =>
      (
        recorded.find((r) => r.name === name)!.inputs as {
          inbounds: { label: string; ports?: string; ipv4s: string[] }[];
        }
      ).inbounds;
    expect(fw('space-control-fw')).toContainEqual(
      expect.objectContaining({ label: 'sentinel-from-subnet', ports: '26379', ipv4s: ['10.77.128.0/24'] }),
    );
    expect(fw('space-nodes-fw').find((r) => r.label === 'dispatch-from-control')!.ipv4s).toHaveLength(3);
  });
});

describe('crusoe with three control VMs', () => {
  it('the first is made first and names itself the first primary; the others and the nodes follow its address', {
    timeout,
  }, async () => {
    const recorded = await render(withSecrets(VARIANTS['crusoe']!));
    const scripts = vmScripts(recorded);
    const file = (vm: string, path: string) => {
      const m = new RegExp(`cat > ${path} <<'(SPACE_EOF_\\d+)'\\n([\\s\\S]*?)\\n\\1\\n`).exec(scripts[vm]!);
      return m?.[2];
    };
    expect(file('space-control', '/etc/space/sentinel.conf')).toContain(
      'sentinel monitor space @SELF@ 6379 2',
    );
    expect(file('space-control', '/usr/local/sbin/space-redis')).toContain(
      '[ -n "$primary" ] || primary="$ip4"',
    );
    const first = /sentinel monitor space (10\.77\.128\.\d+) 6379 2/.exec(
      file('space-control-1', '/etc/space/sentinel.conf')!,
    )![1]!;
    expect(file('space-control-2', '/etc/space/sentinel.conf')).toContain(
      `sentinel monitor space ${first} 6379 2`,
    );
    const url = /SPACE_REDIS_URL=(\S+)/.exec(file('space-node-default-0', '/etc/space/redis.env')!)![1]!;
    const hosts = (parseRedisUrl(url) as { sentinels: { host: string }[] }).sentinels.map((s) => s.host);
    expect(hosts).toHaveLength(3);
    expect(hosts[0]).toBe(first);
    expect(new Set(hosts).size).toBe(3);
    const rules = recorded
      .filter((r) => r.type === 'pulumi-nodejs:dynamic/crusoe:FirewallRule')
      .map((r) => r.inputs as { name: string; sources: string[]; destinationPorts: string[] });
    expect(rules.find((r) => r.destinationPorts.includes('26379'))!.sources).toEqual(['10.77.128.0/24']);
  });
});

describe('refused at preview: a control plane that cannot fail over', () => {
  it.each([2, 4, 0, 'three'])('%s control VMs', (n) => {
    expect(
      fails(withSecrets({ ...VARIANTS['akamai']!, controlPlane: JSON.stringify({ replicas: n }) })),
    ).toEqual([
      expect.stringMatching(/^space:controlPlane\.replicas: 1, 3 or 5 .*a failover needs a majority/),
    ]);
  });

  it('outside vm mode, an unknown field, several control VMs with Crusoe’s ACME TLS', () => {
    expect(
      fails(withSecrets({ ...VARIANTS['akamai-lke']!, controlPlane: JSON.stringify({ replicas: 3 }) })),
    ).toEqual([expect.stringMatching(/^space:controlPlane: vm mode only/)]);
    expect(
      fails(withSecrets({ ...VARIANTS['akamai']!, controlPlane: JSON.stringify({ count: 3 }) })),
    ).toEqual(['space:controlPlane: must be { "replicas": 1 | 3 | 5 }']);
    const tls = {
      ...VARIANTS['crusoe']!,
      routerUrl: undefined,
      tlsHostnames: JSON.stringify({ api: 'api.space.example.com', router: 'router.space.example.com' }),
      acmeEmail: 'ops@example.com',
    };
    expect(fails(withSecrets(tls))).toEqual([
      expect.stringMatching(
        /^space:controlPlane: several control VMs on crusoe cannot take space:tlsHostnames/,
      ),
    ]);
    expect(fails(withSecrets({ ...tls, controlPlane: JSON.stringify({ replicas: 1 }) }))).toEqual([]);
  });
});
