import { execFileSync, spawnSync } from 'node:child_process';
import { describe, expect, it } from 'vitest';
import { parse } from 'yaml';
import { agentSettings } from '../../runtime/agent/config.ts';
import { gatewaySettings } from '../../runtime/gateway/config.ts';
import type { NodePool } from '../node-pool.ts';
import { GATEWAY_PORTS, gatewayGuardRuleset } from '../runtime-settings.ts';
import {
  agentPlan,
  controlPlan,
  NODE_LOCAL_PORTS,
  toCloudConfig,
  toShellScript,
  type VmPlan,
} from './cloud-init.ts';

const pool: NodePool = {
  name: 'default',
  driver: 'cloud-hypervisor',
  instanceType: 'c1a.8x',
  count: 2,
  labels: {},
  allowUnverifiedKvm: false,
};
const common = {
  version: '0.1.0',
  imageRepository: 'ghcr.io/space-sandbox/space',
  privateCidr: '10.10.0.0/24',
};
const ROUTER_URL = 'https://router.example.com';
const control = (version = '0.1.0') => controlPlan({ ...common, version, routerUrl: ROUTER_URL });
const agent = (version = '0.1.0', gatewayEnabled = true) =>
  agentPlan({ ...common, version, pool, controlAddress: '10.10.0.2', gatewayEnabled });
const file = (plan: VmPlan, path: string) => plan.files.find((f) => f.path === path)?.content;
const envOf = (text: string) =>
  Object.fromEntries(
    text
      .trim()
      .split('\n')
      .map((l) => l.split('=', 2) as [string, string]),
  );

