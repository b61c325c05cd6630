/**
 * `space:backup` under the mock runtime: each stack renders the schedule it configures (VM mode:
 * the control VM's env file, service and timer; Kubernetes: the CronJob, its Secret and service
 * account), the store's secret key only inside secrets, nothing when it is unset (and the `backup`
 * output says so), and bad values are refused at preview. The timer's calendar is checked by
 * systemd's own parser (`systemd-analyze calendar`).
 */
import { spawnSync } from 'node:child_process';
import { describe, expect, it } from 'vitest';
import { backupSummary, onCalendar, parseCron } from '../providers/backup-schedule.ts';
import { isWireSecret, plaintextOccurrences, unwrapSecrets } from '../providers/testing/mocks.ts';
import { run } from './program.ts';
import { fails, type Raw, render, VARIANTS, vmScripts, withSecrets } from './test-stacks.ts';

const SECRET = 'backup-secret-key-6b2e90d1f4';
const BACKUP = {
  bucket: 'space-backups',
  endpoint: 'https://us-ord-1.linodeobjects.com',
  region: 'us-ord',
  schedule: '30 */6 * * *',
  keepLast: 10,
  keepDays: 7,
  accessKeyId: 'AKIDEXAMPLE',
  deployment: 'prod',
};
const withBackup = (name: string, extra: Record<string, unknown> = {}): Raw =>
  withSecrets({
    ...VARIANTS[name]!,
    backup: JSON.stringify({ ...BACKUP, ...extra }),
    backupSecretAccessKey: SECRET,
  });
type Obj = Record<string, unknown>;

describe.each(['akamai', 'crusoe'])('scheduled backups of vm stack %s', (name) => {
  it('the control VM gets the timer, the service and a root-only env file; the secret key only inside the secret user data', async () => {
    const recorded = await render(withBackup(name));
    const scripts = vmScripts(recorded);
    const control = scripts['space-control']!;
    expect(control).toContain('OnCalendar=*-*-* 00/6:30:00 UTC');
    expect(control).toContain('Persistent=true');
    expect(control).toMatch(
      /ExecStart=\/usr\/bin\/podman run --rm --name space-backup --network host --env-file \/etc\/space\/space-backup\.env --env-file \/etc\/space\/redis\.env \$\{SPACE_IMAGE\} node runtime\/cli\/space\.ts backup run/,
    );
    for (const line of [
      'SPACE_BACKUP_S3_BUCKET=space-backups',
      'SPACE_BACKUP_S3_ENDPOINT=https://us-ord-1.linodeobjects.com',
      'SPACE_BACKUP_DEPLOYMENT=prod',
      'SPACE_BACKUP_KEEP_LAST=10',
      'SPACE_BACKUP_KEEP_DAYS=7',
      'SPACE_BACKUP_S3_ACCESS_KEY_ID=AKIDEXAMPLE',
      `SPACE_BACKUP_S3_SECRET_ACCESS_KEY=${SECRET}`,
    ])
      expect(control).toContain(line);
    expect(control).toContain('systemctl enable --now space-backup.timer');
    // the env file is root-only (cloud-init's permissions, or the script's chmod before the content)
    expect(control).toMatch(
      /(path: \/etc\/space\/space-backup\.env\n\s+permissions: "0600"|chmod 0600 \/etc\/space\/space-backup\.env)/,
    );
    // agents get no backup pieces, and the secret is nowhere but in secret inputs
    for (const [vm, s] of Object.entries(scripts))
      if (vm !== 'space-control') expect(s).not.toContain('space-backup');
    const leaks = recorded.flatMap((r) =>
      plaintextOccurrences(r.inputs, SECRET).map((p) => `${r.name}: ${p}`),
    );
    expect(leaks).toEqual([]);
  }, 60_000);

  it('several control VMs: only the first runs the timer (one backup per schedule)', async () => {
    const scripts = vmScripts(
      await render({ ...withBackup(name), controlPlane: JSON.stringify({ replicas: 3 }) }),
    );
    const withTimer = Object.entries(scripts)
      .filter(([, s]) => s.includes('space-backup.timer'))
      .map(([vm]) => vm);
    expect(withTimer).toEqual(['space-control']);
    expect(Object.keys(scripts)).toEqual(expect.arrayContaining(['space-control-1', 'space-control-2']));
  }, 60_000);

  it('unset: no backup unit on any VM', async () => {
    const recorded = await render(withSecrets(VARIANTS[name]!));
    for (const s of Object.values(vmScripts(recorded))) expect(s).not.toContain('space-backup');
  }, 60_000);
});

