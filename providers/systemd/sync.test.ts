/**
 * `space-config-sync` as rendered, run for real (sh) on this host: the VM's `/etc/space` moved
 * into a temp folder, a fake `redis-cli` answering each field, a fake `systemctl`, and a `podman`
 * that runs the real `runtime/cli/vm-config-apply.ts` (what the VM runs from its image) with
 * this repository's Node. What a node with the Redis password can plant in Redis must never reach
 * an env file.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { renderEnvFile } from '../../runtime/core/env-file.ts';
import { vmServiceDocument } from '../../runtime/core/vm-config.ts';
import {
  agentPlan,
  agentServiceEnv,
  controlPlan,
  controlServiceEnv,
  LETS_ENCRYPT_DIRECTORY,
  type VmPlan,
} from './cloud-init.ts';
import { tunableSettings, VM_CONFIG_POLICY_FILE, vmConfigPolicy } from './sync.ts';
import { agent, common, control, envOf, file, pool, ROUTER_URL } from './test-plans.ts';

const REPO = new URL('../../', import.meta.url).pathname;
const doc = vmServiceDocument;

/**
 * Runs a VM's rendered sync script (sh) with `fields` in Redis (absent: nil), `runs` times over the
 * same folder. Returns what it restarted, its status and stderr per run, and the env files after.
 */
function sync(plan: VmPlan, fields: Record<string, string>, opts: { redisUp?: boolean; runs?: number } = {}) {
  const dir = execFileSync('mktemp', ['-d']).toString().trim();
  const etc = `${dir}/etc`;
  const seen = `${dir}/seen`;
  execFileSync('mkdir', ['-p', etc, `${dir}/redis`, `${dir}/bin`]);
  for (const f of plan.files.filter((f) => f.path.startsWith('/etc/space/')))
    writeFileSync(f.path.replace('/etc/space', etc), f.content);
  for (const [k, v] of Object.entries(fields)) writeFileSync(`${dir}/redis/${k}`, v);
  writeFileSync(
    `${dir}/bin/redis-cli`,
    (opts.redisUp ?? true)
      ? `#!/bin/sh\necho "$*" >> ${dir}/redis-args\necho "$REDISCLI_AUTH" > ${dir}/redis-auth\n[ -e "${dir}/redis/$8" ] && cat "${dir}/redis/$8" || echo ""\n`
      : '#!/bin/sh\necho "Could not connect to Redis" >&2\nexit 1\n',
    { mode: 0o755 },
  );
  writeFileSync(`${dir}/bin/systemctl`, `#!/bin/sh\necho "$*" >> ${dir}/restarted\n`, { mode: 0o755 });
  // the image's command, run here: everything up to "node" is podman's own arguments
  writeFileSync(
    `${dir}/bin/podman`,
    `#!/bin/sh\necho "$*" >> ${dir}/podman-args\nwhile [ "$1" != node ]; do shift; done; shift\ncd ${REPO} && exec ${process.execPath} "$@"\n`,
    { mode: 0o755 },
  );
  const script = file(plan, '/usr/local/sbin/space-config-sync')!
    .replaceAll('/etc/space', etc)
    .replaceAll('/var/lib/space/config-sync', seen);
  const runs = Array.from({ length: opts.runs ?? 1 }, () => {
    execFileSync('rm', ['-f', `${dir}/restarted`, `${dir}/podman-args`]);
    const r = spawnSync('sh', ['-c', script], {
      env: { PATH: `${dir}/bin:/usr/bin:/bin` },
      encoding: 'utf8',
    });
    const read = (f: string) => spawnSync('cat', [f], { encoding: 'utf8' }).stdout;
    return {
      status: r.status,
      stderr: r.stderr,
      restarted: read(`${dir}/restarted`).trim().split('\n').filter(Boolean),
      podman: read(`${dir}/podman-args`).trim().split('\n').filter(Boolean),
    };
  });
  const read = (f: string) => spawnSync('cat', [f], { encoding: 'utf8' }).stdout;
  const files = Object.fromEntries(
    ['space-api', 'space-router', 'space-agent', 'space-gateway', 'space-tls'].map((n) => [
      n,
      read(`${etc}/${n}.env`),
    ]),
  );
  const redisArgs = read(`${dir}/redis-args`).trim().split('\n').filter(Boolean);
  const redisAuth = read(`${dir}/redis-auth`).trim();
  execFileSync('rm', ['-rf', dir]);
  return { ...runs[0]!, runs, redisArgs, redisAuth, env: (name: string) => files[name] };
}

/** The documents `pulumi up` writes for `plan`'s services (what the VM was created with). */
const current = (services: Record<string, Record<string, string>>) =>
  Object.fromEntries(Object.entries(services).map(([k, v]) => [k, doc(v)]));
const controlDocs = () => current(controlServiceEnv({ ...common, routerUrl: ROUTER_URL }));
const agentDocs = () => current(agentServiceEnv({ ...common, pool, controlAddress: '10.10.0.2' }));

