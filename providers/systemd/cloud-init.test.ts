import { execFileSync } from 'node:child_process';
import { describe, expect, it } from 'vitest';
import { parse } from 'yaml';
import type { NodePool } from '../node-pool.ts';
import { agentPlan, controlPlan, toCloudConfig, toShellScript } from './cloud-init.ts';

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
const control = (version = '0.1.0') => controlPlan({ ...common, version });
const agent = (version = '0.1.0', gatewayEnabled = false) =>
  agentPlan({ ...common, version, pool, controlAddress: '10.10.0.2', gatewayEnabled });

describe('cloud-init for the systemd (vm) mode', () => {
  it('control user data (snapshot)', () => {
    expect(toCloudConfig(control())).toMatchSnapshot();
  });

  it('agent user data (snapshot)', () => {
    expect(toCloudConfig(agent())).toMatchSnapshot();
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

  it('the gateway unit exists only when enabled', () => {
    expect(agent().files.some((f) => f.path.endsWith('space-gateway.service'))).toBe(false);
    expect(agent('0.1.0', true).files.some((f) => f.path.endsWith('space-gateway.service'))).toBe(true);
  });

  it('the shell-script form is valid POSIX sh', () => {
    const script = toShellScript(agent('0.1.0', true));
    execFileSync('sh', ['-n'], { input: script });
    expect(script).toContain("cat > /etc/systemd/system/space-agent.service <<'SPACE_EOF_");
  });

  it('upgrade: bumping the version changes only the image tag', () => {
    for (const [a, b] of [
      [toCloudConfig(control('0.1.0')), toCloudConfig(control('0.2.0'))],
      [toCloudConfig(agent('0.1.0')), toCloudConfig(agent('0.2.0'))],
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