describe('cloud-init for the systemd (vm) mode', () => {
  it('control user data (snapshot)', () => {
    expect(toCloudConfig(control())).toMatchSnapshot();
  });

  it('agent user data (snapshot)', () => {
    expect(toCloudConfig(agent())).toMatchSnapshot();
  });

  it('the control VM runs the router with Redis and the verify key only; the API hands out its URL', () => {
    const plan = control();
    expect(envOf(file(plan, '/etc/space/space-router.env')!)).toEqual({
      SPACE_REDIS_URL: 'redis://127.0.0.1:6379',
      SPACE_ROUTER_HOST: '0.0.0.0',
      SPACE_ROUTER_PORT: '8082',
      SPACE_VERIFY_KEY_FILE: '/etc/space/keys/verify.pem',
    });
    const unit = file(plan, '/etc/systemd/system/space-router.service')!;
    expect(unit).toContain('node runtime/router/server.ts');
    // the verify key file alone is mounted: never the key directory with the signing key
    expect(unit).toContain('-v /etc/space/keys/verify.pem:/etc/space/keys/verify.pem:ro');
    expect(unit).not.toMatch(/-v \/etc\/space\/keys:/);
    expect(envOf(file(plan, '/etc/space/space-api.env')!)['SPACE_ROUTER_URL']).toBe(ROUTER_URL);
    expect(plan.commands.join('\n')).toContain('space-router.service');
    // agents register their private-network address, never the default route's (public) one
    const nodeEnv = file(agent(), '/usr/local/sbin/space-node-env')!;
    expect(nodeEnv).toContain('ip -4 -o addr show to 10.10.0.0/24');
    expect(nodeEnv).not.toContain('route get');
    // the rendered lookup, run for real on this host with loopback standing in for the subnet
    const lookup = nodeEnv
      .split('\n')
      .find((l) => l.startsWith('ip4='))!
      .replace('10.10.0.0/24', '127.0.0.0/8');
    expect(
      execFileSync('sh', ['-c', `${lookup}; echo "$ip4"`])
        .toString()
        .trim(),
    ).toBe('127.0.0.1');
  });

  it('is a #cloud-config document that YAML parses back to the plan', () => {
    const text = toCloudConfig(agent());
    expect(text.startsWith('#cloud-config\n')).toBe(true);
    const doc = parse(text) as { write_files: { path: string; content: string }[]; runcmd: string[] };
    expect(doc.write_files.map((f) => f.path)).toEqual(agent().files.map((f) => f.path));
    expect(doc.write_files.find((f) => f.path.endsWith('space-agent.service'))!.content).toContain(
      'KillMode=process',
    );
  });

  it('holds no private key, password or token: the control VM makes its own key pair', () => {
    for (const text of [toCloudConfig(control()), toCloudConfig(agent()), toShellScript(agent())]) {
      expect(text).not.toMatch(/BEGIN (ENCRYPTED )?PRIVATE KEY/);
      expect(text).not.toMatch(/requirepass|password|CW-SECRET|Bearer/i);
      expect(text).not.toMatch(/redis:\/\/[^@\s]*@/);
    }
    expect(toCloudConfig(control())).toContain('openssl genpkey -algorithm ed25519');
  });

  it('Redis admits only loopback and the private network', () => {
    const nft = control().files.find((f) => f.path.endsWith('space-control.nft'))!.content;
    expect(nft).toContain('tcp dport 6379 ip saddr != { 127.0.0.0/8, 10.10.0.0/24 } drop');
  });

  it('the agent keeps sandboxes across restarts and runs its pool driver', () => {
    const env = agent().files.find((f) => f.path === '/etc/space/space-agent.env')!.content;
    expect(env).toContain('SPACE_AGENT_ON_SHUTDOWN=keep\n');
    expect(env).toContain('SPACE_DRIVER=cloud-hypervisor\n');
    expect(env).toContain('SPACE_REDIS_URL=redis://10.10.0.2:6379\n');
  });

  it('the gateway runs beside the agent by default; without it the agent gets no control socket (no egress at all)', () => {
    const on = agentPlan({ ...common, pool, controlAddress: '10.10.0.2' });
    expect(on.files.some((f) => f.path.endsWith('space-gateway.service'))).toBe(true);
    expect(on.commands.at(-1)).toContain(
      'space-gateway-guard.service space-gateway.service space-agent.service',
    );
    const off = agent('0.1.0', false);
    expect(off.files.some((f) => f.path.includes('gateway'))).toBe(false);
    const env = file(off, '/etc/space/space-agent.env')!;
    expect(env).not.toMatch(/SPACE_GATEWAY|SPACE_TRUSTED_CA_FILE/);
    expect(file(off, '/etc/systemd/system/space-agent.service')).not.toContain('gateway');
  });

  it('gateway and agent share /run/space and the control socket path, and agree on the ports', () => {
    const p = agent();
    const ae = envOf(file(p, '/etc/space/space-agent.env')!);
    const ge = envOf(file(p, '/etc/space/space-gateway.env')!);
    expect(ae['SPACE_GATEWAY_CONTROL_SOCKET']).toBe('/run/space/gateway.sock');
    expect(ge['SPACE_GATEWAY_CONTROL_SOCKET']).toBe(ae['SPACE_GATEWAY_CONTROL_SOCKET']);
    for (const k of ['DNS', 'HTTP', 'TLS'])
      expect(ge[`SPACE_GATEWAY_${k}_PORT`], k).toBe(ae[`SPACE_GATEWAY_${k}_PORT`]);
    expect(ge['SPACE_GATEWAY_TLS_PORT']).toBe(String(GATEWAY_PORTS.tls));
    for (const k of Object.keys(ae))
      expect(
        Object.values(agentSettings).map((s) => s.env),
        k,
      ).toContain(k);
    for (const k of Object.keys(ge))
      expect(
        Object.values(gatewaySettings).map((s) => s.env),
        k,
      ).toContain(k);
    for (const unit of ['space-agent', 'space-gateway'])
      expect(file(p, `/etc/systemd/system/${unit}.service`), unit).toContain('-v /run/space:/run/space ');
    const agentUnit = file(p, '/etc/systemd/system/space-agent.service')!;
    // a restarted gateway restarts the agent, which re-registers its sandboxes; it waits for the socket
    expect(agentUnit).toContain('PartOf=space-gateway.service');
    expect(agentUnit).toContain(
      'until [ -S /run/space/gateway.sock ] && [ -s /etc/space/gateway-ca/ca.crt ]',
    );
    expect(file(p, '/usr/local/sbin/space-upgrade')).toContain('systemctl restart space-gateway space-agent');
  });

  it('the CA is made on the node and its key stays with the gateway: the agent mounts only the certificate', () => {
    const p = agent();
    const ge = envOf(file(p, '/etc/space/space-gateway.env')!);
    const ae = envOf(file(p, '/etc/space/space-agent.env')!);
    expect(ae['SPACE_TRUSTED_CA_FILE']).toBe(ge['SPACE_GATEWAY_CA_CERT_FILE']);
    expect(ge['SPACE_GATEWAY_CA_KEY_FILE']).toBe('/etc/space/gateway-ca/ca.key');
    const gatewayUnit = file(p, '/etc/systemd/system/space-gateway.service')!;
    expect(gatewayUnit).toContain('-v /etc/space/gateway-ca:/etc/space/gateway-ca ');
    expect(gatewayUnit).toContain('ExecStartPre=/bin/mkdir -p -m 0700 /run/space /etc/space/gateway-ca');
    expect(gatewayUnit).toContain('--cap-drop all');
    const agentUnit = file(p, '/etc/systemd/system/space-agent.service')!;
    expect(agentUnit).toContain('-v /etc/space/gateway-ca/ca.crt:/etc/space/gateway-ca/ca.crt:ro');
    expect(agentUnit).not.toMatch(/-v \/etc\/space\/gateway-ca:|ca\.key/);
    expect(toCloudConfig(p)).not.toMatch(/BEGIN (EC |ENCRYPTED )?PRIVATE KEY/);
  });

  it('gateway ports are closed to everything but sandbox interfaces, at every boot, before the gateway', () => {
    const p = agent();
    expect(file(p, '/etc/space/gateway-guard.nft')).toBe(gatewayGuardRuleset());
    const guardUnit = file(p, '/etc/systemd/system/space-gateway-guard.service')!;
    expect(guardUnit).toContain('ExecStart=/usr/sbin/nft -f /etc/space/gateway-guard.nft');
    expect(guardUnit).toContain('Before=space-gateway.service');
    expect(guardUnit).toContain('WantedBy=multi-user.target');
    expect(file(p, '/etc/systemd/system/space-gateway.service')).toContain(
      'Requires=space-gateway-guard.service',
    );
    const nft = gatewayGuardRuleset();
    expect(nft).toContain(`tcp dport { ${NODE_LOCAL_PORTS.join(', ')} } counter drop`);
    expect(nft).toContain(`udp dport ${GATEWAY_PORTS.dns} counter drop`);
    expect(nft.indexOf('iifname "spv*" accept')).toBeLessThan(nft.indexOf('drop'));
  });

  it.skipIf(spawnSync('nft', ['--version']).status !== 0 || process.getuid?.() !== 0)(
    'the host firewall ruleset is accepted by nft -c',
    () => {
      execFileSync('nft', ['-c', '-f', '-'], { input: gatewayGuardRuleset() });
    },
  );

  it('operator gateway settings reach the gateway environment', () => {
    const p = agentPlan({
      ...common,
      pool,
      controlAddress: '10.10.0.2',
      gatewayUpstreamDns: ['10.10.0.1:53'],
      gatewayDenyCidrs: ['10.0.0.0/8'],
      gatewayEnv: { SPACE_LOG_LEVEL: 'debug' },
    });
    const ge = envOf(file(p, '/etc/space/space-gateway.env')!);
    expect(ge).toMatchObject({
      SPACE_GATEWAY_UPSTREAM_DNS: '10.10.0.1:53',
      SPACE_GATEWAY_DENY_CIDRS: '10.0.0.0/8',
      SPACE_LOG_LEVEL: 'debug',
    });
    expect(
      envOf(file(agent(), '/etc/space/space-gateway.env')!)['SPACE_GATEWAY_UPSTREAM_DNS'],
    ).toBeUndefined();
  });

  it('the shell-script form is bash (Crusoe requires #!/bin/bash), parses, and is ASCII only', () => {
    for (const plan of [agent('0.1.0', true), agent('0.1.0', false), control()]) {
      const script = toShellScript(plan);
      expect(script.startsWith('#!/bin/bash\n')).toBe(true);
      execFileSync('bash', ['-n'], { input: script });
      expect(script).toMatch(/^[\x20-\x7e\n\t]*$/);
    }
    expect(toShellScript(agent())).toContain("cat > /etc/systemd/system/space-agent.service <<'SPACE_EOF_");
  });

  it('a non-ASCII character (an operator setting) is refused when the script is rendered, naming its line', () => {
    const plan = controlPlan({ ...common, routerUrl: ROUTER_URL, apiEnv: { SPACE_LOG_LEVEL: 'd\u00e9bug' } });
    expect(() => toShellScript(plan)).toThrow(/"\u00e9" on line \d+ is not printable ASCII/);
  });

  it('the control VM closes Redis at every boot with a unit (a first-boot command would not survive a reboot)', () => {
    const plan = control();
    expect(file(plan, '/etc/systemd/system/space-control-guard.service')).toContain(
      'ExecStart=/usr/sbin/nft -f /etc/nftables.d/space-control.nft',
    );
    expect(plan.commands).toContain('systemctl enable --now space-control-guard.service');
    expect(plan.commands.some((c) => c.startsWith('nft '))).toBe(false);
    // re-applying the table replaces it
    expect(file(plan, '/etc/nftables.d/space-control.nft')).toContain('delete table inet space_control');
  });

  it('upgrade: bumping the version changes only the image tag', () => {
    for (const [a, b] of [
      [toCloudConfig(control('0.1.0')), toCloudConfig(control('0.2.0'))],
      [toCloudConfig(agent('0.1.0')), toCloudConfig(agent('0.2.0'))],
      [toCloudConfig(agent('0.1.0', false)), toCloudConfig(agent('0.2.0', false))],
    ] as const) {
      const la = a!.split('\n');
      const lb = b!.split('\n');
      expect(la.length).toBe(lb.length);
      const changed = la.flatMap((l, i) => (l === lb[i] ? [] : [[l, lb[i]]]));
      expect(changed).toEqual([
        [
          '      SPACE_IMAGE=ghcr.io/space-sandbox/space:0.1.0',
          '      SPACE_IMAGE=ghcr.io/space-sandbox/space:0.2.0',
        ],
      ]);
    }
  });
});

