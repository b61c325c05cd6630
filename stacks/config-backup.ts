/**
 * `space:backup` and `space:backupSecretAccessKey` of the stack configuration (config-keys.ts):
 * parsed and checked into the providers' {@link BackupPlan}, every bad field one problem.
 */
import * as pulumi from '@pulumi/pulumi';
import { type BackupPlan, DEFAULT_BACKUP_SCHEDULE, parseCron } from '../providers/backup-schedule.ts';

/** The Pulumi stack's name, or `space` outside a Pulumi program (unit tests of the parser). */
function stackName(): string {
  try {
    return pulumi.getStack() || 'space';
  } catch {
    return 'space';
  }
}

/**
 * `space:backup` (`value`, parsed JSON) as a {@link BackupPlan}; undefined when unset. Adds a
 * problem per bad field to `problems`. `hasSecret`: `space:backupSecretAccessKey` is set.
 */
export function parseBackup(value: unknown, hasSecret: boolean, problems: string[]): BackupPlan | undefined {
  if (value === undefined) {
    if (hasSecret) problems.push('space:backupSecretAccessKey: only with space:backup');
    return undefined;
  }
  if (typeof value !== 'object' || value === null || Array.isArray(value)) {
    problems.push('space:backup: must be an object ({ "bucket": "…", … })');
    return undefined;
  }
  const v = value as Record<string, unknown>;
  const known = [
    'bucket',
    'endpoint',
    'region',
    'prefix',
    'schedule',
    'keepLast',
    'keepDays',
    'accessKeyId',
    'deployment',
  ];
  for (const k of Object.keys(v))
    if (!known.includes(k)) problems.push(`space:backup.${k}: unknown field (fields: ${known.join(', ')})`);
  const text = (k: string, def?: string): string | undefined => {
    const x = v[k];
    if (x === undefined) return def;
    if (typeof x !== 'string' || x === '') {
      problems.push(`space:backup.${k}: must be a non-empty string`);
      return def;
    }
    return x;
  };
  const count = (k: string, def: number): number => {
    const x = v[k] ?? def;
    if (typeof x !== 'number' || !Number.isInteger(x) || x < 0 || x > 100_000) {
      problems.push(`space:backup.${k}: must be a whole number ≥ 0`);
      return def;
    }
    return x;
  };
  const bucket = text('bucket');
  // S3 bucket names: 3-63 of a-z 0-9 . - (docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules.html)
  if (bucket === undefined) problems.push('space:backup.bucket: required (the bucket the backups go to)');
  else if (!/^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$/.test(bucket))
    problems.push(`space:backup.bucket: not an S3 bucket name ("${bucket}")`);
  const endpoint = text('endpoint');
  if (endpoint !== undefined && !/^https?:\/\/[^/\s]+\/?$/.test(endpoint))
    problems.push(`space:backup.endpoint: must be http(s)://host[:port] ("${endpoint}")`);
  const schedule = text('schedule', DEFAULT_BACKUP_SCHEDULE)!;
  try {
    parseCron(schedule);
  } catch (err) {
    problems.push(`space:backup.schedule: ${(err as Error).message}`);
  }
  const deployment = text('deployment', stackName())!;
  if (!/^[A-Za-z0-9._-]{1,64}$/.test(deployment))
    problems.push(`space:backup.deployment: 1-64 of A-Z a-z 0-9 . _ - ("${deployment}")`);
  const prefix = text('prefix', 'space-backups/')!;
  const accessKeyId = text('accessKeyId');
  if ((accessKeyId !== undefined) !== hasSecret)
    problems.push('space:backup.accessKeyId and space:backupSecretAccessKey: set both or neither');
  return {
    schedule,
    bucket: bucket ?? '',
    ...(endpoint ? { endpoint } : {}),
    region: text('region', 'us-east-1')!,
    prefix,
    deployment,
    keepLast: count('keepLast', 14),
    keepDays: count('keepDays', 0),
    ...(accessKeyId ? { accessKeyId } : {}),
  };
}
