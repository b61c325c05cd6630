/**
 * The Grafana dashboard names only what the code exports: every metric in every panel query is
 * registered by the API, an agent or a gateway (the real registries, or, for the agent's gauges
 * that live inside buildApp, its source), every label a query filters or groups on is one of that
 * metric's labels, and the route it filters on is a route the API serves.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import dashboard from './space-dashboard.json' with { type: 'json' };
import { exportedMetrics, labelsIn, metricsIn, TARGET_LABELS } from './test-metrics.ts';

const exprs: string[] = dashboard.panels.flatMap((p) => p.targets.map((t) => t.expr));

describe('Grafana dashboard (providers/observability/space-dashboard.json)', () => {
  it('covers creation latency, active sandboxes, egress decisions and usage', () => {
    const titles = dashboard.panels.map((p) => p.title).join('\n');
    for (const want of [/creation latency/i, /active sandboxes/i, /egress decisions/i, /usage/i])
      expect(titles).toMatch(want);
  });

  it('every query names only metrics the code exports, and only their labels', async () => {
    const exported = await exportedMetrics();
    expect(exported.has('space_agent_sandboxes')).toBe(true);
    const problems: string[] = [];
    for (const expr of exprs) {
      const names = metricsIn(expr);
      if (names.length === 0) problems.push(`${expr}: names no SPACE metric`);
      const allowed = new Set([
        ...TARGET_LABELS,
        ...names.flatMap((n) => [...(exported.get(n)?.labels ?? [])]),
      ]);
      for (const n of names) if (!exported.has(n)) problems.push(`${expr}: ${n} is not exported`);
      for (const l of labelsIn(expr))
        if (!allowed.has(l)) problems.push(`${expr}: label ${l} is not on ${names.join(', ')}`);
    }
    expect(problems).toEqual([]);
  });

  it('a route a query filters on is one the API serves', () => {
    const routesDir = new URL('../../runtime/api/routes/', import.meta.url);
    const served = readdirSync(routesDir)
      .map((f) => readFileSync(new URL(f, routesDir), 'utf8'))
      .join('\n');
    const routes = exprs.flatMap((e) => [...e.matchAll(/route="([^"]+)"/g)].map((m) => m[1]!));
    expect(routes.length).toBeGreaterThan(0);
    for (const r of routes) expect(served, r).toContain(`'${r}'`);
  });

  it('the checks catch a metric or label the code does not export (control)', async () => {
    const exported = await exportedMetrics();
    expect(exported.has('space_api_sandbox_ready_seconds_bucket')).toBe(false);
    expect(exported.get('space_gateway_decisions_total')?.labels.has('sandbox')).toBe(false);
    expect(labelsIn('sum by (decision, protocol) (rate(x{reason="r"}[5m]))')).toEqual([
      'reason',
      'decision',
      'protocol',
    ]);
  });
});