describe.each(['kind', 'coreweave', 'akamai-lke'])('scheduled backups of kubernetes stack %s', (name) => {
  const kindOf = (r: { type: string }) => r.type.split(':').at(-1);
  it('renders the CronJob with the schedule, the Redis URL and the secret key from Secrets', async () => {
    const recorded = await render(withBackup(name));
    const jobs = recorded.filter((r) => kindOf(r) === 'CronJob');
    expect(jobs).toHaveLength(1);
    const job = unwrapSecrets(jobs[0]!.inputs) as Obj;
    const spec = job['spec'] as Obj;
    expect(spec).toMatchObject({
      schedule: '30 */6 * * *',
      timeZone: 'Etc/UTC',
      concurrencyPolicy: 'Forbid',
    });
    const pod = (((spec['jobTemplate'] as Obj)['spec'] as Obj)['template'] as Obj)['spec'] as Obj as {
      containers: { command: string[]; env: { name: string; value?: string; valueFrom?: unknown }[] }[];
      restartPolicy: string;
    };
    expect(pod.restartPolicy).toBe('Never');
    const c = pod.containers[0]!;
    expect(c.command).toEqual(['node', 'runtime/cli/space.ts', 'backup', 'run']);
    const env = Object.fromEntries(c.env.map((e) => [e.name, e.value ?? e.valueFrom]));
    expect(env).toMatchObject({
      SPACE_REDIS_URL: { secretKeyRef: { name: 'space-redis', key: 'url' } },
      SPACE_BACKUP_S3_BUCKET: 'space-backups',
      SPACE_BACKUP_S3_ENDPOINT: 'https://us-ord-1.linodeobjects.com',
      SPACE_BACKUP_S3_REGION: 'us-ord',
      SPACE_BACKUP_DEPLOYMENT: 'prod',
      SPACE_BACKUP_KEEP_LAST: '10',
      SPACE_BACKUP_S3_ACCESS_KEY_ID: 'AKIDEXAMPLE',
      SPACE_BACKUP_S3_SECRET_ACCESS_KEY: { secretKeyRef: { name: 'space-backup', key: 'secretAccessKey' } },
    });
    const secret = recorded.find((r) => kindOf(r) === 'Secret' && r.name.endsWith('backup-secret'))!;
    const data = secret.inputs['stringData'] as Obj;
    expect(isWireSecret(data) || isWireSecret(data['secretAccessKey'])).toBe(true);
    const leaks = recorded.flatMap((r) =>
      plaintextOccurrences(r.inputs, SECRET).map((p) => `${r.name}: ${p}`),
    );
    expect(leaks).toEqual([]);
  }, 60_000);

  it('unset: no CronJob', async () => {
    const recorded = await render(withSecrets(VARIANTS[name]!));
    expect(recorded.filter((r) => kindOf(r) === 'CronJob' || r.name.includes('backup'))).toEqual([]);
  }, 60_000);
});

