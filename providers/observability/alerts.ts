/**
 * Prometheus alert rules for the failures an operator must hear about — a node lost, sandbox
 * creates failing, a node's egress gateway down, Redis unreachable, warm pools exhausted — written
 * once here and rendered two ways: the `PrometheusRule` the Kubernetes component applies (with
 * `space:prometheusOperator`) and the plain rules file `space-alerts.yaml` beside this module for
 * any other Prometheus (VM mode). Expressions use only metrics the services export (the API's
 * `space_api_*`, the agents' `space_agent_*`) and Prometheus's own `up`, with the job names of
 * {@link METRICS_JOBS}. `promtool check rules` and `promtool test rules` run them in
 * alerts.test.ts.
 */
import { stringify } from 'yaml';

/**
 * The `job` label each service's scrape must carry for the rules to find it: the PodMonitors set
 * it; a hand-written scrape config names its jobs so.
 */
export const METRICS_JOBS = {
  api: 'space-api',
  router: 'space-router',
  agent: 'space-agent',
  gateway: 'space-gateway',
} as const;

/** One alerting rule (Prometheus rule file format, prometheus.io/docs/prometheus/latest/configuration/alerting_rules/). */
export interface AlertRule {
  readonly alert: string;
  readonly expr: string;
  /** How long the condition must hold before the alert fires (a Prometheus duration). */
  readonly for: string;
  readonly labels: { readonly severity: 'critical' | 'warning' };
  readonly annotations: { readonly summary: string; readonly description: string };
}

/** A rule group (`groups[]` of a rules file, `spec.groups[]` of a PrometheusRule). */
export interface RuleGroup {
  readonly name: string;
  readonly rules: readonly AlertRule[];
}

/** Which rules apply: the gateway's only where its metrics are scraped. */
export interface AlertOptions {
  /**
   * Gateways run and their metrics endpoint is scraped (Kubernetes: on the node address). False
   * leaves out the egress-gateway rule, which would otherwise fire on every node.
   */
  readonly gatewayScraped: boolean;
}

/** `host` of an `instance` label (`host:port`), as label `node_ip`: an agent and its gateway share it. */
const nodeIp = (selector: string) => `label_replace(${selector}, "node_ip", "$1", "instance", "(.*):[0-9]+")`;

/** The create routes: SPACE's and the E2B-compatible one (runtime/api/routes/sandboxes.ts, e2b/routes.ts). */
const CREATE = `method="POST", route=~"/v1/sandboxes|/sandboxes"`;

/** The rule groups for `opts`. Pure. */
export function alertRuleGroups(opts: AlertOptions): RuleGroup[] {
  const { api, agent, gateway } = METRICS_JOBS;
  const rules: AlertRule[] = [
    {
      alert: 'SpaceNodeLost',
      // per node: an agent's `instance` is its node's address and port (host network on
      // Kubernetes, the private address on VMs), the same across agent restarts, so a rolling
      // upgrade does not fire this; a node gone from discovery is caught as well as one whose
      // target stays and fails
      expr: `max by (instance) (max_over_time(up{job="${agent}"}[1h])) unless on (instance) (up{job="${agent}"} == 1)`,
      for: '5m',
      labels: { severity: 'critical' },
      annotations: {
        summary: 'Node agent {{ $labels.instance }} has not answered for 5 minutes',
        description:
          'An agent that answered within the last hour does not now: its node is lost, drained away or its agent is down, and the sandboxes on it are unreachable. A deliberate scale-down also fires this until the hour has passed.',
      },
    },
    {
      alert: 'SpaceCreateErrors',
      expr: `sum(rate(space_api_requests_total{${CREATE}, status=~"5.."}[5m])) / sum(rate(space_api_requests_total{${CREATE}}[5m])) > 0.05`,
      for: '10m',
      labels: { severity: 'warning' },
      annotations: {
        summary: 'More than 5 % of sandbox creates are refused with a server error',
        description:
          'POST /v1/sandboxes (or the E2B /sandboxes) answers 5xx: no node available, no capacity, or the control plane cannot reach Redis. Failures after a create was accepted are in its operation, not here.',
      },
    },
    ...(opts.gatewayScraped
      ? [
          {
            alert: 'SpaceEgressGatewayDown',
            // an agent answers on a node whose gateway does not (down, crash-looping or missing)
            expr: `${nodeIp(`up{job="${agent}"} == 1`)} unless on (node_ip) ${nodeIp(`up{job="${gateway}"} == 1`)}`,
            for: '2m',
            labels: { severity: 'critical' as const },
            annotations: {
              summary: 'Egress gateway on node {{ $labels.node_ip }} is down',
              description:
                'The node’s agent answers but its egress gateway does not: sandboxes there have no name-based egress (DNS, HTTP, TLS) until it is back.',
            },
          },
        ]
      : []),
    {
      alert: 'SpaceRedisUnreachable',
      // /readyz answers 503 only when Redis does not answer PING (runtime/api/app.ts); the
      // kubelet's readiness probe and the load balancers' health checks call it every few seconds
      expr: `sum(rate(space_api_requests_total{job="${api}", route="/readyz", status="503"}[2m])) > 0`,
      for: '2m',
      labels: { severity: 'critical' },
      annotations: {
        summary: 'The API cannot reach Redis',
        description:
          'The API’s readiness check fails on Redis PING: creates, execs and the data plane’s lookups fail until Redis is back (docs/operations.md).',
      },
    },
    {
      alert: 'SpaceWarmPoolExhausted',
      expr: '(sum by (template) (space_agent_warm_target) > 0) unless on (template) (sum by (template) (space_agent_warm_slots) > 0)',
      for: '5m',
      labels: { severity: 'warning' },
      annotations: {
        summary: 'No warm slot of template {{ $labels.template }} is ready on any node',
        description:
          'The warm pools aim for slots of this template but none is ready: every create of it boots from cold (seconds instead of milliseconds), or nodes lack the memory to refill.',
      },
    },
  ];
  return [{ name: 'space', rules }];
}

/** The plain Prometheus rules file (`rule_files:` in prometheus.yml) for `opts`. Pure. */
export function alertRulesFile(opts: AlertOptions): string {
  return `# generated from providers/observability/alerts.ts; do not edit\n${stringify({ groups: alertRuleGroups(opts) }, { lineWidth: 0 })}`;
}
