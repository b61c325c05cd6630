import * as pulumi from '@pulumi/pulumi';
import { describe, expect, it } from 'vitest';
import { agentSettings } from '../../runtime/agent/config.ts';
import { gatewaySettings } from '../../runtime/gateway/config.ts';
import { GATEWAY_PORTS } from '../runtime-settings.ts';
import { renderRuntimeObjects } from './runtime.ts';
import { args, CA, containers, type Obj, podSpec, pools, rendered, spec } from './test-runtime.ts';

describe('the gateway on Kubernetes', () => {
  const { byKind, workloads, agents, gateways, envOf, mounts, volumes, container, gatewayOf } = rendered();

  it('the gateway is on by default and runs on every agent node (same selector and tolerations), on the host network', () => {
    const { gatewayEnabled: _g, ...rest } = args();
    expect(renderRuntimeObjects(rest).map((r) => r.role)).toContain('gateway-vmm');
    expect(gateways).toHaveLength(pools.length);
    for (const a of agents) {
      const g = gatewayOf(a);
      expect(g, `gateway beside ${(a['metadata'] as Obj)['name']}`).toBeDefined();
      expect(podSpec(g!)['tolerations']).toEqual(podSpec(a)['tolerations']);
      expect(podSpec(g!)['hostNetwork']).toBe(true);
      expect(podSpec(g!)['affinity']).toBeUndefined();
    }
  });

  it('gateway and agent share the control socket (same path, same host directory, both root) and the ports', () => {
    for (const a of agents) {
      const g = gatewayOf(a)!;
      const ae = envOf(container(a, 'agent'));
      const ge = envOf(container(g, 'gateway'));
      expect(ae['SPACE_GATEWAY_CONTROL_SOCKET']).toBe('/run/space/gateway.sock');
      expect(ge['SPACE_GATEWAY_CONTROL_SOCKET']).toBe(ae['SPACE_GATEWAY_CONTROL_SOCKET']);
      for (const p of ['DNS', 'HTTP', 'TLS'])
        expect(ge[`SPACE_GATEWAY_${p}_PORT`], p).toBe(ae[`SPACE_GATEWAY_${p}_PORT`]);
      expect(ae['SPACE_GATEWAY_DNS_PORT']).toBe(String(GATEWAY_PORTS.dns));
      // every name set is one the service declares
      for (const k of Object.keys(ae).filter((k) => k.startsWith('SPACE_')))
        expect(
          Object.values(agentSettings).map((s) => s.env),
          k,
        ).toContain(k);
      // POD_IP only feeds $(POD_IP) in SPACE_GATEWAY_METRICS_HOST
      for (const k of Object.keys(ge).filter((k) => k !== 'POD_IP'))
        expect(
          Object.values(gatewaySettings).map((s) => s.env),
          k,
        ).toContain(k);
      // the socket's directory is the same host path in both pods
      const hostDir = (w: Obj, c: Obj) => {
        const m = mounts(c).find((x) => x['mountPath'] === '/run/space')!;
        return (volumes(w).find((v) => v['name'] === m['name'])!['hostPath'] as Obj)['path'];
      };
      expect(hostDir(a, container(a, 'agent'))).toBe('/run/space');
      expect(hostDir(g, container(g, 'gateway'))).toBe('/run/space');
      expect((container(g, 'gateway')['securityContext'] as Obj)['runAsUser']).toBe(0);
      expect((container(a, 'agent')['securityContext'] as Obj)['runAsUser']).toBe(0);
    }
  });

  it('the CA key is only in the gateway Secret, mounted only by gateways; agents get the certificate as SPACE_TRUSTED_CA_FILE', () => {
    const secret = byKind('Secret').find((x) => (x['metadata'] as Obj)['name'] === 'space-gateway-ca')!;
    expect(Object.keys(secret['stringData'] as Obj).sort()).toEqual(['ca.crt', 'ca.key']);
    expect(pulumi.Output.isInstance((secret['stringData'] as Obj)['ca.key'])).toBe(true);
    const mountsCaSecret = workloads.filter((w) =>
      volumes(w).some((v) => (v['secret'] as Obj | undefined)?.['secretName'] === 'space-gateway-ca'),
    );
    expect(mountsCaSecret).toEqual(gateways);
    for (const g of gateways) {
      const v = volumes(g).find(
        (x) => (x['secret'] as Obj | undefined)?.['secretName'] === 'space-gateway-ca',
      )!;
      expect((v['secret'] as Obj)['defaultMode']).toBe(0o400);
      const ge = envOf(container(g, 'gateway'));
      expect(ge['SPACE_GATEWAY_CA_KEY_FILE']).toBe('/etc/space/gateway-ca/ca.key');
    }
    const cm = byKind('ConfigMap').find((x) => (x['metadata'] as Obj)['name'] === 'space-gateway-ca-cert')!;
    expect(cm['data']).toEqual({ 'ca.crt': CA.certPem });
    for (const a of agents) {
      const ae = envOf(container(a, 'agent'));
      expect(ae['SPACE_TRUSTED_CA_FILE']).toBe(
        envOf(container(gatewayOf(a)!, 'gateway'))['SPACE_GATEWAY_CA_CERT_FILE'],
      );
      const m = mounts(container(a, 'agent')).find((x) => x['mountPath'] === '/etc/space/gateway-ca')!;
      expect(volumes(a).find((v) => v['name'] === m['name'])!['configMap']).toEqual({
        name: 'space-gateway-ca-cert',
      });
    }
  });

  it('no gateway port is exposed: no container or host port, no Service; a host firewall is installed first', () => {
    const gwPorts: number[] = Object.values(GATEWAY_PORTS);
    for (const w of workloads)
      for (const c of containers(w))
        for (const p of (c['ports'] as Obj[] | undefined) ?? []) {
          expect(gwPorts).not.toContain(p['containerPort']);
          expect(gwPorts).not.toContain(p['hostPort']);
        }
    for (const svc of byKind('Service'))
      for (const p of spec(svc)['ports'] as Obj[]) {
        expect(gwPorts).not.toContain(p['port']);
        expect(gwPorts).not.toContain(p['targetPort']);
      }
    const guard = byKind('ConfigMap').find((x) => (x['metadata'] as Obj)['name'] === 'space-gateway-guard')!;
    const nft = (guard['data'] as Record<string, string>)['guard.nft']!;
    expect(nft).toContain('iifname "spv*" accept');
    expect(nft).toContain(`tcp dport { ${gwPorts.join(', ')} } counter drop`);
    expect(nft).toContain(`udp dport ${GATEWAY_PORTS.dns} counter drop`);
    for (const g of gateways) {
      const init = (podSpec(g)['initContainers'] as Obj[])[0]!;
      expect(init['command']).toEqual(['nft', '-f', '/etc/space/nft/guard.nft']);
      expect((init['securityContext'] as Obj)['capabilities']).toEqual({ drop: ['ALL'], add: ['NET_ADMIN'] });
      // the gateway itself: not privileged, no capability
      const sc = container(g, 'gateway')['securityContext'] as Obj;
      expect(sc['privileged']).toBeUndefined();
      expect(sc['capabilities']).toEqual({ drop: ['ALL'] });
    }
  });

  it('a pool’s gateway and agents roll at the same time, one node at a time each: the agents do not wait for the whole pool’s gateway roll', () => {
    const out = renderRuntimeObjects(args());
    for (const pool of pools)
      for (const role of [`gateway-${pool.name}`, `agent-${pool.name}`]) {
        const r = out.find((x) => x.role === role)!;
        expect(r.after, role).toBeUndefined();
        expect(spec(r.object as Obj)['updateStrategy']).toEqual({
          type: 'RollingUpdate',
          rollingUpdate: { maxUnavailable: 1, maxSurge: 0 },
        });
      }
  });

  it('Pulumi waits for each DaemonSet as long as its pool needs: 10 minutes plus a per-node budget (the drain budget counts for agents)', () => {
    const timeouts = (a: ReturnType<typeof args>) =>
      Object.fromEntries(renderRuntimeObjects(a).map((r) => [r.role, r.timeoutSeconds]));
    const big = pools.map((p) => ({ ...p, count: 50 }));
    const small = timeouts(args({ nodePools: pools.map((p) => ({ ...p, count: 1 })) }));
    const t = timeouts(args({ nodePools: big }));
    const drained = timeouts(args({ nodePools: big, agentDrainSeconds: 600 }));
    for (const pool of pools) {
      const [agent, gw] = [`agent-${pool.name}`, `gateway-${pool.name}`];
      // one node: a little over Pulumi's default 10 minutes
      expect(small[agent]).toBeGreaterThan(600);
      expect(small[agent]).toBeLessThan(1200);
      // 50 nodes: every node's grace period (drain + 30 s) at least, in sequence
      expect(t[agent]).toBeGreaterThanOrEqual(600 + 50 * (120 + 30));
      expect(drained[agent]! - t[agent]!).toBe(50 * (600 - 120));
      // a gateway: its 30 s grace and a start, per node
      expect(t[gw]).toBeGreaterThanOrEqual(600 + 50 * 30);
      expect(t[gw]).toBeLessThan(t[agent]!);
    }
    // nothing else gets a custom timeout
    expect(
      Object.entries(t).filter(([role, s]) => s !== undefined && !/^(agent|gateway)-/.test(role)),
    ).toEqual([]);
  });

  it('operator gateway settings reach only the gateway; deployment-owned ones win', () => {
    const o = renderRuntimeObjects(
      args({
        gatewayUpstreamDns: ['10.0.0.2:53', '10.0.0.3:53'],
        gatewayDenyCidrs: ['10.0.0.0/8', '192.168.0.0/16'],
        gatewayEnv: { SPACE_GATEWAY_DNS_QPS: '20' },
      }),
    ).map((r) => r.object as Obj);
    const g = o.find((x) => (x['metadata'] as Obj)['name'] === 'space-gateway-gv')!;
    const ge = envOf(container(g, 'gateway'));
    expect(ge['SPACE_GATEWAY_UPSTREAM_DNS']).toBe('10.0.0.2:53,10.0.0.3:53');
    expect(ge['SPACE_GATEWAY_DENY_CIDRS']).toBe('10.0.0.0/8,192.168.0.0/16');
    expect(ge['SPACE_GATEWAY_DNS_QPS']).toBe('20');
    // default: the gateway's own
    expect(envOf(container(gateways[0]!, 'gateway'))['SPACE_GATEWAY_UPSTREAM_DNS']).toBeUndefined();
  });

  it('without the gateway: no gateway objects, and agents get no control socket (no egress at all)', () => {
    const off = renderRuntimeObjects(args({ gatewayEnabled: false, gatewayCa: undefined })).map(
      (r) => r.object as Obj,
    );
    expect(off.filter((o) => JSON.stringify(o['metadata']).includes('gateway'))).toEqual([]);
    for (const a of off.filter((o) => o['kind'] === 'DaemonSet')) {
      const ae = envOf(container(a, 'agent'));
      expect(
        Object.keys(ae).filter((k) => k.startsWith('SPACE_GATEWAY') || k === 'SPACE_TRUSTED_CA_FILE'),
      ).toEqual([]);
    }
    expect(() => renderRuntimeObjects(args({ gatewayCa: undefined }))).toThrow(/gatewayCa is required/);
  });
});
