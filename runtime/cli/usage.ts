/** `space usage`: active, idle and paused time over a range, grouped by sandbox, API key or template. */
import type { Command } from 'commander';
import type { UsageReport } from './client.ts';
import { apiClient, isJson } from './context.ts';
import { printJson, println, table, usageError } from './output.ts';

/** `--since 2h` style durations → ms. Pure. */
export function parseSince(value: string): number {
  const m = /^(\d+)\s*(s|m|h|d)$/.exec(value.trim());
  if (!m) throw usageError(`--since takes a duration like 90s, 15m, 2h or 7d; got "${value}"`);
  const unit = { s: 1_000, m: 60_000, h: 3_600_000, d: 86_400_000 }[m[2] as 's' | 'm' | 'h' | 'd'];
  return Number(m[1]) * unit;
}

/** Table rows of a usage report (seconds, vCPU-s, GiB-s per state, and a total line). Pure. */
export function usageRows(r: UsageReport): string[][] {
  const row = (key: string, f: UsageReport['total']) => [
    key,
    f.seconds.active.toFixed(1),
    f.seconds.idle.toFixed(1),
    f.seconds.paused.toFixed(1),
    f.vcpuSeconds.active.toFixed(1),
    f.gibSeconds.active.toFixed(1),
  ];
  return [...r.groups.map((g) => row(g.key || '-', g)), row('TOTAL', r.total)];
}

export function registerUsage(program: Command): void {
  program
    .command('usage')
    .description('active, idle and paused time over a range (one-minute resolution)')
    .option('--since <duration>', 'range ending now, e.g. 15m, 2h, 7d (default 24h)', parseSince)
    .option('--from <iso>', 'start (ISO 8601); overrides --since')
    .option('--to <iso>', 'end (ISO 8601, default now)')
    .option('--group-by <dim>', 'sandbox, apiKey or template', (v: string) => {
      if (!['sandbox', 'apiKey', 'template'].includes(v)) {
        throw usageError('--group-by takes sandbox, apiKey or template');
      }
      return v;
    })
    .addHelpText(
      'after',
      `
Examples:
  space usage --since 1h
  space usage --group-by template --since 7d --json
  space sandbox usage <id>     # one sandbox over its whole life, to the second`,
    )
    .action(async (o: { since?: number; from?: string; to?: string; groupBy?: string }, cmd: Command) => {
      const to = o.to ?? new Date().toISOString();
      const from = o.from ?? new Date(Date.parse(to) - (o.since ?? 86_400_000)).toISOString();
      const r = await apiClient(cmd).json<UsageReport>('GET', '/v1/usage', {
        query: { from, to, groupBy: o.groupBy ?? 'sandbox' },
      });
      if (isJson(cmd)) return printJson(r);
      println(`usage ${r.from} → ${r.to}, by ${r.groupBy}`);
      println(
        table(
          [r.groupBy.toUpperCase(), 'ACTIVE S', 'IDLE S', 'PAUSED S', 'ACTIVE VCPU-S', 'ACTIVE GIB-S'],
          usageRows(r),
        ),
      );
    });
}
