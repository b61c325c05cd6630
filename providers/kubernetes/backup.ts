/**
 * Scheduled backups on Kubernetes (`space:backup`): the CronJob `space-backup` runs
 * `space backup run` in the SPACE image on the schedule (UTC, `timeZone: Etc/UTC`), with the Redis
 * URL of the `space-redis` Secret (a `redis-sentinel://` URL makes it ask the sentinels for the
 * primary) and the store's secret key from the `space-backup` Secret. One job at a time
 * (`concurrencyPolicy: Forbid`); a job that could not start near its time is skipped rather than
 * run late in a burst (`startingDeadlineSeconds`). Without a backup plan, nothing is rendered.
 */
import type * as k8s from '@pulumi/kubernetes';
import type * as pulumi from '@pulumi/pulumi';
import { BACKUP_COMMAND, type BackupPlan, backupJobEnv } from '../backup-schedule.ts';
import { labels, type ObjectList, pullSecretsOf, type RenderContext } from './args.ts';

/** {@link BackupPlan} with the secret key as Kubernetes mode gets it (a Pulumi secret). */
export interface K8sBackupArgs extends BackupPlan {
  /** `space:backupSecretAccessKey`, when set. */
  readonly secretAccessKey?: pulumi.Input<string>;
}

/** Adds the backup's service account, Secret (with a secret key) and CronJob, when configured. */
export function addBackup(list: ObjectList, ctx: RenderContext): void {
  const b = ctx.a.backup;
  if (!b) return;
  const { ns } = ctx;
  const add = list.add.bind(list);
  const sel = labels('backup');
  const sa: k8s.types.input.core.v1.ServiceAccount = {
    apiVersion: 'v1',
    kind: 'ServiceAccount',
    metadata: { name: 'space-backup', namespace: ns, labels: sel },
    automountServiceAccountToken: false,
  };
  add('backup-sa', sa);
  if (b.secretAccessKey !== undefined) {
    const secret: k8s.types.input.core.v1.Secret = {
      apiVersion: 'v1',
      kind: 'Secret',
      metadata: { name: 'space-backup', namespace: ns, labels: sel },
      type: 'Opaque',
      stringData: { secretAccessKey: b.secretAccessKey },
    };
    add('backup-secret', secret);
  }
  const env: k8s.types.input.core.v1.EnvVar[] = [
    { name: 'SPACE_REDIS_URL', valueFrom: { secretKeyRef: { name: 'space-redis', key: 'url' } } },
    ...Object.entries(backupJobEnv(b)).map(([name, value]) => ({ name, value })),
    ...(b.secretAccessKey !== undefined
      ? [
          {
            name: 'SPACE_BACKUP_S3_SECRET_ACCESS_KEY',
            valueFrom: { secretKeyRef: { name: 'space-backup', key: 'secretAccessKey' } },
          },
        ]
      : []),
  ];
  const job: k8s.types.input.batch.v1.CronJob = {
    apiVersion: 'batch/v1',
    kind: 'CronJob',
    metadata: { name: 'space-backup', namespace: ns, labels: sel },
    spec: {
      schedule: b.schedule,
      timeZone: 'Etc/UTC',
      concurrencyPolicy: 'Forbid',
      startingDeadlineSeconds: 3600,
      successfulJobsHistoryLimit: 3,
      failedJobsHistoryLimit: 3,
      jobTemplate: {
        metadata: { labels: sel },
        spec: {
          backoffLimit: 2,
          activeDeadlineSeconds: 7200,
          template: {
            metadata: { labels: { ...sel, ...ctx.version } },
            spec: {
              serviceAccountName: 'space-backup',
              automountServiceAccountToken: false,
              restartPolicy: 'Never',
              ...pullSecretsOf(ctx.a.imagePull),
              securityContext: { runAsNonRoot: true, runAsUser: 1000, runAsGroup: 1000, fsGroup: 1000 },
              containers: [
                {
                  name: 'backup',
                  image: ctx.image,
                  command: [...BACKUP_COMMAND],
                  env,
                  // the snapshot is written to /tmp before the upload
                  volumeMounts: [{ name: 'work', mountPath: '/tmp' }],
                  resources: { requests: { cpu: '100m', memory: '256Mi' }, limits: { memory: '1Gi' } },
                  securityContext: {
                    allowPrivilegeEscalation: false,
                    readOnlyRootFilesystem: true,
                    capabilities: { drop: ['ALL'] },
                  },
                },
              ],
              volumes: [{ name: 'work', emptyDir: {} }],
            },
          },
        },
      },
    },
  };
  add('backup', job);
}