describe('VM upgrades without SSH: space-version-sync', () => {
  /**
   * Runs the rendered sync script for real (sh), with its fixed paths moved into a temp folder, a
   * fake `redis-cli` answering `target`, and a fake `space-upgrade` that records its argument.
   */
  function sync(plan: VmPlan, target: string, current = 'ghcr.io/space-sandbox/space:0.1.0') {
    const dir = execFileSync('mktemp', ['-d']).toString().trim();
    const script = file(plan, '/usr/local/sbin/space-version-sync')!
      .replaceAll('/etc/space/image.env', `${dir}/image.env`)
      .replaceAll('/usr/local/sbin/space-upgrade', `${dir}/space-upgrade`);
    execFileSync('sh', [
      '-c',
      [
        `printf 'SPACE_IMAGE=%s\\n' '${current}' > ${dir}/image.env`,
        `printf '#!/bin/sh\\necho "$@" > ${dir}/upgraded\\n' > ${dir}/space-upgrade`,
        `printf '#!/bin/sh\\necho "$*" > ${dir}/redis-args\\nprintf "%%s\\\\n" "${target}"\\n' > ${dir}/redis-cli`,
        `chmod +x ${dir}/space-upgrade ${dir}/redis-cli`,
      ].join('\n'),
    ]);
    const r = spawnSync('sh', ['-c', script], { env: { PATH: `${dir}:/usr/bin:/bin` }, encoding: 'utf8' });
    const read = (f: string) => spawnSync('cat', [`${dir}/${f}`], { encoding: 'utf8' }).stdout.trim();
    const out = {
      status: r.status,
      stderr: r.stderr,
      upgraded: read('upgraded'),
      redisArgs: read('redis-args'),
    };
    execFileSync('rm', ['-rf', dir]);
    return out;
  }

  it('every VM runs the timer; agents read the control VM’s Redis and spread their restarts', () => {
    for (const [plan, host, spread] of [
      [control(), '127.0.0.1', '0'],
      [agent(), '10.10.0.2', '300'],
    ] as const) {
      expect(file(plan, '/usr/local/sbin/space-version-sync')).toContain(`redis-cli -h ${host} -p 6379`);
      expect(file(plan, '/etc/systemd/system/space-version-sync.timer')).toContain(
        `RandomizedDelaySec=${spread}`,
      );
      expect(plan.commands.join('\n')).toContain('space-version-sync.timer');
    }
  });

  it('upgrades to a new target, does nothing at the current one or with none, refuses what is not a tag', () => {
    const plan = agent();
    const up = sync(plan, '0.2.0');
    expect(up).toMatchObject({ status: 0, upgraded: '0.2.0' });
    expect(up.redisArgs).toBe('-h 10.10.0.2 -p 6379 --raw GET space:deploy:target-version');
    expect(sync(plan, '0.1.0')).toMatchObject({ status: 0, upgraded: '' });
    expect(sync(plan, '')).toMatchObject({ status: 0, upgraded: '' });
    // a registry with a port: the tag is after the last colon
    expect(sync(plan, '0.1.0', 'registry.example:5000/space:0.1.0')).toMatchObject({
      status: 0,
      upgraded: '',
    });
    for (const bad of ['0.2.0; rm -rf /', '../x', 'a b'])
      expect(sync(plan, bad), bad).toMatchObject({ status: 1, upgraded: '' });
  });
});
