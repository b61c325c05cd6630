/**
 * Prometheus Operator objects (monitoring.coreos.com/v1), made only when the operator asks
 * (`space:prometheusOperator`: the CRDs must exist, e.g. from kube-prometheus-stack, which ignores
 * the pods' `prometheus.io/*` annotations): one PodMonitor per service (the API, the router, the
 * agents of every pool and, with the gateway, the gateways) scraping `/metrics` with the job name
 * the alert rules use, and a PrometheusRule carrying those rules (providers/observability/alerts.ts).
 */
import { alertRuleGroups, METRICS_JOBS, type RuleGroup } from '../observability/alerts.ts';
import {
  AGENT_PORT,
  API_PORT,
  GATEWAY_METRICS_PORT,
  METRICS_PATH,
  ROUTER_PORT,
} from '../runtime-settings.ts';
import { labels, type ObjectList, type RenderContext } from './args.ts';

/**
 * One endpoint of a PodMonitor (prometheus-operator `PodMetricsEndpoint`,
 * prometheus-operator.dev/docs/api-reference/api/#monitoring.coreos.com/v1.PodMetricsEndpoint).
 * `portNumber` (operator 0.79 or newer, prometheus-operator PR #7150): the gateway declares no
 * container port to name.
 */
interface PodMetricsEndpoint {
  readonly portNumber: number;
  readonly path: string;
  readonly scheme: 'http' | 'https';
  readonly tlsConfig?: { readonly serverName: string };
  readonly relabelings: readonly {
    readonly targetLabel: string;
    readonly replacement: string;
    readonly action: 'replace';
  }[];
}

/** A `monitoring.coreos.com/v1` PodMonitor, the fields used here. */
export interface PodMonitor {
  readonly apiVersion: 'monitoring.coreos.com/v1';
  readonly kind: 'PodMonitor';
  readonly metadata: {
    readonly name: string;
    readonly namespace: string;
    readonly labels: Record<string, string>;
  };
  readonly spec: {
    readonly selector: { readonly matchLabels: Record<string, string> };
    readonly podMetricsEndpoints: readonly PodMetricsEndpoint[];
  };
}

/** A `monitoring.coreos.com/v1` PrometheusRule. */
export interface PrometheusRule {
  readonly apiVersion: 'monitoring.coreos.com/v1';
  readonly kind: 'PrometheusRule';
  readonly metadata: {
    readonly name: string;
    readonly namespace: string;
    readonly labels: Record<string, string>;
  };
  readonly spec: { readonly groups: readonly RuleGroup[] };
}

/**
 * Adds the PodMonitors and the PrometheusRule (roles `monitor-<service>`, `alert-rules`) when
 * {@link RuntimeArgs.prometheusOperator} is set; nothing otherwise. Their labels carry
 * `prometheusOperator.labels` too (a kube-prometheus-stack Prometheus selects monitors and rules
 * by its release label unless told otherwise).
 */
export function addMonitoring(list: ObjectList, ctx: RenderContext): void {
  const { a, d, ns } = ctx;
  if (!a.prometheusOperator) return;
  const meta = (name: string) => ({
    name,
    namespace: ns,
    labels: { ...labels('observability'), ...a.prometheusOperator?.labels },
  });
  const services = [
    { service: 'api', port: API_PORT, serverName: a.tls?.apiHostname },
    { service: 'router', port: ROUTER_PORT, serverName: a.tls?.routerHostname },
    { service: 'agent', port: AGENT_PORT, serverName: undefined },
    ...(d.gatewayEnabled ? [{ service: 'gateway', port: GATEWAY_METRICS_PORT, serverName: undefined }] : []),
  ] as const;
  for (const { service, port, serverName } of services) {
    const monitor: PodMonitor = {
      apiVersion: 'monitoring.coreos.com/v1',
      kind: 'PodMonitor',
      metadata: meta(`space-${service}`),
      spec: {
        selector: { matchLabels: labels(service) },
        podMetricsEndpoints: [
          {
            portNumber: port,
            path: METRICS_PATH,
            // with cert-manager TLS the API and the router serve only HTTPS, for their hostnames
            scheme: serverName ? 'https' : 'http',
            ...(serverName ? { tlsConfig: { serverName } } : {}),
            // the job name the alert rules select on, whatever the operator's default naming
            relabelings: [
              {
                targetLabel: 'job',
                replacement: METRICS_JOBS[service as keyof typeof METRICS_JOBS],
                action: 'replace',
              },
            ],
          },
        ],
      },
    };
    list.add(`monitor-${service}`, monitor);
  }
  const rules: PrometheusRule = {
    apiVersion: 'monitoring.coreos.com/v1',
    kind: 'PrometheusRule',
    metadata: meta('space-alerts'),
    spec: { groups: alertRuleGroups({ gatewayScraped: d.gatewayEnabled }) },
  };
  list.add('alert-rules', rules);
}