// each case runs the rendered script, and the real checker (a Node process) per document: seconds on a loaded host
describe('config changes reach existing VMs without SSH: space-config-sync', { timeout: 60_000 }, () => {
  it('OTEL_* stay tunable on the services that trace (api, router, agent), even when set at creation; not on the gateway', () => {
    const services = ['space-api', 'space-router', 'space-agent@default', 'space-gateway'].map((service) => ({
      service,
      file: `/etc/space/${service.replace('@default', '')}.env`,
      unit: service.replace('@default', ''),
    }));
    const otel = { OTEL_EXPORTER_OTLP_ENDPOINT: 'http://10.0.0.5:4318' };
    const policy = vmConfigPolicy(services, Object.fromEntries(services.map((x) => [x.service, otel])));
    expect(policy.services.map((x) => [x.service, x.otel ?? false])).toEqual([
      ['space-api', true],
      ['space-router', true],
      ['space-agent@default', true],
      ['space-gateway', false],
    ]);
    for (const x of policy.services)
      expect(Object.keys(x.pinned).includes('OTEL_EXPORTER_OTLP_ENDPOINT'), x.service).toBe(!x.otel);
  });

  it('what pulumi up writes for a service is byte for byte what a new VM of the same config has', () => {
    const cArgs = { ...common, routerUrl: ROUTER_URL, bootstrapKeySha256: 'a'.repeat(64) };
    const c = controlServiceEnv(cArgs);
    expect(Object.keys(c)).toEqual(['space-api', 'space-router']);
    for (const [svc, env] of Object.entries(c))
      expect(renderEnvFile(env), svc).toBe(file(controlPlan(cArgs), `/etc/space/${svc}.env`));
    expect(c['space-api']!['SPACE_BOOTSTRAP_API_KEY_SHA256']).toBe('a'.repeat(64));
    const aArgs = { ...common, pool, controlAddress: '10.10.0.2' };
    const a = agentServiceEnv(aArgs);
    expect(Object.keys(a)).toEqual(['space-gateway', 'space-agent@default']);
    expect(renderEnvFile(a['space-gateway']!)).toBe(file(agentPlan(aArgs), '/etc/space/space-gateway.env'));
    expect(renderEnvFile(a['space-agent@default']!)).toBe(
      file(agentPlan(aArgs), '/etc/space/space-agent.env'),
    );
  });

  it('every VM runs the timer, reads its own services from the control VM’s Redis with the password, and checks them in a container without network', () => {
    for (const [plan, host] of [
      [control(), '127.0.0.1'],
      [agent(), '10.10.0.2'],
    ] as const) {
      expect(file(plan, '/usr/local/sbin/space-config-sync')).toContain(`redis-cli -h ${host} -p 6379`);
      expect(file(plan, '/etc/systemd/system/space-config-sync.timer')).toContain('OnUnitInactiveSec=1min');
      expect(plan.commands.join('\n')).toContain('space-config-sync.timer');
      expect(plan.files.find((f) => f.path === VM_CONFIG_POLICY_FILE)?.mode).toBe('0644');
    }
    const r = sync(agent(), agentDocs());
    expect(r.redisArgs).toEqual([
      '-h 10.10.0.2 -p 6379 --raw HGET space:deploy:vm-config space-gateway',
      '-h 10.10.0.2 -p 6379 --raw HGET space:deploy:vm-config space-agent@default',
    ]);
    expect(r.redisAuth).toBe(common.redisPassword);
    expect(r.podman[0]).toMatch(
      /^run --rm -i --network none --cap-drop all --security-opt no-new-privileges -v \S+:\S+:ro ghcr\.io\/space-sandbox\/space:0\.1\.0 node runtime\/cli\/vm-config-apply\.ts \S+ space-gateway$/,
    );
  });

  it('restarts only the service whose settings changed, and nothing when all are current or absent; an unchanged document is not checked again', () => {
    expect(sync(control(), {})).toMatchObject({ status: 0, restarted: [] });
    expect(sync(control(), controlDocs())).toMatchObject({ status: 0, restarted: [] });
    const docs = controlDocs();
    const api = { ...JSON.parse(docs['space-api']!), SPACE_LOG_LEVEL: 'debug' };
    const r = sync(control(), { ...docs, 'space-api': doc(api) }, { runs: 2 });
    expect(r).toMatchObject({ status: 0, restarted: ['restart space-api'] });
    expect(r.env('space-api')).toBe(renderEnvFile(api));
    expect(r.env('space-router')).toBe(file(control(), '/etc/space/space-router.env'));
    // the next minute: nothing to do, no container started
    expect(r.runs[1]).toMatchObject({ status: 0, restarted: [], podman: [] });
  });

  it('on a node, a gateway change restarts the gateway before the agent’s own change restarts the agent', () => {
    const docs = agentDocs();
    const gw = { ...JSON.parse(docs['space-gateway']!), SPACE_GATEWAY_DNS_QPS: '50' };
    const ag = { ...JSON.parse(docs['space-agent@default']!), SPACE_WARM_POOL_SIZE: '2' };
    const r = sync(agent(), {
      'space-gateway': doc(gw),
      'space-agent@default': doc(ag),
      'space-agent@other': doc({ SPACE_WARM_POOL_SIZE: '9' }),
    });
    expect(r).toMatchObject({ status: 0, restarted: ['restart space-gateway', 'restart space-agent'] });
    expect(envOf(r.env('space-agent')!)['SPACE_WARM_POOL_SIZE']).toBe('2');
  });

  it('what a node with the Redis password plants never reaches an env file: unknown names, loader variables, a newline, a pinned setting, not JSON', () => {
    const docs = agentDocs();
    const agentDoc = JSON.parse(docs['space-agent@default']!) as Record<string, string>;
    const before = file(agent(), '/etc/space/space-agent.env')!;
    const planted: Record<string, string>[] = [
      { ...agentDoc, NODE_OPTIONS: '--require /tmp/x.js' },
      { ...agentDoc, LD_PRELOAD: '/tmp/x.so' },
      { ...agentDoc, SPACE_NO_SUCH_SETTING: '1' },
      { ...agentDoc, SPACE_WARM_POOL_SIZE: '2\nNODE_OPTIONS=--require /tmp/x.js' },
      // the Redis URL has its own root-only file; a document may not point a service elsewhere
      { ...agentDoc, SPACE_REDIS_URL: 'redis://attacker.example:6379' },
      // what the deployment owns keeps the value the VM was made with
      { ...agentDoc, SPACE_VERIFY_KEY_FILE: '/tmp/attacker.pem' },
      { ...agentDoc, SPACE_DRIVER: 'qemu' },
      // a root service pointed at another program
      { ...agentDoc, SPACE_RUNSC_BINARY: '/tmp/x' },
    ];
    const raw = [
      'SPACE_WARM_POOL_SIZE=2\nNODE_OPTIONS=--require /tmp/x.js\n',
      '["NODE_OPTIONS=--require /tmp/x.js"]',
      '{"SPACE_WARM_POOL_SIZE":2}',
    ];
    for (const bad of [...planted.map(doc), ...raw]) {
      const r = sync(agent(), { 'space-agent@default': bad });
      expect(r.status, bad).toBe(1);
      expect(r.restarted, bad).toEqual([]);
      expect(r.stderr, bad).toContain('refusing space-agent@default');
      expect(r.env('space-agent'), bad).toBe(before);
      expect(r.env('space-agent'), bad).not.toMatch(/NODE_OPTIONS|LD_PRELOAD|attacker|SPACE_REDIS_URL/);
    }
    // one refused service leaves the others applied
    const gw = { ...JSON.parse(docs['space-gateway']!), SPACE_GATEWAY_DNS_QPS: '50' };
    const mixed = sync(agent(), { 'space-gateway': doc(gw), 'space-agent@default': doc(planted[0]!) });
    expect(mixed).toMatchObject({ status: 1, restarted: ['restart space-gateway'] });
  });

  it('fails without Redis, changing nothing', () => {
    expect(sync(control(), {}, { redisUp: false })).toMatchObject({ status: 1, restarted: [] });
  });

  it('with ACME, the TLS unit is synced first, so a name change is in place before the API restarts', () => {
    const plan = controlPlan({
      ...common,
      routerUrl: ROUTER_URL,
      acme: { hostnames: ['api.example.com'], email: 'ops@example.com', server: LETS_ENCRYPT_DIRECTORY },
    });
    const api = { ...JSON.parse(controlDocs()['space-api']!), SPACE_LOG_LEVEL: 'debug' };
    const r = sync(plan, {
      'space-tls': doc({
        SPACE_ACME_EMAIL: 'ops@example.com',
        SPACE_ACME_SERVER: 'https://acme.test/dir',
        SPACE_TLS_HOSTNAMES: 'api.example.com,router.example.com',
      }),
      'space-api': doc(api),
    });
    expect(r.restarted).toEqual(['restart space-tls', 'restart space-api']);
  });

  it('the names pulumi up may change are the service’s own settings, never one the deployment owns', () => {
    const agentNames = tunableSettings('space-agent@default');
    expect(agentNames).toContain('SPACE_WARM_POOL_SIZE');
    for (const owned of ['SPACE_DRIVER', 'SPACE_VERIFY_KEY_FILE', 'SPACE_REDIS_URL', 'SPACE_AGENT_STATE_DIR'])
      expect(agentNames).not.toContain(owned);
    // a program a root service runs, a file or directory it trusts: fixed when the VM is made
    for (const path of ['SPACE_QEMU_BINARY', 'SPACE_RUNSC_BINARY', 'SPACE_HIBERNATE_DIR'])
      expect(agentNames).not.toContain(path);
    expect(tunableSettings('space-gateway')).not.toContain('SPACE_GATEWAY_UPSTREAM_CA_FILE');
    expect(tunableSettings('space-api')).not.toContain('SPACE_BOOTSTRAP_API_KEY_SHA256');
    expect(tunableSettings('space-api')).toContain('SPACE_ROUTER_URL');
    expect(() => tunableSettings('space-other')).toThrow(/no settings are known/);
  });
});
