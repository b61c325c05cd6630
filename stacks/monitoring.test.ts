/**
 * Prometheus Operator objects (issue 42 item 4): kube-prometheus-stack ignores the pods' scrape
 * annotations, so with `space:prometheusOperator` the stack makes a PodMonitor per service that
 * selects exactly that service's pods on the port their annotations name, with the job names the
 * alert rules use, and the PrometheusRule carrying those rules. Off by default (the CRDs may be
 * absent); refused in vm mode.
 */
import { describe, expect, it } from 'vitest';
import { alertRuleGroups, METRICS_JOBS } from '../providers/observability/alerts.ts';
import { type RecordedResource, unwrapSecrets } from '../providers/testing/mocks.ts';
import { fails, render, VARIANTS, withSecrets } from './test-stacks.ts';

type Obj = Record<string, unknown>;
const MONITORING = /^kubernetes:monitoring\.coreos\.com\/v1:/;

interface PodMonitor {
  metadata: { name: string; labels: Record<string, string> };
  spec: {
    selector: { matchLabels: Record<string, string> };
    podMetricsEndpoints: { portNumber: number; path: string; scheme: string; relabelings: Obj[] }[];
  };
}

/** Pod templates of the workloads: labels and annotations. */
function podTemplates(recorded: RecordedResource[]) {
  return recorded
    .filter((r) => /^kubernetes:apps\/v1:(Deployment|DaemonSet|StatefulSet)$/.test(r.type))
    .map((r) => {
      const t = ((unwrapSecrets(r.inputs) as Obj)['spec'] as Obj)['template'] as {
        metadata: { labels: Record<string, string>; annotations?: Record<string, string> };
      };
      return { name: r.name, labels: t.metadata.labels, annotations: t.metadata.annotations ?? {} };
    });
}

describe('Prometheus Operator objects', () => {
  it('off by default: no monitoring.coreos.com object (the CRDs may not exist)', async () => {
    for (const v of ['kind', 'coreweave', 'akamai-lke']) {
      const recorded = await render(withSecrets(VARIANTS[v]!));
      expect(recorded.filter((r) => MONITORING.test(r.type))).toEqual([]);
    }
  });

  it.each([
    ['kind', 'http'],
    ['coreweave-tls', 'https'],
  ])(
    '%s: a PodMonitor per service selects its pods on their metrics port, with the alert rules’ job names; the PrometheusRule carries the rules',
    async (variant, scheme) => {
      const raw = {
        ...withSecrets(VARIANTS[variant]!),
        prometheusOperator: 'true',
        prometheusOperatorLabels: JSON.stringify({ release: 'kube-prometheus-stack' }),
      };
      expect(fails(raw)).toEqual([]);
      const recorded = await render(raw);
      const monitors = recorded
        .filter((r) => r.type === 'kubernetes:monitoring.coreos.com/v1:PodMonitor')
        .map((r) => unwrapSecrets(r.inputs) as unknown as PodMonitor);
      expect(monitors.map((m) => m.metadata.name).sort()).toEqual([
        'space-agent',
        'space-api',
        'space-gateway',
        'space-router',
      ]);
      const pods = podTemplates(recorded);
      for (const m of monitors) {
        expect(m.metadata.labels['release']).toBe('kube-prometheus-stack');
        const selected = pods.filter((p) =>
          Object.entries(m.spec.selector.matchLabels).every(([k, v]) => p.labels[k] === v),
        );
        expect(selected.length, m.metadata.name).toBeGreaterThan(0);
        const [ep] = m.spec.podMetricsEndpoints;
        // the port and path the selected pods' own scrape annotations name
        for (const p of selected) {
          expect(String(ep!.portNumber), p.name).toBe(p.annotations['prometheus.io/port']);
          expect(ep!.path).toBe(p.annotations['prometheus.io/path']);
        }
        const service = m.metadata.name.replace('space-', '') as keyof typeof METRICS_JOBS;
        expect(ep!.relabelings).toEqual([
          { targetLabel: 'job', replacement: METRICS_JOBS[service], action: 'replace' },
        ]);
        expect(ep!.scheme).toBe(['api', 'router'].includes(service) ? scheme : 'http');
      }
      const rules = recorded.filter((r) => r.type === 'kubernetes:monitoring.coreos.com/v1:PrometheusRule');
      expect(rules).toHaveLength(1);
      expect((unwrapSecrets(rules[0]!.inputs) as { spec: Obj }).spec).toEqual({
        groups: JSON.parse(JSON.stringify(alertRuleGroups({ gatewayScraped: true }))),
      });
    },
  );

  it('without the gateway: no gateway PodMonitor and no gateway rule', async () => {
    const raw = { ...withSecrets(VARIANTS['kind']!), prometheusOperator: 'true', gatewayEnabled: 'false' };
    const recorded = await render(raw);
    const names = recorded
      .filter((r) => MONITORING.test(r.type))
      .map((r) => (unwrapSecrets(r.inputs) as { metadata: { name: string } }).metadata.name);
    expect(names).not.toContain('space-gateway');
    expect(JSON.stringify(recorded.filter((r) => MONITORING.test(r.type)))).not.toContain(
      'SpaceEgressGatewayDown',
    );
  });

  it('refused in vm mode, and labels without the switch', () => {
    expect(fails({ ...withSecrets(VARIANTS['akamai']!), prometheusOperator: 'true' })).toEqual([
      expect.stringMatching(/^space:prometheusOperator: kubernetes mode only/),
    ]);
    expect(
      fails({ ...withSecrets(VARIANTS['kind']!), prometheusOperatorLabels: JSON.stringify({ a: 1 }) }),
    ).toEqual([
      'space:prometheusOperatorLabels: must be an object of string labels',
      'space:prometheusOperatorLabels: only with space:prometheusOperator true',
    ]);
  });
});
