/**
 * The scheduled backup both deployment modes render from `space:backup` (docs/deployment.md): when
 * it runs (one cron expression, turned into a systemd `OnCalendar=` for the control VM's timer and
 * used as is by the Kubernetes CronJob), what it runs (`space backup run` in the SPACE image), and
 * the settings it runs with (the `SPACE_BACKUP_*` variables of docs/configuration.md). Pure.
 */

/** `space:backup`, validated. Absent from the stack configuration: no scheduled backup. */
export interface BackupPlan {
  /** Five-field cron expression, UTC (see {@link parseCron} for the accepted subset). */
  readonly schedule: string;
  readonly bucket: string;
  /** S3-compatible endpoint URL; absent: AWS S3. */
  readonly endpoint?: string;
  readonly region: string;
  readonly prefix: string;
  /** This deployment's folder in the bucket (`SPACE_BACKUP_DEPLOYMENT`): the Pulumi stack's name by default. */
  readonly deployment: string;
  readonly keepLast: number;
  readonly keepDays: number;
  /** Access key id (not secret); the secret is `space:backupSecretAccessKey`. */
  readonly accessKeyId?: string;
}

/** Daily at 03:17 UTC: the schedule when `space:backup` names none. */
export const DEFAULT_BACKUP_SCHEDULE = '17 3 * * *';

/** What the scheduled job runs in the SPACE image (working directory /opt/space). */
export const BACKUP_COMMAND = ['node', 'runtime/cli/space.ts', 'backup', 'run'] as const;

/** One parsed cron field: `*`, or the listed values. */
type Field = '*' | { every: number } | number[];

/** A parsed schedule: minute and hour, and the weekdays (0-6, Sunday 0) or every day. */
export interface CronSchedule {
  minute: Field;
  hour: Field;
  weekdays: '*' | number[];
}

function field(text: string, name: string, max: number): Field {
  if (text === '*') return '*';
  const step = /^\*\/(\d+)$/.exec(text);
  if (step) {
    const n = Number(step[1]);
    if (n < 1 || n > max) throw new Error(`${name}: */${n} is out of range (1-${max})`);
    return { every: n };
  }
  if (!/^\d+(,\d+)*$/.test(text))
    throw new Error(`${name}: "${text}" is not a number, a list (1,13), * or */N`);
  const values = text.split(',').map(Number);
  for (const v of values) if (v > max) throw new Error(`${name}: ${v} is out of range (0-${max})`);
  return [...new Set(values)].sort((a, b) => a - b);
}

/**
 * Parses the cron subset both modes can run the same way: `MIN HOUR * * DOW`, where MIN and HOUR
 * are a number, a list (`0,30`), `*` or `*\/N`, and DOW is `*` or a list of 0-6 (Sunday 0). Day of
 * month and month must be `*` (a backup schedule has no use for them, and systemd's and cron's
 * readings of a day-of-month together with a weekday differ). Times are UTC.
 * @throws Error naming the field that does not fit.
 */
export function parseCron(expr: string): CronSchedule {
  const parts = expr.trim().split(/\s+/);
  if (parts.length !== 5)
    throw new Error(
      `"${expr}" has ${parts.length} fields; want 5 (minute hour day-of-month month day-of-week)`,
    );
  const [min, hour, dom, month, dow] = parts as [string, string, string, string, string];
  if (dom !== '*' || month !== '*')
    throw new Error('day of month and month must be * (daily or weekly schedules)');
  const weekdays = field(dow.replace(/\b7\b/g, '0'), 'day of week', 6);
  if (!(weekdays === '*' || Array.isArray(weekdays)))
    throw new Error('day of week: a list of 0-6 or *, not */N');
  return { minute: field(min, 'minute', 59), hour: field(hour, 'hour', 23), weekdays };
}

const DAY = ['Sun', 'Mon', 'Tue', 'Wed', 'Thu', 'Fri', 'Sat'];

function calendarField(f: Field): string {
  if (f === '*') return '*';
  if (!Array.isArray(f)) return `00/${f.every}`;
  return f.map((v) => String(v).padStart(2, '0')).join(',');
}

/**
 * The systemd calendar event (systemd.time(7), "Calendar Events") of a cron expression accepted by
 * {@link parseCron}, in UTC: `17 3 * * *` → `*-*-* 03:17:00 UTC`, `0 *\/6 * * 1,4` →
 * `Mon,Thu *-*-* 00/6:00:00 UTC` (weekdays Monday first, as systemd writes them). @throws as parseCron.
 */
export function onCalendar(expr: string): string {
  const c = parseCron(expr);
  // Monday first, Sunday last: the order systemd writes weekdays in
  const week = c.weekdays === '*' ? [] : c.weekdays.toSorted((x, y) => ((x + 6) % 7) - ((y + 6) % 7));
  const days = week.length ? `${week.map((d) => DAY[d]).join(',')} ` : '';
  return `${days}*-*-* ${calendarField(c.hour)}:${calendarField(c.minute)}:00 UTC`;
}

/** The `SPACE_BACKUP_*` settings of the job (no secret: the secret key travels on its own). */
export function backupJobEnv(p: BackupPlan): Record<string, string> {
  return {
    SPACE_BACKUP_S3_BUCKET: p.bucket,
    ...(p.endpoint ? { SPACE_BACKUP_S3_ENDPOINT: p.endpoint } : {}),
    SPACE_BACKUP_S3_REGION: p.region,
    SPACE_BACKUP_S3_PREFIX: p.prefix,
    SPACE_BACKUP_DEPLOYMENT: p.deployment,
    SPACE_BACKUP_KEEP_LAST: String(p.keepLast),
    SPACE_BACKUP_KEEP_DAYS: String(p.keepDays),
    ...(p.accessKeyId ? { SPACE_BACKUP_S3_ACCESS_KEY_ID: p.accessKeyId } : {}),
  };
}

/** One line for the preview and the `backup` stack output: where and when, or that it is off. */
export function backupSummary(p: BackupPlan | undefined): string {
  if (!p) return 'off: space:backup is not set, so nothing backs up Redis (docs/operations.md "Backups")';
  const keep = [p.keepLast ? `the last ${p.keepLast}` : '', p.keepDays ? `${p.keepDays} days` : '']
    .filter(Boolean)
    .join(' and ');
  return `"${p.schedule}" (UTC) to s3://${p.bucket}/${p.prefix}${p.deployment}/${p.endpoint ? ` at ${p.endpoint}` : ''}, keeping ${keep || 'every backup'}`;
}
