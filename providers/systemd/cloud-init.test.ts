import { execFileSync, spawnSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { parse } from 'yaml';
import { agentSettings } from '../../runtime/agent/config.ts';
import { gatewaySettings } from '../../runtime/gateway/config.ts';
import { GATEWAY_PORTS, gatewayGuardRuleset } from '../runtime-settings.ts';
import {
  agentPlan,
  controlPlan,
  NODE_LOCAL_PORTS,
  toCloudConfig,
  toShellScript,
  type VmPlan,
} from './cloud-init.ts';
import { IP_FORWARD_SYSCTL_FILE } from './ip-forwarding.ts';
import { agent, common, control, envOf, file, pool, REDIS_PW, ROUTER_URL } from './test-plans.ts';

describe('cloud-init for the systemd (vm) mode', () => {
  it('control user data (snapshot)', () => {
    expect(toCloudConfig(control())).toMatchSnapshot();
  });

  it('agent user data (snapshot)', () => {
    expect(toCloudConfig(agent())).toMatchSnapshot();
  });

  it('a drained node’s agent gets the stack’s drain wait, and its unit lets it finish before killing it', () => {
    for (const agentDrainSeconds of [undefined, 30, 900]) {
      const plan = agentPlan({ ...common, pool, controlAddress: '10.10.0.2', agentDrainSeconds });
      const waitMs = Number(envOf(file(plan, '/etc/space/space-agent.env')!).SPACE_DRAIN_WAIT_MS);
      expect(waitMs).toBe((agentDrainSeconds ?? 120) * 1000);
      const u = file(plan, '/etc/systemd/system/space-agent.service')!;
      const grace = Number(/podman stop --time (\d+) /.exec(u)?.[1]);
      const systemdStop = Number(/^TimeoutStopSec=(\d+)$/m.exec(u)?.[1]);
      expect(grace * 1000).toBeGreaterThan(waitMs);
      expect(systemdStop).toBeGreaterThan(grace);
    }
  });

  it('agent VMs forward IPv4 (CIDR egress rules), from first boot and at every boot, with or without a gateway', () => {
    for (const plan of [agent(), agent('0.1.0', false)]) {
      expect(file(plan, IP_FORWARD_SYSCTL_FILE)).toBe('net.ipv4.ip_forward = 1\n');
      expect(plan.commands).toContain(`sysctl -p ${IP_FORWARD_SYSCTL_FILE}`);
    }
    expect(file(control(), IP_FORWARD_SYSCTL_FILE)).toBeUndefined();
  });

  it('the control VM runs the router with Redis and the verify key only; the API hands out its URL', () => {
    const plan = control();
    expect(envOf(file(plan, '/etc/space/space-router.env')!)).toEqual({
      SPACE_ROUTER_HOST: '0.0.0.0',
      SPACE_ROUTER_PORT: '8082',
      SPACE_VERIFY_KEY_FILE: '/etc/space/keys/verify.pem',
    });
    const unit = file(plan, '/etc/systemd/system/space-router.service')!;
    expect(unit).toContain('node runtime/router/server.ts');
    expect(file(plan, '/etc/systemd/system/space-api.service')).toContain(
      'node --min-semi-space-size=16 --max-semi-space-size=64 runtime/api/server.ts',
    );
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

  it('holds no private key or token, and the Redis password only in root-only files: the control VM makes its own key pair', () => {
    for (const plan of [control(), agent()]) {
      for (const text of [toCloudConfig(plan), toShellScript(plan)]) {
        expect(text).not.toMatch(/BEGIN (ENCRYPTED )?PRIVATE KEY/);
        expect(text).not.toMatch(/CW-SECRET|Bearer/i);
      }
      const holders = plan.files.filter((f) => f.content.includes(REDIS_PW));
      expect(holders.map((f) => f.path)).toEqual(
        expect.arrayContaining(['/etc/space/redis.env', '/etc/space/redis.password']),
      );
      for (const f of holders) expect([f.path, f.mode]).toEqual([f.path, '0600']);
      // the startup script makes each of them root-only before it writes the password into it
      const script = toShellScript(plan);
      for (const f of holders) {
        const chmod = script.indexOf(`chmod 0600 ${f.path}\n`);
        expect(chmod, f.path).toBeGreaterThan(-1);
        expect(chmod, f.path).toBeLessThan(script.indexOf(`cat > ${f.path} <<`));
      }
      expect(plan.commands.join('\n')).not.toContain(REDIS_PW);
    }
    expect(toCloudConfig(control())).toContain('openssl genpkey -algorithm ed25519');
  });

  it('Redis admits only loopback and the private network', () => {
    const nft = control().files.find((f) => f.path.endsWith('space-control.nft'))!.content;
    expect(nft).toContain('tcp dport 6379 ip saddr != { 127.0.0.0/8, 10.10.0.0/24 } drop');
  });

  it('every podman unit is one podman accepts: no `--cgroups disabled` beside a shared PID namespace', () => {
    // podman refuses that pair ("containers not creating CGroups must create a private PID
    // namespace"): the agent exited 125 at every start in the VM rehearsal
    for (const plan of [agent(), control()])
      for (const f of plan.files.filter(
        (x) => x.path.endsWith('.service') && x.content.includes('podman run'),
      )) {
        const run = f.content.split('\n').find((l) => l.includes('podman run'))!;
        if (/--pid[ =]host/.test(run)) expect(run, f.path).not.toMatch(/--cgroups[ =]disabled/);
      }
    expect(file(agent(), '/etc/systemd/system/space-agent.service')).toContain('--pid host');
  });

  it('the agent keeps sandboxes across restarts and runs its pool driver', () => {
    const env = agent().files.find((f) => f.path === '/etc/space/space-agent.env')!.content;
    expect(env).toContain('SPACE_AGENT_ON_SHUTDOWN=keep\n');
    expect(env).toContain('SPACE_DRIVER=cloud-hypervisor\n');
    // the Redis URL (with the password) is in its own root-only file, read by every unit
    expect(env).not.toContain('SPACE_REDIS_URL');
    expect(file(agent(), '/etc/space/redis.env')).toBe(
      `SPACE_REDIS_URL=redis://:${REDIS_PW}@10.10.0.2:6379\n`,
    );
    expect(file(agent(), '/etc/systemd/system/space-agent.service')).toContain(
      '--env-file /etc/space/space-agent.env --env-file /etc/space/redis.env ',
    );
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
    expect(plan.commands).toContain('systemctl enable --now space-control-guard.service space-redis.service');
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

describe('ACME TLS on the control VM (Crusoe): space-tls', () => {
  const plan = (hostnames: string[] = ['api.example.com', 'router.example.com']) =>
    controlPlan({
      ...common,
      routerUrl: ROUTER_URL,
      acme: { hostnames, email: 'ops@example.com', server: 'https://acme.test/dir' },
    });

  it('installs certbot, runs the unit at every boot before the API and the router, which read its env files', () => {
    const p = plan();
    expect(p.packages).toContain('certbot');
    const u = file(p, '/etc/systemd/system/space-tls.service')!;
    expect(u).toContain('Before=space-api.service space-router.service');
    expect(u).toContain('WantedBy=multi-user.target');
    expect(u).toMatch(/Restart=on-failure\nRestartSec=300/);
    for (const svc of ['space-api', 'space-router']) {
      const unit = file(p, `/etc/systemd/system/${svc}.service`)!;
      expect(unit).toContain(`--env-file /etc/space/${svc}.tls.env`);
      expect(unit).toContain('-v /etc/space/tls:/etc/space/tls:ro');
      // podman refuses a missing env file: it exists (empty: plain HTTP) before the first certificate
      expect(unit).toContain(`touch /etc/space/${svc}.tls.env`);
    }
    // a first certificate that fails (names not pointed yet) must not stop the provisioning script
    // before it marks the VM provisioned: the unit is started without waiting, never with --now
    expect(p.commands).toContain('systemctl start --no-block space-tls.service');
    expect(p.commands.join('\n')).not.toMatch(/enable --now[^\n]*space-tls/);
    // no ACME: no TLS unit, no certbot, no TLS env file
    expect(control().packages).not.toContain('certbot');
    expect(file(control(), '/etc/systemd/system/space-api.service')).not.toContain('tls.env');
  });

  it('the startup script with ACME is still bash, ASCII, and parses', () => {
    const script = toShellScript(plan());
    expect(script.startsWith('#!/bin/bash\n')).toBe(true);
    expect(spawnSync('bash', ['-n'], { input: script }).status).toBe(0);
    expect(spawnSync('bash', ['-n'], { input: file(plan(), '/usr/local/sbin/space-tls') }).status).toBe(0);
  });

  /**
   * Runs the rendered `space-tls` for real (bash) with `/etc/space` and `/etc/letsencrypt/live/space`
   * moved into a temp folder, a fake `certbot` that records its arguments and issues a certificate
   * (a new one when `renew`), and a fake `systemctl`.
   */
  function tls(p: VmPlan, dir: string, opts: { renew?: boolean; args?: string[] } = {}) {
    const etc = `${dir}/etc`;
    execFileSync('mkdir', ['-p', etc, `${dir}/bin`, `${dir}/live`]);
    writeFileSync(`${etc}/space-tls.env`, file(p, '/etc/space/space-tls.env')!);
    writeFileSync(
      `${dir}/bin/certbot`,
      `#!/bin/sh\necho "$*" >> ${dir}/certbot-args\n[ -s ${dir}/live/fullchain.pem ] && [ -z "$RENEW" ] && exit 0\ndate +%N > ${dir}/live/fullchain.pem\necho key > ${dir}/live/privkey.pem\n`,
      { mode: 0o755 },
    );
    writeFileSync(`${dir}/bin/systemctl`, `#!/bin/sh\necho "$*" >> ${dir}/systemctl\n`, { mode: 0o755 });
    execFileSync('rm', ['-f', `${dir}/systemctl`]);
    const script = file(p, '/usr/local/sbin/space-tls')!
      .replaceAll('/etc/letsencrypt/live/space', `${dir}/live`)
      .replaceAll('/etc/space', etc);
    const r = spawnSync('bash', ['-c', script, 'space-tls', ...(opts.args ?? [])], {
      env: { PATH: `${dir}/bin:/usr/bin:/bin`, RENEW: opts.renew ? '1' : '' },
      encoding: 'utf8',
    });
    const read = (f: string) => spawnSync('cat', [f], { encoding: 'utf8' }).stdout;
    return {
      status: r.status,
      stderr: r.stderr,
      certbot: read(`${dir}/certbot-args`).trim().split('\n').filter(Boolean),
      systemctl: read(`${dir}/systemctl`).trim(),
      apiTls: read(`${etc}/space-api.tls.env`),
      routerTls: read(`${etc}/space-router.tls.env`),
      keyMode: spawnSync('stat', ['-c', '%a', `${etc}/tls/tls.key`], { encoding: 'utf8' }).stdout.trim(),
    };
  }

  it('issues once for both names, installs the certificate, switches the API and router to HTTPS; later boots change nothing', () => {
    const dir = execFileSync('mktemp', ['-d']).toString().trim();
    try {
      const first = tls(plan(), dir);
      expect(first.status, first.stderr).toBe(0);
      expect(first.certbot).toHaveLength(1);
      for (const arg of [
        'certonly --standalone --non-interactive --agree-tos --email ops@example.com --server https://acme.test/dir',
        '--cert-name space --keep-until-expiring --expand -d api.example.com -d router.example.com',
        '--deploy-hook /usr/local/sbin/space-tls --installed',
      ])
        expect(first.certbot[0]).toContain(arg);
      expect(first.apiTls).toBe(
        'SPACE_API_TLS_CERT_FILE=/etc/space/tls/tls.crt\nSPACE_API_TLS_KEY_FILE=/etc/space/tls/tls.key\n'.replaceAll(
          '/etc/space',
          `${dir}/etc`,
        ),
      );
      expect(first.routerTls).toContain('SPACE_ROUTER_TLS_CERT_FILE=');
      expect(first.keyMode).toBe('600');
      expect(first.systemctl).toBe('try-restart space-api space-router space-api space-router');
      // the next boot: certbot keeps the certificate, nothing restarts
      const again = tls(plan(), dir);
      expect(again).toMatchObject({ status: 0, systemctl: '' });
      // a renewal (certbot's deploy hook): the new certificate is installed and both restart
      execFileSync('sh', ['-c', `date +%N%N > ${dir}/live/fullchain.pem`]);
      const renewed = tls(plan(), dir, { args: ['--installed'] });
      expect(renewed.status).toBe(0);
      expect(renewed.certbot).toHaveLength(2); // the hook does not call certbot again
      expect(renewed.systemctl).toBe('try-restart space-api space-router');
    } finally {
      execFileSync('rm', ['-rf', dir]);
    }
  });

  it('without hostnames it asks no CA and serves plain HTTP; a bad hostname is refused before certbot', () => {
    const dir = execFileSync('mktemp', ['-d']).toString().trim();
    try {
      const off = tls(plan([]), dir);
      expect(off).toMatchObject({ status: 0, certbot: [], apiTls: '', routerTls: '' });
      const bad = tls(plan(['api.example.com;reboot']), `${dir}/b`);
      expect(bad.status).toBe(2);
      expect(bad.certbot).toEqual([]);
    } finally {
      execFileSync('rm', ['-rf', dir]);
    }
  });
});
