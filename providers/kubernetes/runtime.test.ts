import * as pulumi from '@pulumi/pulumi';
import { beforeAll, describe, expect, it } from 'vitest';
import { schemaProblems } from '../testing/k8s-schema.ts';
import {
  installMocks,
  isWireSecret,
  plaintextOccurrences,
  type RecordedResource,
  settle,
  unwrapSecrets,
} from '../testing/mocks.ts';
import { renderRuntimeObjects } from './runtime.ts';
import {
  args,
  CA,
  containers,
  names,
  type Obj,
  podSpec,
  pools,
  REDIS_PASSWORD,
  rendered,
  runtimeArgs,
  SIGNING,
  spec,
} from './test-runtime.ts';

describe('space:kubernetes:Runtime under the mock runtime', () => {
  let recorded: RecordedResource[];
  let k8sObjects: Obj[];

  beforeAll(async () => {
    recorded = await installMocks();
    const { Runtime } = await import('./runtime.ts');
    new Runtime('space', args());
    await settle(recorded);
    k8sObjects = recorded
      .filter((r) => r.type.startsWith('kubernetes:'))
      .map((r) => unwrapSecrets(r.inputs) as Obj);
  });

  it('registers the component and every rendered object as a child resource', () => {
    expect(recorded.some((r) => r.type === 'space:kubernetes:Runtime')).toBe(true);
    expect(k8sObjects.length).toBe(renderRuntimeObjects(args()).length);
    expect(
      recorded.filter((r) => r.type.startsWith('kubernetes:')).every((r) => r.name.startsWith('space-')),
    ).toBe(true);
  });

  it('every rendered object is valid against the Kubernetes schemas', () => {
    const problems = k8sObjects.flatMap(schemaProblems);
    expect(problems).toEqual([]);
  });

  it('the schema check catches a wrong type (control)', () => {
    const bad = structuredClone(k8sObjects.find((o) => o['kind'] === 'Deployment')!);
    (containers(bad)[0]!['ports'] as Obj[])[0]!['containerPort'] = 'eighty';
    expect(schemaProblems(bad).length).toBe(1);
  });

  it('no secret value appears outside a Pulumi secret in any resource input', () => {
    for (const needle of [REDIS_PASSWORD, SIGNING.split('\n')[1]!, CA.keyPem.split('\n')[1]!]) {
      const leaks = recorded.flatMap((r) =>
        plaintextOccurrences(r.inputs, needle).map((p) => `${r.name}: ${p}`),
      );
      expect(leaks).toEqual([]);
    }
    // control: the values did reach the Secrets, wrapped as secrets
    const redisSecret = recorded.find((r) => r.name === 'space-redis-secret')!;
    expect(isWireSecret(redisSecret.inputs['stringData'])).toBe(true);
    expect(JSON.stringify(unwrapSecrets(redisSecret.inputs))).toContain(REDIS_PASSWORD);
    expect(plaintextOccurrences({ a: [`x${REDIS_PASSWORD}`] }, REDIS_PASSWORD)).toEqual(['a[0]']);
  });

  it('the gateway CA key reaches only the gateway Secret, as a Pulumi secret', () => {
    const keyLine = CA.keyPem.split('\n')[1]!;
    const holders = recorded.filter((r) => JSON.stringify(unwrapSecrets(r.inputs)).includes(keyLine));
    expect(holders.map((r) => r.name)).toEqual(['space-gateway-ca']);
    expect(isWireSecret(holders[0]!.inputs['stringData'])).toBe(true);
  });
});

