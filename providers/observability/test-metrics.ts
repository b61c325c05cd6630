/**
 * What the services export to Prometheus, for the tests that check queries against it (the
 * dashboard's, the alert rules'): every series name with its labels, and the metric and label
 * names a PromQL expression uses.
 */
import { readFileSync } from 'node:fs';
import { createApiMetrics } from '../../runtime/api/metrics.ts';
import { createGatewayMetrics } from '../../runtime/gateway/audit.ts';

export interface Exported {
  readonly labels: ReadonlySet<string>;
}

/** Every exported series name (histograms expanded to _bucket/_sum/_count) with its labels. */
export async function exportedMetrics(): Promise<Map<string, Exported>> {
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
export const TARGET_LABELS = new Set(['instance', 'job']);

/** Metric names a PromQL expression selects (identifiers followed by `{` or `[` or a space/`)` that are not functions or keywords). */
export function metricsIn(expr: string): string[] {
  return [...expr.matchAll(/\b(space_[a-z_]+)\b/g)].map((m) => m[1]!);
}
/** Label names an expression filters on (`{a="x"}`) or groups by (`by (a, b)`). */
export function labelsIn(expr: string): string[] {
  const matchers = [...expr.matchAll(/\{([^}]*)\}/g)].flatMap((m) =>
    [...m[1]!.matchAll(/([a-z_]+)\s*=~?/g)].map((x) => x[1]!),
  );
  const grouped = [...expr.matchAll(/\bby \(([^)]*)\)/g)].flatMap((m) =>
    m[1]!.split(',').map((x) => x.trim()),
  );
  return [...matchers, ...grouped];
}
