/**
 * Settings of `space backup` (env names, defaults with units, docs): which Redis to snapshot, the
 * S3-compatible store the snapshots go to, and how many to keep. The deployments set them on the
 * scheduled job (providers/systemd/backup.ts, providers/kubernetes/backup.ts); an operator sets
 * the same variables to list, restore or prune by hand (docs/operations.md "Backups").
 */
import { type ConfigOf, loadConfig, setting } from '../core/config.ts';
import { CliError } from './output.ts';

export const backupSettings = {
  redisUrl: setting.redisUrl(
    'The Redis to back up or restore into; with redis-sentinel:// the sentinels are asked which server is the primary.',
  ),
  bucket: setting.optionalString(
    'SPACE_BACKUP_S3_BUCKET',
    'Bucket the snapshots go to. Empty: backups are not configured (every `space backup` command refuses with BACKUP_NOT_CONFIGURED).',
  ),
  endpoint: setting.optionalString(
    'SPACE_BACKUP_S3_ENDPOINT',
    'URL of an S3-compatible store (e.g. https://us-east-1.linodeobjects.com, http://127.0.0.1:9000). Empty: AWS S3 in SPACE_BACKUP_S3_REGION.',
  ),
  region: setting.string('SPACE_BACKUP_S3_REGION', 'Region the store signs requests for.', 'us-east-1'),
  prefix: setting.string(
    'SPACE_BACKUP_S3_PREFIX',
    'Key prefix in the bucket; objects are `<prefix><deployment>/redis-<UTC time>.rdb`.',
    'space-backups/',
  ),
  deployment: setting.string(
    'SPACE_BACKUP_DEPLOYMENT',
    'Name of this deployment in the bucket (letters, digits, `.`, `_`, `-`): `list`, `restore` and `prune` see only its objects, so several deployments can share a bucket.',
    'space',
  ),
  pathStyle: setting.oneOf(
    'SPACE_BACKUP_S3_ADDRESSING',
    'How the bucket is addressed: `path` (https://endpoint/bucket/key, what most non-AWS stores want), `virtual` (https://bucket.endpoint/key), `auto` (path with SPACE_BACKUP_S3_ENDPOINT, virtual for AWS).',
    ['auto', 'path', 'virtual'] as const,
    'auto',
  ),
  accessKeyId: setting.optionalString(
    'SPACE_BACKUP_S3_ACCESS_KEY_ID',
    'Access key of the store. Empty: the AWS SDK’s own chain (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, a profile, an instance role).',
  ),
  secretAccessKey: setting.optionalString(
    'SPACE_BACKUP_S3_SECRET_ACCESS_KEY',
    'Secret of SPACE_BACKUP_S3_ACCESS_KEY_ID (set both or neither).',
  ),
  keepLast: setting.int(
    'SPACE_BACKUP_KEEP_LAST',
    'Retention: keep the newest this many backups of this deployment (0: no count rule).',
    14,
  ),
  keepDays: setting.int(
    'SPACE_BACKUP_KEEP_DAYS',
    'Retention: keep every backup younger than this many days (0: no age rule). A backup is kept when any rule keeps it; the newest is always kept.',
    0,
  ),
};

/** `space backup`'s settings, validated. */
export type BackupConfig = ConfigOf<typeof backupSettings>;

/** What a deployment name may be: it becomes one segment of an object key. */
export const DEPLOYMENT_NAME = /^[A-Za-z0-9._-]{1,64}$/;

/**
 * Reads the backup settings from `env`. @throws CliError `BACKUP_NOT_CONFIGURED` when no bucket is
 * set, `USAGE` for a malformed value (the ConfigError's problems in its message).
 */
export function loadBackupConfig(env: NodeJS.ProcessEnv = process.env): BackupConfig {
  let config: BackupConfig;
  try {
    config = loadConfig('backup', backupSettings, env);
  } catch (err) {
    throw new CliError('USAGE', (err as Error).message);
  }
  if (!config.bucket)
    throw new CliError('BACKUP_NOT_CONFIGURED', 'no backup store: SPACE_BACKUP_S3_BUCKET is not set', {
      hint: 'set SPACE_BACKUP_S3_BUCKET (and SPACE_BACKUP_S3_ENDPOINT for a non-AWS store); see docs/operations.md "Backups"',
    });
  const problems: string[] = [];
  if (!DEPLOYMENT_NAME.test(config.deployment))
    problems.push(`SPACE_BACKUP_DEPLOYMENT: 1-64 of A-Z a-z 0-9 . _ - (got "${config.deployment}")`);
  if (Boolean(config.accessKeyId) !== Boolean(config.secretAccessKey))
    problems.push('SPACE_BACKUP_S3_ACCESS_KEY_ID and SPACE_BACKUP_S3_SECRET_ACCESS_KEY: set both or neither');
  if (config.endpoint && !/^https?:\/\/[^/\s]+\/?$/.test(config.endpoint))
    problems.push(`SPACE_BACKUP_S3_ENDPOINT: must be http(s)://host[:port] (got "${config.endpoint}")`);
  if (problems.length)
    throw new CliError('USAGE', `invalid backup configuration:\n  ${problems.join('\n  ')}`);
  return config;
}