describe('renderRuntimeObjects policies', () => {
  const { byKind, workloads, agents } = rendered();

  it('/dev/kvm is mounted only into agents of VMM-driver pools', () => {
    const withKvm = workloads.filter((w) =>
      ((podSpec(w)['volumes'] as Obj[] | undefined) ?? []).some(
        (v) => (v['hostPath'] as Obj | undefined)?.['path'] === '/dev/kvm',
      ),
    );
    expect(withKvm.map((w) => (w['metadata'] as Obj)['name'])).toEqual(['space-agent-vmm']);
  });

  it('only agents are privileged, and every agent gets /dev/net/tun and host state paths', () => {
    const privileged = workloads.filter((w) =>
      containers(w).some((c) => (c['securityContext'] as Obj | undefined)?.['privileged'] === true),
    );
    expect(privileged).toEqual(agents);
    for (const a of agents) {
      const paths = (podSpec(a)['volumes'] as Obj[]).map((v) => (v['hostPath'] as Obj | undefined)?.['path']);
      expect(paths).toEqual(expect.arrayContaining(['/dev/net/tun', '/var/lib/space', '/var/run/netns']));
    }
  });

  it('every container has cpu/memory requests and a memory limit', () => {
    for (const w of workloads)
      for (const c of containers(w)) {
        const r = c['resources'] as { requests: Obj; limits: Obj };
        expect(r.requests['cpu'], `${c['name']}`).toBeDefined();
        expect(r.requests['memory'], `${c['name']}`).toBeDefined();
        expect(r.limits['memory'], `${c['name']}`).toBeDefined();
      }
  });

  it('no pod mounts a service-account token, but for the agent pods’ cordon watcher (a projected one)', () => {
    for (const w of workloads) {
      expect(podSpec(w)['automountServiceAccountToken']).toBe(false);
      const projected = ((podSpec(w)['volumes'] as Obj[] | undefined) ?? []).filter((v) => v['projected']);
      for (const c of containers(w))
        for (const m of (c['volumeMounts'] as Obj[] | undefined) ?? [])
          if (projected.some((v) => v['name'] === m['name'])) expect(c['name']).toBe('cordon-watch');
    }
  });

  it('the signing key is mounted only into the API; agents get only the public key', () => {
    const mountsSigning = workloads.filter((w) =>
      ((podSpec(w)['volumes'] as Obj[] | undefined) ?? []).some(
        (v) => (v['secret'] as Obj | undefined)?.['secretName'] === 'space-signing-key',
      ),
    );
    expect(mountsSigning.map((w) => (w['metadata'] as Obj)['name'])).toEqual(['space-api']);
  });

  it('Redis is not exposed outside the cluster; its policy opens only its port, to every source, and Redis wants the secret password', () => {
    const redisSvc = byKind('Service').find((s) => (s['metadata'] as Obj)['name'] === 'space-redis')!;
    expect(spec(redisSvc)['type']).toBe('ClusterIP');
    for (const w of workloads)
      for (const c of containers(w))
        for (const p of (c['ports'] as Obj[] | undefined) ?? [])
          if (p['containerPort'] === 6379) expect(p['hostPort']).toBeUndefined();
    const pol = byKind('NetworkPolicy').find(
      (p) => (p['metadata'] as Obj)['name'] === 'space-redis-ingress',
    )!;
    // host-network agents and gateways reach Redis from addresses the CNI picks (a Calico IPIP
    // tunnel address on LKE, Cilium's remote-node identity on CKS): no `from` to refuse them with
    expect(spec(pol)['ingress']).toEqual([{ ports: [{ protocol: 'TCP', port: 6379 }] }]);
    const redis = containers(byKind('StatefulSet')[0]!)[0]!;
    expect(redis['args']).toEqual(expect.arrayContaining(['--requirepass', '$(REDIS_PASSWORD)']));
    expect(redis['env']).toEqual([
      { name: 'REDIS_PASSWORD', valueFrom: { secretKeyRef: { name: 'space-redis', key: 'password' } } },
    ]);
    // every client reads its URL (with the password) from the same Secret
    for (const w of workloads.filter((x) => x['kind'] !== 'StatefulSet'))
      for (const c of containers(w).filter((x) => x['name'] !== 'cordon-watch'))
        expect(c['env'], (w['metadata'] as Obj)['name'] as string).toContainEqual({
          name: 'SPACE_REDIS_URL',
          valueFrom: { secretKeyRef: { name: 'space-redis', key: 'url' } },
        });
    const deny = byKind('NetworkPolicy').find(
      (p) => (p['metadata'] as Obj)['name'] === 'space-default-deny-ingress',
    )!;
    expect(spec(deny)).toEqual({ podSelector: {}, policyTypes: ['Ingress'] });
  });

  it('agents roll one node at a time with a grace period covering the drain budget', () => {
    for (const a of agents) {
      expect(spec(a)['updateStrategy']).toEqual({
        type: 'RollingUpdate',
        rollingUpdate: { maxUnavailable: 1, maxSurge: 0 },
      });
      expect(podSpec(a)['terminationGracePeriodSeconds']).toBeGreaterThanOrEqual(120);
      const envs = Object.fromEntries(
        (containers(a)[0]!['env'] as Obj[]).map((e) => [e['name'], e['value']]),
      );
      expect(envs['SPACE_AGENT_ON_SHUTDOWN']).toBe('keep');
    }
    expect(podSpec(agents[0]!)['terminationGracePeriodSeconds']).toBe(150);
  });

  it('each agent DaemonSet selects its pool and sets its driver', () => {
    for (const pool of pools) {
      const a = agents.find((x) => (x['metadata'] as Obj)['name'] === `space-agent-${pool.name}`)!;
      expect(podSpec(a)['nodeSelector']).toEqual({ 'space.dev/pool': pool.name });
      const envs = Object.fromEntries(
        (containers(a)[0]!['env'] as Obj[]).map((e) => [e['name'], e['value']]),
      );
      expect(envs['SPACE_DRIVER']).toBe(pool.driver);
    }
  });

  it('the API has probes on /readyz and /healthz, an HPA and a PDB', () => {
    const api = byKind('Deployment')[0]!;
    const c = containers(api)[0]!;
    expect(((c['readinessProbe'] as Obj)['httpGet'] as Obj)['path']).toBe('/readyz');
    expect(((c['livenessProbe'] as Obj)['httpGet'] as Obj)['path']).toBe('/healthz');
    // one HPA each for the API and the router
    expect(byKind('HorizontalPodAutoscaler')).toHaveLength(2);
    const pdb = (name: string) =>
      byKind('PodDisruptionBudget').find((o) => (o['metadata'] as Obj)['name'] === name)!;
    // one pod at a time, whatever the HPA's count: a drain always proceeds
    expect(spec(pdb('space-api'))['maxUnavailable']).toBe(1);
  });

  it('Redis is durable: AOF fsync every second on a volume, and a disruption budget no eviction passes', () => {
    const sts = byKind('StatefulSet').find((o) => (o['metadata'] as Obj)['name'] === 'space-redis')!;
    const args = containers(sts)[0]!['args'] as string[];
    const opt = (k: string) => args[args.indexOf(`--${k}`) + 1];
    expect(opt('appendonly')).toBe('yes');
    expect(opt('appendfsync')).toBe('everysec');
    expect((containers(sts)[0]!['volumeMounts'] as Obj[])[0]).toMatchObject({
      name: 'data',
      mountPath: '/data',
    });
    expect((spec(sts)['volumeClaimTemplates'] as Obj[]).length).toBe(1);
    const pdb = byKind('PodDisruptionBudget').find((o) => (o['metadata'] as Obj)['name'] === 'space-redis')!;
    // one replica: maxUnavailable 0 refuses every eviction (minAvailable 1 would do the same)
    expect(spec(pdb)).toMatchObject({
      maxUnavailable: 0,
      selector: spec(sts)['selector'] as Obj,
    });
    expect((spec(pdb)['selector'] as Obj)['matchLabels']).toEqual(
      (spec(sts)['selector'] as Obj)['matchLabels'],
    );
    // an external Redis gets no budget
    const ext = renderRuntimeObjects(runtimeArgs({ redis: { mode: 'external', url: 'redis://r:6379' } }));
    expect(ext.filter((r) => r.object.kind === 'PodDisruptionBudget').map((r) => r.role)).toEqual([
      'api-pdb',
      'router-pdb',
    ]);
  });

  it('Prometheus scrapes every service: api, agents and gateways carry scrape annotations naming the port their /metrics is on', () => {
    const ann = (o: Obj) =>
      ((spec(o)['template'] as Obj)['metadata'] as Obj)['annotations'] as Record<string, string>;
    const component = (o: Obj) =>
      ((o['metadata'] as Obj)['labels'] as Record<string, string>)['app.kubernetes.io/component'];
    const want: Record<string, string> = { api: '8080', router: '8082', agent: '8081', gateway: '15090' };
    const seen = new Set<string>();
    for (const w of workloads.filter((o) => component(o) !== 'redis')) {
      const c = component(w)!;
      seen.add(c);
      expect(ann(w), c).toEqual({
        'prometheus.io/scrape': 'true',
        'prometheus.io/port': want[c],
        'prometheus.io/path': '/metrics',
      });
    }
    expect([...seen].sort()).toEqual(['agent', 'api', 'gateway', 'router']);
    // the gateway serves /metrics on that port, on the node address
    const g = workloads.find((o) => component(o) === 'gateway')!;
    const genv = Object.fromEntries(
      (containers(g)[0]!['env'] as { name: string; value?: string }[]).map((e) => [e.name, e.value]),
    );
    expect(genv['SPACE_GATEWAY_METRICS_PORT']).toBe('15090');
    expect(genv['SPACE_GATEWAY_METRICS_HOST']).toBe('$(POD_IP)');
    // and the dashboard ships as a ConfigMap for Grafana's sidecar
    const dash = byKind('ConfigMap').find(
      (o) => (o['metadata'] as Obj)['name'] === 'space-grafana-dashboard',
    )!;
    expect(((dash['metadata'] as Obj)['labels'] as Obj)['grafana_dashboard']).toBe('1');
    expect(JSON.parse((dash['data'] as Record<string, string>)['space.json']!).uid).toBe('space-overview');
  });

  it('no workload an HPA scales sets replicas (pulumi up would reset the autoscaler)', () => {
    for (const hpa of byKind('HorizontalPodAutoscaler')) {
      const target = (spec(hpa)['scaleTargetRef'] as Obj)['name'];
      const scaled = [...byKind('Deployment'), ...byKind('StatefulSet')].find(
        (o) => (o['metadata'] as Obj)['name'] === target,
      )!;
      expect(scaled, String(target)).toBeDefined();
      expect(spec(scaled)['replicas'], String(target)).toBeUndefined();
    }
  });

  it('client-facing Services carry the cloud exposure: the API and the router, exposed alike; nothing else', () => {
    const exposure = {
      annotations: { 'example.invalid/lb': 'public' },
      loadBalancerSourceRanges: ['198.51.100.0/24'],
    };
    const objs = renderRuntimeObjects(args({ exposure })).map((r) => r.object as Obj);
    const svc = (name: string) =>
      objs.find((o) => o['kind'] === 'Service' && (o['metadata'] as Obj)['name'] === name)!;
    for (const [name, port] of [
      ['space-api', 8080],
      ['space-router', 8082],
    ] as const) {
      expect((svc(name)['metadata'] as Obj)['annotations']).toEqual(exposure.annotations);
      expect(spec(svc(name))).toMatchObject({
        type: 'LoadBalancer',
        loadBalancerSourceRanges: ['198.51.100.0/24'],
        ports: [{ port, targetPort: port }],
      });
    }
    expect((spec(svc('space-router'))['selector'] as Obj)['app.kubernetes.io/component']).toBe('router');
    // only the API and the router are client-facing: every other Service is ClusterIP, unexposed
    const others = objs.filter(
      (o) =>
        o['kind'] === 'Service' &&
        !['space-api', 'space-router'].includes(String((o['metadata'] as Obj)['name'])),
    );
    expect(others.length).toBeGreaterThan(0);
    for (const o of others) {
      expect(spec(o)['type']).toBe('ClusterIP');
      expect((o['metadata'] as Obj)['annotations']).toBeUndefined();
    }
    // agents and gateways declare no Service at all; gateways no port; agents only their host port
    // (closed to clients by each cloud's firewall, see providers/<cloud>)
    // a NodePort (kind) takes neither annotations nor source ranges
    const np = renderRuntimeObjects(args({ exposure, apiServiceType: 'NodePort', apiNodePort: 30080 }))
      .map((r) => r.object as Obj)
      .find((o) => o['kind'] === 'Service' && (o['metadata'] as Obj)['name'] === 'space-api')!;
    expect((np['metadata'] as Obj)['annotations']).toBeUndefined();
    expect(spec(np)['loadBalancerSourceRanges']).toBeUndefined();
  });

  it('the router: Deployment without replicas, HPA and PDB like the API, only Redis and the verify key', () => {
    const objs = renderRuntimeObjects(
      args({ apiReplicas: 3, router: { publicUrl: 'https://r.example.com' } }),
    );
    const get = (kind: string, name: string) =>
      objs
        .map((r) => r.object as Obj)
        .find((o) => o['kind'] === kind && (o['metadata'] as Obj)['name'] === name)!;
    const dep = get('Deployment', 'space-router');
    expect(schemaProblems(dep)).toEqual([]);
    expect(spec(dep)['replicas']).toBeUndefined();
    expect(spec(dep)['strategy']).toEqual(spec(get('Deployment', 'space-api'))['strategy']);
    const c = (podSpec(dep)['containers'] as Obj[])[0]!;
    expect(c['command']).toEqual(['node', 'runtime/router/server.ts']);
    // the API's own Node flags (a larger young generation) go with its command, and only with it
    const apiCommand = (podSpec(get('Deployment', 'space-api'))['containers'] as Obj[])[0]!['command'];
    expect(apiCommand).toEqual([
      'node',
      '--min-semi-space-size=16',
      '--max-semi-space-size=64',
      'runtime/api/server.ts',
    ]);
    const renv = Object.fromEntries(
      (c['env'] as Obj[]).map((e) => [e['name'], e['value'] ?? e['valueFrom']]),
    );
    expect(renv).toMatchObject({
      SPACE_ROUTER_HOST: '0.0.0.0',
      SPACE_ROUTER_PORT: '8082',
      SPACE_VERIFY_KEY_FILE: '/etc/space/keys/verify.pem',
      SPACE_REDIS_URL: { secretKeyRef: { name: 'space-redis', key: 'url' } },
    });
    // the verify key only: never the signing key Secret, never the gateway CA
    const vols = (podSpec(dep)['volumes'] as Obj[]).map((v) => JSON.stringify(v));
    expect(vols.join()).toContain('space-verify-key');
    expect(vols.join()).not.toMatch(/space-signing-key|space-gateway-ca/);
    expect(podSpec(dep)['automountServiceAccountToken']).toBe(false);
    expect(spec(get('HorizontalPodAutoscaler', 'space-router'))).toMatchObject({
      scaleTargetRef: { kind: 'Deployment', name: 'space-router' },
      minReplicas: 3,
      maxReplicas: 10,
    });
    expect(spec(get('PodDisruptionBudget', 'space-router'))).toMatchObject({
      maxUnavailable: 1,
      selector: { matchLabels: { 'app.kubernetes.io/component': 'router' } },
    });
    // the API hands out the router's URL, so clients never get an agent address
    const api = (podSpec(get('Deployment', 'space-api'))['containers'] as Obj[])[0]!;
    expect((api['env'] as Obj[]).find((e) => e['name'] === 'SPACE_ROUTER_URL')?.['value']).toBe(
      'https://r.example.com',
    );
    // the router pods admit only their port
    expect(spec(get('NetworkPolicy', 'space-router-ingress'))).toMatchObject({
      podSelector: { matchLabels: { 'app.kubernetes.io/component': 'router' } },
      ingress: [{ ports: [{ protocol: 'TCP', port: 8082 }] }],
    });
  });

  it('TLS: a cert-manager Certificate for both hostnames; the API and the router serve HTTPS from its Secret on 443', () => {
    const tls = {
      issuer: { name: 'letsencrypt' },
      apiHostname: 'api.example.com',
      routerHostname: 'r.example.com',
    };
    const objs = renderRuntimeObjects(args({ tls })).map((r) => r.object as Obj);
    const get = (kind: string, name: string) =>
      objs.find((o) => o['kind'] === kind && (o['metadata'] as Obj)['name'] === name)!;
    const cert = get('Certificate', 'space-tls');
    expect(schemaProblems(cert)).toEqual([]);
    expect(spec(cert)).toMatchObject({
      secretName: 'space-tls',
      dnsNames: ['api.example.com', 'r.example.com'],
      issuerRef: { name: 'letsencrypt', kind: 'ClusterIssuer', group: 'cert-manager.io' },
    });
    // a schema that can fail: a Certificate without its issuer is refused
    expect(schemaProblems({ ...cert, spec: { ...spec(cert), issuerRef: undefined } })).not.toEqual([]);
    for (const [svc, port, prefix] of [
      ['api', 8080, 'SPACE_API_TLS'],
      ['router', 8082, 'SPACE_ROUTER_TLS'],
    ] as const) {
      const dep = get('Deployment', `space-${svc}`);
      const c = (podSpec(dep)['containers'] as Obj[])[0]!;
      const e = Object.fromEntries((c['env'] as Obj[]).map((x) => [x['name'], x['value']]));
      expect(e[`${prefix}_CERT_FILE`]).toBe('/etc/space/tls/tls.crt');
      expect(e[`${prefix}_KEY_FILE`]).toBe('/etc/space/tls/tls.key');
      expect((c['readinessProbe'] as { httpGet: Obj }).httpGet['scheme']).toBe('HTTPS');
      expect(JSON.stringify(podSpec(dep)['volumes'])).toContain('"secretName":"space-tls"');
      expect(spec(get('Service', `space-${svc}`))['ports']).toMatchObject([{ port: 443, targetPort: port }]);
    }
    const api = (podSpec(get('Deployment', 'space-api'))['containers'] as Obj[])[0]!;
    expect((api['env'] as Obj[]).find((x) => x['name'] === 'SPACE_ROUTER_URL')?.['value']).toBe(
      'https://r.example.com',
    );
    // no TLS asked: no Certificate, plain HTTP probes
    expect(renderRuntimeObjects(args()).some((r) => r.object.kind === 'Certificate')).toBe(false);
  });

  it('with an external Redis no Redis workload, Service or password is rendered', () => {
    const ext = renderRuntimeObjects(
      args({ redis: { mode: 'external', url: pulumi.secret('redis://x:6379') } }),
    );
    expect(ext.map((r) => r.role)).not.toContain('redis');
    expect(ext.map((r) => r.role)).not.toContain('redis-svc');
  });

  it('every image is the one repository at the one version', () => {
    const images = workloads
      .filter((w) => (w['metadata'] as Obj)['name'] !== 'space-redis')
      .flatMap((w) => containers(w).map((c) => c['image']));
    expect(new Set(images)).toEqual(new Set(['ghcr.io/space-sandbox/space:1.2.3']));
    expect(names(containers(byKind('Deployment')[0]!))).toEqual(['api']);
  });
});
