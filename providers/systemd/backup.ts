/**
 * The scheduled backup on the control VM (`space:backup`): `space-backup.timer` starts
 * `space-backup.service`, a oneshot that runs `space backup run` in the SPACE image on the host
 * network, beside Redis, with the Redis URL of {@link REDIS_ENV_FILE} and the store's settings in
 * {@link BACKUP_ENV_FILE} (root-only: it holds the store's secret key). The timer is `Persistent`,
 * so a run missed while the VM was off happens at the next boot; a failed run is retried twice,
 * two minutes apart. Pure.
 */
import { BACKUP_COMMAND, type BackupPlan, backupJobEnv, onCalendar } from '../backup-schedule.ts';
import { envFile, REDIS_ENV_FILE, type VmFile } from './plan.ts';
import { REDIS_UNIT } from './redis.ts';

/** The job's settings on the control VM (mode 0600). */
export const BACKUP_ENV_FILE = '/etc/space/space-backup.env';
/** The timer that runs the backup. */
export const BACKUP_TIMER = 'space-backup.timer';

/** A backup plan with its secret, as the control VM's user data carries it. */
export interface VmBackupArgs extends BackupPlan {
  /** `space:backupSecretAccessKey`, when set. */
  readonly secretAccessKey?: string;
}

/** The env file, the oneshot service and the timer of the control VM's backups. */
export function backupFiles(b: VmBackupArgs): VmFile[] {
  return [
    {
      path: BACKUP_ENV_FILE,
      mode: '0600',
      content: envFile({
        ...backupJobEnv(b),
        ...(b.secretAccessKey ? { SPACE_BACKUP_S3_SECRET_ACCESS_KEY: b.secretAccessKey } : {}),
      }),
    },
    {
      path: '/etc/systemd/system/space-backup.service',
      mode: '0644',
      content: [
        '[Unit]',
        'Description=SPACE: a snapshot of Redis shipped to the backup store (space backup run)',
        'Wants=network-online.target',
        `After=network-online.target ${REDIS_UNIT}`,
        // a failed run (a failover under way, the store away) is tried twice more, as the
        // Kubernetes Job's backoffLimit does
        'StartLimitIntervalSec=1h',
        'StartLimitBurst=3',
        '',
        '[Service]',
        'Type=oneshot',
        'EnvironmentFile=/etc/space/image.env',
        `ExecStart=/usr/bin/podman run --rm --name space-backup --network host --env-file ${BACKUP_ENV_FILE} --env-file ${REDIS_ENV_FILE} \${SPACE_IMAGE} ${BACKUP_COMMAND.join(' ')}`,
        // a stuck upload must not hold the next run off forever
        'TimeoutStartSec=2h',
        'Restart=on-failure',
        'RestartSec=2min',
        '',
      ].join('\n'),
    },
    {
      path: `/etc/systemd/system/${BACKUP_TIMER}`,
      mode: '0644',
      content: [
        '[Unit]',
        'Description=SPACE: scheduled Redis backups (space:backup)',
        '',
        '[Timer]',
        `OnCalendar=${onCalendar(b.schedule)}`,
        'Persistent=true',
        'RandomizedDelaySec=120',
        '',
        '[Install]',
        'WantedBy=timers.target',
        '',
      ].join('\n'),
    },
  ];
}
