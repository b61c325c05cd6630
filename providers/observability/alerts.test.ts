/**
 * The alert rules (alerts.ts) checked by Prometheus's own tool: `promtool check rules` parses them
 * and `promtool test rules` evaluates each against input series in which it must fire and in
 * which it must not (a node lost vs an agent restarting during a rollout, a gateway down beside a
 * live agent, Redis unreachable, warm pools empty, create errors above and below the threshold).
 * Every metric and label they name is one the services export; the committed VM rules file is the
 * rendered one. promtool is Debian's `prometheus` package (scripts/host-deps.sh).
 */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { stringify } from 'yaml';
import { type AlertRule, alertRuleGroups, alertRulesFile, METRICS_JOBS } from './alerts.ts';
import { exportedMetrics, labelsIn, metricsIn, TARGET_LABELS } from './test-metrics.ts';

const dir = mkdtempSync(join(tmpdir(), 'space-alerts-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const ALL = alertRuleGroups({ gatewayScraped: true });
const rule = (name: string): AlertRule => ALL[0]!.rules.find((r) => r.alert === name)!;

/** `promtool <args>` in the test directory: its output, or throws with it. */
function promtool(...args: string[]): string {
  try {
    return execFileSync('promtool', args, { cwd: dir, encoding: 'utf8', stdio: 'pipe' });
  } catch (err) {
    const e = err as { code?: string; stdout?: string; stderr?: string };
    if (e.code === 'ENOENT')
      throw new Error('promtool not found: install Debian `prometheus` (scripts/host-deps.sh)');
    throw new Error(`promtool ${args.join(' ')}:\n${e.stdout ?? ''}${e.stderr ?? ''}`);
  }
}

/** An expected alert: the rule's severity, the given labels, annotations with `{{ $labels.x }}` filled. */
function expected(name: string, labels: Record<string, string> = {}) {
  const r = rule(name);
  const fill = (s: string) => s.replace(/\{\{ \$labels\.([a-z_]+) \}\}/g, (_, l: string) => labels[l] ?? '');
  return {
    exp_labels: { severity: r.labels.severity, ...labels },
    exp_annotations: { summary: fill(r.annotations.summary), description: fill(r.annotations.description) },
  };
}

const { api, agent, gateway } = METRICS_JOBS;
const up = (job: string, instance: string) => `up{job="${job}", instance="${instance}"}`;

describe('Prometheus alert rules (providers/observability/alerts.ts)', () => {
  it('promtool check rules accepts both renderings', () => {
    for (const gatewayScraped of [true, false]) {
      writeFileSync(join(dir, 'rules.yaml'), alertRulesFile({ gatewayScraped }));
      expect(promtool('check', 'rules', 'rules.yaml')).toMatch(/SUCCESS: \d+ rules found/);
    }
  });

  it('promtool test rules: each rule fires where it must and stays quiet where it must', () => {
    writeFileSync(join(dir, 'rules.yaml'), alertRulesFile({ gatewayScraped: true }));
    const tests = [
      {
        // node a vanishes at 30m; node b's agent restarts at 20m (a new pod, the same instance)
        interval: '1m',
        input_series: [
          { series: up(agent, '10.0.0.1:8081'), values: '1x30 stale' },
          { series: `up{job="${agent}", instance="10.0.0.2:8081", pod="b1"}`, values: '1x20 stale' },
          { series: `up{job="${agent}", instance="10.0.0.2:8081", pod="b2"}`, values: '_x21 1x30' },
        ],
        alert_rule_test: [
          { eval_time: '25m', alertname: 'SpaceNodeLost', exp_alerts: [] },
          { eval_time: '34m', alertname: 'SpaceNodeLost', exp_alerts: [] },
          {
            eval_time: '37m',
            alertname: 'SpaceNodeLost',
            exp_alerts: [expected('SpaceNodeLost', { instance: '10.0.0.1:8081' })],
          },
        ],
      },
      {
        // node 1: agent up, gateway down; node 2: both up
        interval: '1m',
        input_series: [
          { series: up(agent, '10.0.0.1:8081'), values: '1x10' },
          { series: up(gateway, '10.0.0.1:15090'), values: '0x10' },
          { series: up(agent, '10.0.0.2:8081'), values: '1x10' },
          { series: up(gateway, '10.0.0.2:15090'), values: '1x10' },
        ],
        alert_rule_test: [
          { eval_time: '1m', alertname: 'SpaceEgressGatewayDown', exp_alerts: [] },
          {
            eval_time: '5m',
            alertname: 'SpaceEgressGatewayDown',
            exp_alerts: [
              expected('SpaceEgressGatewayDown', {
                job: agent,
                instance: '10.0.0.1:8081',
                node_ip: '10.0.0.1',
              }),
            ],
          },
        ],
      },
      {
        // readiness probes: 12 a minute; Redis lost at 10m (503 from then)
        interval: '1m',
        input_series: [
          {
            series: `space_api_requests_total{job="${api}", method="GET", route="/readyz", status="200"}`,
            values: '0+12x10 120x10',
          },
          {
            series: `space_api_requests_total{job="${api}", method="GET", route="/readyz", status="503"}`,
            values: '0x10 12+12x10',
          },
        ],
        alert_rule_test: [
          { eval_time: '9m', alertname: 'SpaceRedisUnreachable', exp_alerts: [] },
          {
            eval_time: '15m',
            alertname: 'SpaceRedisUnreachable',
            exp_alerts: [expected('SpaceRedisUnreachable')],
          },
        ],
      },
      {
        // template base: wanted, none ready anywhere; template py: wanted and ready on one node
        interval: '1m',
        input_series: [
          {
            series: `space_agent_warm_target{job="${agent}", instance="a", template="base"}`,
            values: '2x10',
          },
          { series: `space_agent_warm_slots{job="${agent}", instance="a", template="base"}`, values: '0x10' },
          {
            series: `space_agent_warm_target{job="${agent}", instance="b", template="base"}`,
            values: '2x10',
          },
          { series: `space_agent_warm_target{job="${agent}", instance="a", template="py"}`, values: '1x10' },
          { series: `space_agent_warm_slots{job="${agent}", instance="a", template="py"}`, values: '0x10' },
          { series: `space_agent_warm_slots{job="${agent}", instance="b", template="py"}`, values: '1x10' },
        ],
        alert_rule_test: [
          {
            eval_time: '8m',
            alertname: 'SpaceWarmPoolExhausted',
            exp_alerts: [expected('SpaceWarmPoolExhausted', { template: 'base' })],
          },
        ],
      },
      {
        // 10 creates accepted a minute; 2 refused with 503 a minute (17 %): fires
        interval: '1m',
        input_series: [
          {
            series: `space_api_requests_total{job="${api}", method="POST", route="/v1/sandboxes", status="202"}`,
            values: '0+10x20',
          },
          {
            series: `space_api_requests_total{job="${api}", method="POST", route="/v1/sandboxes", status="503"}`,
            values: '0+2x20',
          },
        ],
        alert_rule_test: [
          { eval_time: '16m', alertname: 'SpaceCreateErrors', exp_alerts: [expected('SpaceCreateErrors')] },
        ],
      },
      {
        // 100 creates a minute, one 500 every 2 minutes (0.5 %), and 4xx refusals: quiet
        interval: '1m',
        input_series: [
          {
            series: `space_api_requests_total{job="${api}", method="POST", route="/sandboxes", status="201"}`,
            values: '0+100x20',
          },
          {
            series: `space_api_requests_total{job="${api}", method="POST", route="/v1/sandboxes", status="500"}`,
            values: '0+0.5x20',
          },
          {
            series: `space_api_requests_total{job="${api}", method="POST", route="/v1/sandboxes", status="422"}`,
            values: '0+50x20',
          },
        ],
        alert_rule_test: [{ eval_time: '16m', alertname: 'SpaceCreateErrors', exp_alerts: [] }],
      },
    ];
    // every rule is tested
    const tested = new Set(tests.flatMap((t) => t.alert_rule_test.map((a) => a.alertname)));
    expect([...tested].sort()).toEqual(ALL[0]!.rules.map((r) => r.alert).sort());
    writeFileSync(
      join(dir, 'tests.yaml'),
      stringify({ rule_files: ['rules.yaml'], evaluation_interval: '1m', tests }, { lineWidth: 0 }),
    );
    expect(promtool('test', 'rules', 'tests.yaml')).toContain('SUCCESS');
  });

  it('promtool test rules fails a rule that does not fire (control: the tests can fail)', () => {
    writeFileSync(join(dir, 'rules.yaml'), alertRulesFile({ gatewayScraped: true }));
    writeFileSync(
      join(dir, 'control.yaml'),
      stringify({
        rule_files: ['rules.yaml'],
        tests: [
          {
            interval: '1m',
            input_series: [{ series: up(agent, '10.0.0.1:8081'), values: '1x10' }],
            alert_rule_test: [
              { eval_time: '10m', alertname: 'SpaceNodeLost', exp_alerts: [expected('SpaceNodeLost')] },
            ],
          },
        ],
      }),
    );
    expect(() => promtool('test', 'rules', 'control.yaml')).toThrow(/FAILED/);
  });

  it('names only metrics and labels the services export', async () => {
    const exported = await exportedMetrics();
    const problems: string[] = [];
    for (const r of ALL[0]!.rules) {
      const names = metricsIn(r.expr);
      const allowed = new Set([
        ...TARGET_LABELS,
        ...names.flatMap((n) => [...(exported.get(n)?.labels ?? [])]),
      ]);
      for (const n of names) if (!exported.has(n)) problems.push(`${r.alert}: ${n} is not exported`);
      for (const l of labelsIn(r.expr)) if (!allowed.has(l)) problems.push(`${r.alert}: label ${l}`);
    }
    expect(problems).toEqual([]);
  });

  it('the VM rules file is the rendering without the gateway rule (its metrics stay on the node)', () => {
    const committed = readFileSync(new URL('./space-alerts.yaml', import.meta.url), 'utf8');
    expect(committed).toBe(alertRulesFile({ gatewayScraped: false }));
    expect(committed).not.toContain('SpaceEgressGatewayDown');
  });
});
