/**
 * The Grafana dashboard names only what the code exports: every metric in every panel query is
 * registered by the API, an agent or a gateway (the real registries, or, for the agent's gauges
 * that live inside buildApp, its source), every label a query filters or groups on is one of that
 * metric's labels, and the route it filters on is a route the API serves.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { createApiMetrics } from '../../runtime/api/metrics.ts';
import { createGatewayMetrics } from '../../runtime/gateway/audit.ts';
import dashboard from './space-dashboard.json' with { type: 'json' };

interface Exported {
  readonly labels: ReadonlySet<string>;
}

/** Every exported series name (histograms expanded to _bucket/_sum/_count) with its labels. */
async function exportedMetrics(): Promise<Map<string, Exported>> {
  const out = new Map<string, Exported>();
  const add = (name: string, labels: string[], type: string) => {
    const set = new Set(labels);
    if (type === 'histogram') {
      out.set(`${name}_bucket`, { labels: new Set([...set, 'le']) });
      out.set(`${name}_sum`, { labels: set });
      out.set(`${name}_count`, { labels: set });
    } else out.set(name, { labels: set });
  };
  for (const registry of [createApiMetrics().registry, createGatewayMetrics().registry]) {
    for (const m of registry.getMetricsAsArray()) {
      const labelNames = (m as unknown as { labelNames?: string[] }).labelNames ?? [];
      add(m.name, labelNames, String(m.type));
    }
  }
  // the agent declares its gauges inline in buildApp (runtime/agent/app.ts)
  const agentSource = readFileSync(new URL('../../runtime/agent/app.ts', import.meta.url), 'utf8');
  for (const chunk of agentSource.split('new Gauge({').slice(1)) {
    const head = chunk.slice(0, chunk.indexOf('collect('));
    const name = /name: '([a-z_]+)'/.exec(head)?.[1];
    if (!name) continue;
    const list = /labelNames: \[([^\]]*)\]/.exec(head)?.[1] ?? '';
    add(
      name,
      [...list.matchAll(/'([a-z_]+)'/g)].map((x) => x[1]!),
      'gauge',
    );
  }
  return out;
}

/** Labels Prometheus adds to every scraped series. */
const TARGET_LABELS = new Set(['instance', 'job']);

const exprs: string[] = dashboard.panels.flatMap((p) => p.targets.map((t) => t.expr));

/** Metric names a PromQL expression selects (identifiers followed by `{` or `[` or a space/`)` that are not functions or keywords). */
function metricsIn(expr: string): string[] {
  return [...expr.matchAll(/\b(space_[a-z_]+)\b/g)].map((m) => m[1]!);
}
/** Label names an expression filters on (`{a="x"}`) or groups by (`by (a, b)`). */
function labelsIn(expr: string): string[] {
  const matchers = [...expr.matchAll(/\{([^}]*)\}/g)].flatMap((m) =>
    [...m[1]!.matchAll(/([a-z_]+)\s*=~?/g)].map((x) => x[1]!),
  );
  const grouped = [...expr.matchAll(/\bby \(([^)]*)\)/g)].flatMap((m) =>
    m[1]!.split(',').map((x) => x.trim()),
  );
  return [...matchers, ...grouped];
}

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
