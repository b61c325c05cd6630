import { describe, expect, it } from 'vitest';
import type { TraceFileSpan } from '../runtime/core/tracing.ts';
import { budgetTable, spanBudget } from './spans.ts';

const span = (traceId: string, name: string, durationMs: number, source?: string): TraceFileSpan => ({
  name,
  service: 'space-test',
  traceId,
  spanId: `${traceId}-${name}`,
  startMs: 0,
  durationMs,
  status: 'ok',
  attributes: source ? { 'space.instance.source': source } : {},
});

describe('spanBudget', () => {
  it('groups each create trace by its kind, each command trace as exec, and leaves other traces out', () => {
    const spans = [
      // two warm claims, one boot, and a warm-pool refill (no create span: not counted)
      span('t1', 'agent.sandboxes.create', 30, 'warm'),
      span('t1', 'agent.guest.init', 5),
      span('t2', 'agent.sandboxes.create', 50, 'warm'),
      span('t2', 'agent.guest.init', 9),
      span('t3', 'agent.sandboxes.create', 700, 'boot'),
      span('t3', 'agent.driver.start', 400),
      span('t9', 'agent.driver.start', 390),
      // a command and its stream (one trace the client started), and a command inside a create's trace
      span('c1', 'api.commands.start', 12),
      span('c1', 'agent.commands.start', 4),
      span('c1', 'router.forward', 3),
      span('t2', 'agent.commands.start', 6),
    ];
    const rows = spanBudget(spans);
    expect(rows).toEqual([
      { source: 'boot', span: 'agent.sandboxes.create', n: 1, p50Ms: 700, p90Ms: 700 },
      { source: 'boot', span: 'agent.driver.start', n: 1, p50Ms: 400, p90Ms: 400 },
      { source: 'exec', span: 'api.commands.start', n: 1, p50Ms: 12, p90Ms: 12 },
      { source: 'exec', span: 'agent.commands.start', n: 1, p50Ms: 4, p90Ms: 4 },
      { source: 'exec', span: 'router.forward', n: 1, p50Ms: 3, p90Ms: 3 },
      // nearest rank: p50 of [30, 50] is 30, p90 is 50
      { source: 'warm', span: 'agent.sandboxes.create', n: 2, p50Ms: 30, p90Ms: 50 },
      { source: 'warm', span: 'agent.commands.start', n: 1, p50Ms: 6, p90Ms: 6 },
      { source: 'warm', span: 'agent.guest.init', n: 2, p50Ms: 5, p90Ms: 9 },
    ]);
    expect(budgetTable(rows)).toMatch(/\| warm +\| agent\.guest\.init +\| +2 \| +5\.0 \| +9\.0 \|/);
  });
});