describe('space:backup at preview', () => {
  it('the backup output says where and when, or that nothing backs Redis up', () => {
    const raw = withBackup('kind');
    expect(run((k) => raw[k], Object.keys(raw))['backup']).toBe(
      '"30 */6 * * *" (UTC) to s3://space-backups/space-backups/prod/ at https://us-ord-1.linodeobjects.com, keeping the last 10 and 7 days',
    );
    const off = withSecrets(VARIANTS['kind']!);
    expect(run((k) => off[k], Object.keys(off))['backup']).toMatch(/^off: space:backup is not set/);
    expect(backupSummary(undefined)).toMatch(/^off/);
  });

  it('bad values are refused, each naming its field', () => {
    const bad = (b: unknown, secret = true) =>
      fails({
        ...VARIANTS['kind']!,
        ...withSecrets(VARIANTS['kind']!),
        backup: JSON.stringify(b),
        ...(secret ? { backupSecretAccessKey: SECRET } : {}),
      });
    expect(bad({ ...BACKUP, bucket: undefined })).toEqual([
      'space:backup.bucket: required (the bucket the backups go to)',
    ]);
    expect(bad({ ...BACKUP, bucket: 'Not_A_Bucket' })).toEqual([
      expect.stringMatching(/^space:backup.bucket: not an S3 bucket name/),
    ]);
    expect(bad({ ...BACKUP, schedule: '0 3 1 * *' })).toEqual([
      expect.stringMatching(/^space:backup.schedule: day of month and month must be \*/),
    ]);
    expect(bad({ ...BACKUP, schedule: 'daily' })).toEqual([
      expect.stringMatching(/^space:backup.schedule: "daily" has 1 fields/),
    ]);
    expect(bad({ ...BACKUP, keepLast: -1 })).toEqual(['space:backup.keepLast: must be a whole number ≥ 0']);
    expect(bad({ ...BACKUP, endpoint: 'linodeobjects.com' })).toEqual([
      expect.stringMatching(/^space:backup.endpoint: must be http/),
    ]);
    expect(bad({ ...BACKUP, buckt: 'x' })).toEqual([
      expect.stringMatching(/^space:backup.buckt: unknown field/),
    ]);
    expect(bad(BACKUP, false)).toEqual([
      'space:backup.accessKeyId and space:backupSecretAccessKey: set both or neither',
    ]);
    expect(fails({ ...withSecrets(VARIANTS['kind']!), backupSecretAccessKey: SECRET })).toEqual([
      'space:backupSecretAccessKey: only with space:backup',
    ]);
  });
});

describe('the schedule: one cron subset, the same times under systemd', () => {
  const cases: [string, string][] = [
    ['17 3 * * *', '*-*-* 03:17:00 UTC'],
    ['30 */6 * * *', '*-*-* 00/6:30:00 UTC'],
    ['0,30 1,13 * * *', '*-*-* 01,13:00,30:00 UTC'],
    ['5 4 * * 0', 'Sun *-*-* 04:05:00 UTC'],
    ['5 4 * * 1,4,7', 'Mon,Thu,Sun *-*-* 04:05:00 UTC'],
    ['*/15 * * * *', '*-*-* *:00/15:00 UTC'],
  ];
  it.each(cases)('%s → OnCalendar=%s, which systemd-analyze accepts as the same event', (cron, calendar) => {
    expect(onCalendar(cron)).toBe(calendar);
    const r = spawnSync('systemd-analyze', ['calendar', calendar], { encoding: 'utf8' });
    expect(r.status, r.stderr).toBe(0);
    expect(r.stdout).toContain(`Normalized form: ${calendar}`);
  });

  it('refuses what cron and systemd would read differently, or what is out of range', () => {
    for (const [cron, why] of [
      ['0 3 1 * *', /day of month/],
      ['0 3 * 1 *', /day of month/],
      ['60 3 * * *', /minute: 60 is out of range/],
      ['0 24 * * *', /hour: 24 is out of range/],
      ['0 3 * * */2', /day of week/],
      ['0 3-5 * * *', /hour: "3-5"/],
      ['0 3 * *', /4 fields/],
    ] as const)
      expect(() => parseCron(cron), cron).toThrow(why);
  });
});
